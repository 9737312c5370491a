# LAB STAND-IN: not the real dcgm-exporter. Test infrastructure for gpuk8s; never shipped to users.
"""NVIDIA's dcgm-exporter (4.x), EMULATED by the kubelet stand-in for the dcgm-exporter pod (the
lab has neither the image nor DCGM): the node's kubelet serves what the exporter would serve,
from the node's GPU view (gpuview.py), on the address the pod asks for (DCGM_EXPORTER_LISTEN /
--address, default ":9400"): with hostNetwork on the node's addresses; in the pod network (as
gpuk8s runs it) on the pod's IP only (an emulated pod has no network namespace: the kubelet
puts its IP on the node's loopback while it serves, as the cluster DNS address is put there;
other nodes and pods reach it through flanneld's routes to the node's pod CIDR).

What is upstream's (NVIDIA/dcgm-exporter 4.5.3-4.8.2, the newest 4.x release):
- metric names, HELP texts and types of etc/default-counters.csv, one HELP/TYPE block per
  counter in DCGM field-id order (the Go template ranges over a map keyed by the counter);
- the GPU label set and order of internal/pkg/rendermetrics/render_metrics.go:
  gpu, UUID, pci_bus_id, device="nvidia<gpu>", modelName[, Hostname], then the label counters
  (DCGM_FI_DRIVER_VERSION) and, for a GPU the kubelet gave to a pod (Kubernetes mode, the
  pod-resources socket mounted), container, namespace, pod (sorted keys); a GPU no pod holds
  has no pod labels at all; with time-slicing the last pod listed wins, as toDeviceToPod;
- values: "%d" for integer fields, "%f" for doubles (power); a blank value (nvidia-smi's
  [N/A], [Not Supported]) skips the series, as DCGM's blank values do;
- /metrics (text/plain; charset=utf-8), /health ("OK"), / (the "GPU Exporter" page);
- no driver, a driver/library mismatch or no NVIDIA runtime: the real exporter exits at
  start-up (DCGM/NVML cannot initialise) and is restarted with back-off; here nothing listens
  (scrapes: connection refused) and the pod log gets the real log lines, retried 10 s, 20 s,
  ... 5 min apart. A failing collection once serving: 500 "internal server error".
What is the lab's: values come from `nvidia-smi --query-gpu` (fields the stand-in does not
know are left out, with their metrics); DCP (DCGM_FI_PROF_*), XID, NVLink, PCIe replay,
energy, row-remap and vGPU counters have no nvidia-smi source and are not served; MIG
instances are not split out. The pod keeps the status the kubelet stand-in gives emulated pods.
"""

from __future__ import annotations

import datetime as dt
import http.server
import os
import re
import threading
import time
from collections.abc import Sequence
from typing import Any

from . import gpuview, nodeinfo
from .common import P, run
from .dcgm_metrics import (
    IDENTITY,
    INVALID_FIELD,
    PAGE,
    QUERY,
    PodInfo,
    Settings,
    metrics_text,
    pod_info,
    settings_for,
    split_listen,
)

Obj = dict[str, Any]
BACKOFF_MAX = 300.0

# ---------------------------------------------------------------- the emulated process
NVML_ERRORS = {  # nvidia-smi's exit code -> what nvml.ErrorString says at nvmlInit
    9: "Driver Not Loaded", 18: "RM has detected an NVML/RM version mismatch.",
    127: "ERROR_LIBRARY_NOT_FOUND"}


def _quote(v: str) -> str:
    """Go slog's text handler: a value with spaces, quotes or '=' is quoted."""
    if v and not re.search(r'[\s"=\\]', v):
        return v
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def slog_line(level: str, msg: str, **attrs: str) -> str:
    now = dt.datetime.now(dt.UTC)
    stamp = f"{now:%Y-%m-%dT%H:%M:%S}.{now.microsecond // 1000:03d}Z"
    extra = "".join(f" {k}={_quote(v)}" for k, v in attrs.items())
    return f"time={stamp} level={level} msg={_quote(msg)}{extra}\n"


