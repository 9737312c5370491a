# LAB STAND-IN: not the real dcgm-exporter. Test infrastructure for gpuk8s; never shipped to users.
"""What the emulated dcgm-exporter (dcgm.py) serves, as pure functions: nvidia-smi's CSV and the
kubelet's GPU allocations in, the exporter's /metrics text out (tests/unit/test_lab_dcgm.py).
Sources: NVIDIA/dcgm-exporter 4.5.3-4.8.2 etc/default-counters.csv (names, types, HELP texts),
internal/pkg/rendermetrics/render_metrics.go (label order), internal/pkg/collector
(value formats, blank values skipped), internal/pkg/transformation/kubernetes.go (pod labels).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]
DEFAULT_LISTEN = ":9400"
POD_RESOURCES = "/var/lib/kubelet/pod-resources"
DEFAULT_VERSION = "4.5.3-4.8.2"


@dataclass(frozen=True)
class Counter:
    field_id: int  # DCGM's field id: the order of the blocks in /metrics
    name: str
    prom_type: str
    help: str  # etc/default-counters.csv, verbatim
    smi: str  # the nvidia-smi --query-gpu field it is read from
    double: bool = False  # DCGM_FT_DOUBLE ("%f") rather than DCGM_FT_INT64 ("%d")


COUNTERS = (
    Counter(100, "DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", "clocks.sm"),
    Counter(101, "DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).",
            "clocks.mem"),
    Counter(140, "DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).",
            "temperature.memory"),
    Counter(150, "DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", "temperature.gpu"),
    Counter(155, "DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", "power.draw",
            double=True),
    Counter(203, "DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", "utilization.gpu"),
    Counter(204, "DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).",
            "utilization.memory"),
    Counter(206, "DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).",
            "utilization.encoder"),
    Counter(207, "DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).",
            "utilization.decoder"),
    Counter(251, "DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).",
            "memory.free"),
    Counter(252, "DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).",
            "memory.used"),
    Counter(253, "DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).",
            "memory.reserved"),
)
#: what identifies a GPU (labels); the exporter cannot run without them
IDENTITY = ("index", "uuid", "pci.bus_id", "name", "driver_version")
QUERY = (*IDENTITY, *(c.smi for c in COUNTERS))
UUID_RE = re.compile(r"GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")
BUS_RE = re.compile(r"[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]")
INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
PAGE = """<html>
			<head><title>GPU Exporter</title></head>
			<body>
			<h1>GPU Exporter</h1>
			<p><a href="./metrics">Metrics</a></p>
			<p><a href="./health">Health</a></p>
			</body>
			</html>"""


@dataclass(frozen=True)
class PodInfo:
    name: str
    namespace: str
    container: str
    uid: str = ""


@dataclass(frozen=True)
class Settings:
    """The exporter's flags and environment (flags win, as urfave/cli's)."""

    listen: str = DEFAULT_LISTEN
    kubernetes: bool = False
    old_namespace: bool = False  # pod_name/pod_namespace/container_name, label uuid
    no_hostname: bool = False
    pod_uid: bool = False
    hostname: str = ""
    pod_resources: bool = False  # the kubelet's pod-resources socket is mounted
    version: str = DEFAULT_VERSION


# ---------------------------------------------------------------- pure part
def parse_smi(text: str, fields: Sequence[str]) -> list[dict[str, str]]:
    """Rows of `nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits` (untrusted:
    a line that does not fit the fields or names no valid GPU is dropped)."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            continue
        row = dict(zip(fields, cells, strict=True))
        if not (row.get("index", "").isdigit() and UUID_RE.fullmatch(row.get("uuid", ""))
                and BUS_RE.fullmatch(row.get("pci.bus_id", ""))):
            continue
        rows.append(row)
    return rows


def value(raw: str, double: bool) -> str | None:
    """DCGM's rendering of a field value; None for a blank one (the series is skipped)."""
    try:
        v = float(raw)
    except ValueError:
        return None
    if not math.isfinite(v):
        return None
    return f"{v:f}" if double else str(round(v))


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def owners(assign: Mapping[str, Sequence[str]], pods: Mapping[str, PodInfo]
           ) -> dict[str, PodInfo]:
    """GPU UUID -> the pod holding it, from the kubelet's allocations (pod uid -> device ids,
    ``<UUID>::<n>`` for time-sliced replicas): what the exporter reads from the pod-resources
    API. Several pods on one GPU: the last one listed wins (toDeviceToPod's map)."""
    out = {}
    for uid, devices in assign.items():
        info = pods.get(uid)
        if info is None:
            continue
        for dev in devices:
            out[dev.split("::")[0]] = info
    return out