class Exporter:
    """One kubelet's emulated exporter: a daemon thread that starts it as the real one starts
    (DCGM and NVML must initialise: an NVIDIA runtime and a loaded, matching driver), serves
    while the pod lives (kubelet.started holds its uid) and stops when it is gone."""

    def __init__(self, kubelet: Any, smi: Sequence[str] = ("nvidia-smi",)) -> None:
        self.kubelet = kubelet
        self.smi = list(smi)
        self.lock = threading.Lock()
        self.pod: Obj | None = None
        self.settings = Settings()
        self.fields = list(QUERY)  # fields this node's nvidia-smi answers
        self.pods: dict[str, PodInfo] = {}
        self.thread: threading.Thread | None = None
        self.address: tuple[str, int] | None = None  # where it listens now
        self.log_waited = ""

    def adopt(self, pod: Obj) -> None:
        """The kubelet started the exporter's pod (a new one replaces the old)."""
        with self.lock:
            self.pod = pod
            self.settings = settings_for(pod, str(self.kubelet.node_name))
            if self.thread is None:
                self.thread = threading.Thread(target=self.run, daemon=True,
                                               name="dcgm-exporter")
                self.thread.start()

    def live(self) -> bool:
        pod = self.pod
        return pod is not None and pod["metadata"].get("uid") in self.kubelet.started

    def run(self) -> None:
        delay = 10.0
        while True:
            with self.lock:
                if not self.live():
                    self.thread = None
                    return
            if self.start() is None:
                delay = 10.0
                continue
            deadline = time.monotonic() + delay  # CrashLoopBackOff
            while self.live() and time.monotonic() < deadline:
                time.sleep(0.2)
            delay = min(delay * 2, BACKOFF_MAX)

    # ------------------------------------------------------------ start-up
    def init_error(self) -> str | None:
        """Why DCGM/NVML could not initialise in the pod, in NVML's words; None: they can."""
        pod = self.pod or {"spec": {}}
        try:
            handler = self.kubelet.pod_runtime(pod, nodeinfo.containerd_config())
        except Exception:  # an API error: the runtime class cannot be read
            handler = None
        if handler != "nvidia":  # runc: no libnvidia-ml in the container
            return NVML_ERRORS[127]
        code, _out, _fields = self.query()
        if code in (0, 6):
            return None
        return NVML_ERRORS.get(code, "Unknown Error")

    def start(self) -> str | None:
        """One run of the exporter: None when it served until its pod went (or moved to
        another address), else the error it exited with."""
        s = self.settings
        self.log("INFO", "Starting dcgm-exporter", Version=s.version)
        self.log("INFO", "Attempting to initialize DCGM.")
        self.log("INFO", "Initialized DCGM Fields module.")
        err = self.init_error()
        if s.kubernetes:
            self.log("INFO", "Attempting to initialize NVML library.")
        if err is not None:
            if s.kubernetes:
                self.log("ERROR", f"Cannot init NVML library; err: {err}")
            self.log("ERROR", err)
            return err
        self.log("INFO", "NVML provider successfully initialized for Kubernetes MIG support"
                 if s.kubernetes else "NVML provider skipped (not running in Kubernetes mode)")
        self.log("INFO", "DCGM successfully initialized!")
        self.log("INFO", "Not collecting DCP metrics: This request is serviced by a module of "
                 "DCGM that is not currently loaded")
        if s.kubernetes:
            self.log("INFO", "Kubernetes metrics collection enabled!")
        return self.serve()

    def want_ip(self) -> str | None:
        """A pod-network exporter's address: its pod's IP, the one the kubelet reports. None
        for a hostNetwork pod."""
        pod = self.pod or {"spec": {}, "metadata": {}}
        if pod["spec"].get("hostNetwork"):
            return None
        return str(self.kubelet._pod_ip(pod["metadata"].get("uid", "")))

    def pod_ip(self) -> str | None:
        """want_ip, put on the node's loopback while the exporter serves."""
        ip = self.want_ip()  # host unit tests (GPUK8S_LAB_ROOT): no ip(8)
        if ip is not None and not os.environ.get("GPUK8S_LAB_ROOT"):
            run(["ip", "addr", "replace", f"{ip}/32", "dev", "lo"])
        return ip

    def serve(self) -> str | None:
        s = self.settings
        self.log("INFO", "HTTP server started - ready to serve metrics")
        self.log("INFO", "Starting webserver")
        host, port = split_listen(s.listen)
        own_ip = self.pod_ip()
        if own_ip is not None and host in ("", "0.0.0.0", "::"):
            host = own_ip   # every address of the pod's namespace: its pod IP
        try:
            srv = http.server.ThreadingHTTPServer((host, port), _handler(self))
        except (OSError, ValueError) as e:
            code = e.errno if isinstance(e, OSError) else None
            why = os.strerror(code).lower() if code else str(e)
            err = f"listen tcp {s.listen}: bind: {why}"
            self.log("ERROR", "Failed to Listen and Server HTTP server.", error=err)
            self._drop_ip(own_ip)
            return err
        srv.daemon_threads = True
        self.address = (str(srv.server_address[0]), int(srv.server_address[1]))
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        try:
            while self.live() and self.settings.listen == s.listen and \
                    self.want_ip() == own_ip:
                time.sleep(0.2)
        finally:
            srv.shutdown()
            srv.server_close()
            self.address = None
            self._drop_ip(own_ip)
        return None

    @staticmethod
    def _drop_ip(ip: str | None) -> None:
        if ip is not None and not os.environ.get("GPUK8S_LAB_ROOT"):
            run(["ip", "addr", "del", f"{ip}/32", "dev", "lo"])

    # ------------------------------------------------------------ collection
    def query(self) -> tuple[int, str, list[str]]:
        """nvidia-smi's CSV of the fields it knows (a field it refuses is dropped for good),
        from the node's GPU view."""
        while True:
            fields = list(self.fields)
            p = gpuview.View(self.smi).query(fields)
            bad = INVALID_FIELD.search(p.stdout + p.stderr)
            if p.returncode != 0 and bad and bad.group(1) in fields and \
                    bad.group(1) not in IDENTITY:
                with self.lock:
                    if bad.group(1) in self.fields:
                        self.fields.remove(bad.group(1))
                continue
            return p.returncode, p.stdout, fields

    def pod_infos(self, uids: Sequence[str]) -> dict[str, PodInfo]:
        """The pods holding GPUs (the real exporter asks the kubelet's pod-resources API)."""
        if any(u not in self.pods for u in uids):
            from .client import ApiError, TLSError, Unreachable

            try:
                items = self.kubelet.client.get(
                    f"/api/v1/pods?fieldSelector=spec.nodeName={self.kubelet.node_name}"
                )["items"]
                for p in items:
                    if p["metadata"].get("uid") in uids:
                        self.pods[p["metadata"]["uid"]] = pod_info(p)
            except (ApiError, Unreachable, TLSError, OSError, KeyError, TypeError):
                pass  # "Failed to get pod mappings": the metrics go out without pod labels
        return {u: self.pods[u] for u in uids if u in self.pods}

    def collect(self) -> tuple[int, str]:
        code, out, fields = self.query()
        if code not in (0, 6):  # the driver went away under a running exporter
            return 500, "internal server error\n"
        try:
            assign = {uid: list(devs) for uid, devs in list(self.kubelet.gpu_assign.items())}
        except RuntimeError:  # changed while copied: this scrape goes without pod labels
            assign = {}
        s = self.settings
        pods = self.pod_infos(list(assign)) if s.kubernetes and s.pod_resources else {}
        return 200, metrics_text(out if code == 0 else "", fields, s, assign, pods)

    def log(self, level: str, msg: str, **attrs: str) -> None:
        """A line in the pod's log (the kubelet creates the file right after starting it)."""
        pod = self.pod
        if pod is None:
            return
        name = next((c.get("name", "") for c in pod["spec"].get("containers") or []
                     if "dcgm-exporter" in (c.get("image") or "")), "")
        path = P(self.kubelet.log_path(pod, name))
        if self.log_waited != path:  # the first line waits (5 s at most) for the kubelet
            self.log_waited = path
            for _ in range(50):
                if os.path.exists(path):
                    break
                time.sleep(0.1)
        try:
            with open(path, "a") as f:
                f.write(slog_line(level, msg, **attrs))
        except OSError:
            pass


def _handler(ex: Exporter) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # as Go's servers: no 40 ms delayed-ACK stalls

        def log_message(self, fmt: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            ctype = "text/plain; charset=utf-8"
            if path == "/metrics":
                code, body = ex.collect()
            elif path == "/health":
                code, body = 200, "OK"
            elif path == "/":
                code, body, ctype = 200, PAGE, "text/html; charset=utf-8"
            else:
                code, body = 404, "404 page not found\n"
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_POST = do_GET

    return Handler


def _klog(level: str, msg: str) -> None:
    import sys

    now = dt.datetime.now()
    sys.stderr.write(f"{level}{now:%m%d %H:%M:%S.%f} {os.getpid():>7} dcgm.go:1] {msg}\n")


_EXPORTERS: dict[int, Exporter] = {}
_LOCK = threading.Lock()


def emulate_dcgm_exporter(kubelet: Any, pod: Obj) -> None:
    """Its daemons.DAEMONS entry's start: the kubelet started the dcgm-exporter pod here.
    One exporter per kubelet process, in a daemon thread; it ends when the pod is gone."""
    with _LOCK:
        ex = _EXPORTERS.get(id(kubelet))
        if ex is None or ex.kubelet is not kubelet:
            ex = _EXPORTERS[id(kubelet)] = Exporter(kubelet)
    ex.adopt(pod)