def render(rows: Sequence[Mapping[str, str]], settings: Settings,
           gpu_owners: Mapping[str, PodInfo]) -> str:
    """/metrics for the GPU rows, as dcgm-exporter's gpuMetricsFormat template."""
    uuid_key = "uuid" if settings.old_namespace else "UUID"
    pod_keys = (("container_name", "pod_namespace", "pod_name") if settings.old_namespace
                else ("container", "namespace", "pod"))
    out: list[str] = []
    for c in sorted(COUNTERS, key=lambda c: c.field_id):
        lines = []
        for row in rows:
            v = value(row.get(c.smi, ""), c.double)
            if v is None:
                continue
            labels = [("gpu", row["index"]), (uuid_key, row["uuid"]),
                      ("pci_bus_id", row["pci.bus_id"]), ("device", f"nvidia{row['index']}"),
                      ("modelName", row.get("name", ""))]
            if settings.hostname and not settings.no_hostname:
                labels.append(("Hostname", settings.hostname))
            if row.get("driver_version"):
                labels.append(("DCGM_FI_DRIVER_VERSION", row["driver_version"]))
            owner = gpu_owners.get(row["uuid"]) if settings.kubernetes and \
                settings.pod_resources else None
            if owner is not None:
                attrs = dict(zip(pod_keys, (owner.container, owner.namespace, owner.name),
                                 strict=True))
                if settings.pod_uid:
                    attrs["pod_uid"] = owner.uid
                labels += sorted(attrs.items())
            text = ",".join(f'{k}="{_esc(x)}"' for k, x in labels)
            lines.append(f"{c.name}{{{text}}} {v}")
        if lines:
            out += [f"# HELP {c.name} {c.help}", f"# TYPE {c.name} {c.prom_type}", *lines]
    return "".join(f"{line}\n" for line in out)


def metrics_text(csv_text: str, fields: Sequence[str], settings: Settings,
                 assign: Mapping[str, Sequence[str]], pods: Mapping[str, PodInfo]) -> str:
    """nvidia-smi's CSV and the kubelet's GPU allocations -> the exporter's /metrics."""
    return render(parse_smi(csv_text, fields), settings, owners(assign, pods))


def pod_info(pod: Obj) -> PodInfo:
    """The pod and the container that holds its GPUs (the first asking for nvidia.com/gpu)."""
    md, containers = pod["metadata"], pod["spec"].get("containers") or [{}]
    holder = next((c for c in containers if any(
        "nvidia.com/gpu" in ((c.get("resources") or {}).get(k) or {})
        for k in ("limits", "requests"))), containers[0])
    return PodInfo(str(md.get("name", "")), str(md.get("namespace", "")),
                   str(holder.get("name", "")), str(md.get("uid", "")))


def _flag(args: Sequence[str], names: Sequence[str], boolean: bool) -> str | None:
    """The value of a flag as urfave/cli reads it: ``--name=v`` or ``-n=v``; a string flag
    also ``--name v``; a boolean one alone means true. The last one given wins."""
    got = None
    for i, a in enumerate(args):
        key, eq, val = a.partition("=")
        if not key.startswith("-") or key.lstrip("-") not in names:
            continue
        if eq:
            got = val
        elif boolean:
            got = "true"
        elif i + 1 < len(args):
            got = args[i + 1]
    return got


def _true(v: str | None) -> bool:
    return (v or "").strip() in ("1", "t", "T", "TRUE", "true", "True")


def settings_for(pod: Obj, node_name: str) -> Settings:
    """The exporter's settings from the pod's dcgm-exporter container."""
    spec = pod["spec"]
    c = next((c for c in spec.get("containers") or [] if "dcgm-exporter" in
              (c.get("image") or "")), (spec.get("containers") or [{}])[0])
    fields = {"spec.nodeName": node_name, "metadata.name": pod["metadata"].get("name", ""),
              "metadata.namespace": pod["metadata"].get("namespace", "")}
    env: dict[str, str] = {}
    for e in c.get("env") or []:
        ref = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        env[str(e.get("name"))] = str(e.get("value", "") if ref is None else fields.get(ref, ""))
    args = [str(a) for a in (c.get("command") or [])[1:] + (c.get("args") or [])]

    def opt(names: Sequence[str], var: str, default: str, boolean: bool = False) -> str:
        got = _flag(args, names, boolean)
        return got if got is not None else env.get(var, default)

    def on(names: Sequence[str], var: str) -> bool:
        return _true(opt(names, var, "false", boolean=True))

    host_net = bool(spec.get("hostNetwork"))
    hostname = env.get("NODE_NAME") or (node_name if host_net else
                                       spec.get("hostname") or pod["metadata"].get("name", ""))
    sock = opt(("pod-resources-kubelet-socket",), "DCGM_POD_RESOURCES_KUBELET_SOCKET",
               f"{POD_RESOURCES}/kubelet.sock")
    mounted = _host_socket(spec, c, sock) == f"{POD_RESOURCES}/kubelet.sock"
    image = c.get("image") or ""
    tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
    return Settings(
        listen=opt(("a", "address"), "DCGM_EXPORTER_LISTEN", DEFAULT_LISTEN),
        kubernetes=on(("k", "kubernetes"), "DCGM_EXPORTER_KUBERNETES"),
        old_namespace=on(("o", "use-old-namespace"), "DCGM_EXPORTER_USE_OLD_NAMESPACE"),
        no_hostname=on(("n", "no-hostname"), "DCGM_EXPORTER_NO_HOSTNAME"),
        pod_uid=on(("kubernetes-enable-pod-uid",), "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID"),
        hostname=hostname, pod_resources=mounted,
        version=re.sub(r"-(ubuntu|ubi|distroless).*$", "", tag) or DEFAULT_VERSION)


def _host_socket(spec: Obj, c: Obj, sock: str) -> str | None:
    """The node path the container's ``sock`` is, through a hostPath volume mount."""
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    for m in c.get("volumeMounts") or []:
        at = str(m.get("mountPath", "")).rstrip("/")
        host = (volumes.get(m.get("name")) or {}).get("hostPath", {}).get("path")
        if at and host and sock.startswith(at + "/"):
            return os.path.normpath(str(host) + sock[len(at):])
    return None


def split_listen(listen: str) -> tuple[str, int]:
    """Go's listen address (":9400", "10.0.0.1:9400", "[::]:9400") -> (host, port)."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)
