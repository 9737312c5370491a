# LAB STAND-IN: not the real kubelet. Test infrastructure for gpuk8s; never shipped to users.
"""kubelet stand-in: node registration and status from the node's real state, static pods (the
stand-in kube-apiserver), pods run for real (realpods.py) and the system daemons the lab cannot
run, emulated as their registry (daemons.py) says."""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as dt
import hashlib
import http.server
import ipaddress
import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from typing import Any

from . import (
    daemons,
    dra_node,
    featuregates,
    kubeconfig,
    nodeinfo,
    pki,
    programs,
    realpods,
)
from .client import ApiError, Client, TLSError, Unreachable, follow
from .common import (
    NO_SYSTEMD_ENV,
    P,
    git_version,
    klog,
    package_version,
    parse_quantity,
    read,
    run,
    ts,
    write,
    yaml_load_all,
)
from .scheduler import pod_requests

#: the pods holding this node's GPUs (note_gpu_clients), read by the nvidia-smi stand-in
GPU_CLIENTS = "/run/gpuk8s-lab/gpu-clients"

Obj = dict[str, Any]
#: etcd flags that name files or folders of the node
PATH_FLAGS = {"--data-dir", "--cert-file", "--key-file", "--trusted-ca-file", "--peer-cert-file",
              "--peer-key-file", "--peer-trusted-ca-file", "--wal-dir"}
STATUS_PERIOD = float(os.environ.get("GPUK8S_LAB_KUBELET_PERIOD", "2"))
#: seconds between lease renewals (the real kubelet's: a quarter of the 40 s lease) and between
#: posts of an unchanged node status. The real kubelet computes its status every
#: nodeStatusUpdateFrequency (10s), posts it at once when it changed, and an unchanged one only
#: every nodeStatusReportFrequency (5m), since its node lifecycle controller reads the Lease;
#: the lab's reads the Ready condition's lastHeartbeatTime (40 s grace), so it posts every 10 s.
#: Not read at the pinned tag: KubeletConfiguration's documented defaults.
HEARTBEAT = 10.0
#: a pod watch ends after this many seconds and is opened again (the API server's own limit
#: is --min-request-timeout, 1800 s; the lab's endpoints may sit behind HAProxy's timeouts)
WATCH_SECONDS = 60
#: seconds between two syncs, however often the pod watch wakes the loop (the kubelet's own
#: status posts come back to it as watch events)
MIN_SYNC_GAP = 0.1
APISERVER_UNIT = "kube-apiserver-standin"
ETCD_UNIT = "etcd-static-pod"
#: the REAL etcd (Debian's etcd-server 3.5), carried by the lab's kubelet package: the kubelet
#: runs it for kubeadm's etcd static pod as the real one runs the registry.k8s.io/etcd image
ETCD_BINARY = "/usr/lib/gpuk8s-lab/etcd/etcd"
NO_CNI = ("container runtime network not ready: NetworkReady=false "
          "reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not "
          "initialized")


def stop_pidfile(path: str) -> None:
    """NO_SYSTEMD mode: stop the process a pidfile names (used by the kubelet and test fakes)."""
    try:
        pid = int((read(path) or "").strip())
        os.kill(pid, 15)
        for _ in range(50):
            os.kill(pid, 0)
            time.sleep(0.1)
    except (ValueError, OSError):
        pass


class StaticProcess:
    """One static pod run as a process of the node: a transient systemd unit (or, with
    GPUK8S_LAB_NO_SYSTEMD, a child with a pidfile), restarted when its manifest's command
    changes, with CrashLoopBackOff's pause between failed starts. A restarted kubelet adopts
    the process it left running (as the real one finds its containers through the CRI)."""

    def __init__(self, unit: str, description: str) -> None:
        self.unit, self.description = unit, description
        self.pidfile = f"/run/gpuk8s-lab/{unit}.pid"
        self.hashfile = f"/run/gpuk8s-lab/{unit}.hash"
        self.hash = (read(self.hashfile) or "").strip()
        self.proc: subprocess.Popen[bytes] | None = None
        self.last_start = 0.0

    def sync(self, cmd: list[str], env: dict[str, str], version: str, log: str) -> bool:
        """Run ``cmd``; True when it runs (or was just started)."""
        h = hashlib.sha256(json.dumps([cmd, version]).encode()).hexdigest()
        running = self.running()
        if running and h == self.hash:
            return True
        if running:
            self.stop()
        if time.monotonic() - self.last_start < 10 and self.hash == h:
            return False  # back-off like CrashLoopBackOff
        self.hash = h
        write(self.hashfile, h)
        self.last_start = time.monotonic()
        if os.environ.get(NO_SYSTEMD_ENV):
            os.makedirs(P("/var/log"), exist_ok=True)
            with open(P(log), "ab") as logf:
                self.proc = subprocess.Popen(cmd, env={**os.environ, **env},
                                             start_new_session=True,
                                             stdout=subprocess.DEVNULL, stderr=logf)
            write(self.pidfile, str(self.proc.pid))
        else:
            run(["systemctl", "reset-failed", self.unit])
            run(["systemd-run", f"--unit={self.unit}", f"--description={self.description}",
                 "--property=KillMode=mixed", *(f"--setenv={k}={v}" for k, v in env.items()),
                 *cmd])
        return True

    def _pid(self) -> int | None:
        try:
            pid = int((read(self.pidfile) or "").strip())
            os.kill(pid, 0)
            return pid
        except (ValueError, OSError):
            return None

    def running(self) -> bool:
        if os.environ.get(NO_SYSTEMD_ENV):
            if self.proc is not None:
                self.proc.poll()
            return self._pid() is not None
        return nodeinfo.unit_active(self.unit)

    def stop(self) -> None:
        if os.environ.get(NO_SYSTEMD_ENV):
            stop_pidfile(self.pidfile)
            self.proc = None
        elif self.running():
            run(["systemctl", "stop", self.unit])


def fatal(err: str) -> None:
    klog("E", f'"command failed" err="{err}"', "run.go:72")
    sys.exit(1)


def _without_heartbeats(status: Obj) -> Obj:
    """A node status without its conditions' heartbeat times: what tells a change."""
    return {**status, "conditions": [{k: v for k, v in c.items() if k != "lastHeartbeatTime"}
                                     for c in status.get("conditions") or []]}


def is_device_resource(name: str) -> bool:
    """The device plugin's resources: nvidia.com/gpu and (MIG, mixed strategy)
    nvidia.com/mig-<profile>."""
    return name == "nvidia.com/gpu" or name.startswith("nvidia.com/mig-")


class Kubelet:
    def __init__(self, argv: list[str], version: str) -> None:
        self.version = version
        self.args = self._parse(argv)
        a = self.args
        cfg_path = a.config or "/var/lib/kubelet/config.yaml"
        text = read(cfg_path)
        if text is None:
            fatal(f"failed to load kubelet config file, path: {cfg_path}, error: failed to load "
                  f"Kubelet config file {cfg_path}, error failed to read kubelet config file "
                  f'\\"{cfg_path}\\", error: open {cfg_path}: no such file or directory')
        docs = yaml_load_all(text or "")
        self.cfg: Obj = docs[0] if docs else {}
        try:
            self.gates = featuregates.validate(self.cfg.get("featureGates") or {})
            if a.feature_gates:
                self.gates.update(featuregates.validate(featuregates.parse_flag(a.feature_gates)))
        except featuregates.GateError as e:
            fatal(f"failed to set feature gates from initial flags-based config: {e}")
        if nodeinfo.swap_on() and self.cfg.get("failSwapOn", True) is not False:
            fatal("failed to run Kubelet: running with swap on is not supported, please disable "
                  "swap or set --fail-swap-on flag to false")
        if nodeinfo.cgroup_v1() and self.cfg.get("failCgroupV1", True) is not False:
            # kubelet >= 1.35 defaults failCgroupV1 to true
            fatal("failed to run Kubelet: kubelet is configured to not run on a host using "
                  "cgroup v1. cgroup v1 support is in maintenance mode, please migrate to "
                  "cgroup v2")
        self.cri = a.container_runtime_endpoint or self.cfg.get("containerRuntimeEndpoint") or \
            nodeinfo.CRI_SOCKET
        err = nodeinfo.cri_error(self.cri)
        if err:
            fatal(f"failed to run Kubelet: {err}")
        kc_path = a.kubeconfig or "/etc/kubernetes/kubelet.conf"
        if not os.path.exists(P(kc_path)):
            boot = a.bootstrap_kubeconfig or "/etc/kubernetes/bootstrap-kubelet.conf"
            fatal(f"failed to run Kubelet: unable to load bootstrap kubeconfig: stat {boot}: "
                  "no such file or directory")
        self.creds = kubeconfig.load(P(kc_path))
        self.client = Client(self.creds, timeout=10, agent="kubelet", keep_alive=True)
        self.node_name = (a.hostname_override or nodeinfo.hostname()).lower()
        self.node_ip = a.node_ip or nodeinfo.ipv4()
        self.started: dict[str, float] = {}
        #: events of real pods already posted (podrun's report lists them all)
        self.posted: dict[str, int] = {}
        self.proxy_started = False   # the emulated kube-proxy's loop
        self.pod_cidr: str | None = None
        self.dns_started = False
        # a restarted kubelet adopts the static pod it left running (as the real one finds
        # its containers through the CRI) instead of restarting it
        self.apiserver = StaticProcess(APISERVER_UNIT, "LAB STAND-IN kube-apiserver (static "
                                       "pod kube-apiserver)")
        self.etcd = StaticProcess(ETCD_UNIT, "REAL etcd (static pod etcd)")
        self.registered = False
        #: static pod manifest file -> ((mtime, size, inode), its first document or None)
        self.manifest_cache: dict[str, tuple[Any, Obj | None]] = {}
        #: set by the pod watch: a sync is due now
        self.wake = threading.Event()
        self.status_posted = self.lease_renewed = -HEARTBEAT
        #: device plugin allocation: pod uid -> the device IDs its containers were given
        #: (GPU or MIG device UUIDs, ``<UUID>::<n>`` for a time-slicing replica)
        self.gpu_assign: dict[str, list[str]] = {}
        #: what the device plugin advertises (daemons.resources): resource name -> device IDs
        self.devices: dict[str, list[str]] = {}
        #: the running device plugin container (its device list strategy shapes Allocate)
        self.plugin_container: Obj | None = None
        #: emulated programs (programs.py): (pod uid, container) -> [outcome, restarts,
        #: monotonic time of the next start while it fails]
        self.programs: dict[tuple[str, str], list[Any]] = {}

    @staticmethod
    def _parse(argv: list[str]) -> argparse.Namespace:
        p = argparse.ArgumentParser(prog="kubelet", add_help=False)
        for f in ("config", "kubeconfig", "bootstrap-kubeconfig", "container-runtime-endpoint",
                  "node-ip", "hostname-override", "pod-infra-container-image", "feature-gates",
                  "node-labels", "register-with-taints", "v", "cgroup-driver"):
            p.add_argument(f"--{f}")
        p.add_argument("--version", nargs="?", const="true")
        args, _ = p.parse_known_args(argv)
        return args

    # -------------------------------------------------------------- node facts
    def pod_runtime(self, pod: Obj, cfg: Obj) -> str | None:
        rc = pod["spec"].get("runtimeClassName")
        if not rc:
            return nodeinfo.default_runtime(cfg)
        try:
            return self.client.get(f"/apis/node.k8s.io/v1/runtimeclasses/{rc}").get("handler")
        except ApiError:
            return None

    def cni_ready(self) -> bool:
        d = P(daemons.CNI_DIR)
        try:
            return any(f.endswith((".conf", ".conflist", ".json")) for f in os.listdir(d))
        except OSError:
            return False

    def node_object(self) -> Obj:
        labels = {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                  "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": self.node_name,
                  "kubernetes.io/os": "linux"}
        for kv in (self.args.node_labels or "").split(","):
            if "=" in kv:
                k, v = kv.split("=", 1)
                labels[k] = v
        node: Obj = {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": self.node_name, "labels": labels,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
            "spec": {}}
        taints = []
        for t in filter(None, (self.args.register_with_taints or "").split(",")):
            kv, _, eff = t.partition(":")
            k, _, v = kv.partition("=")
            taints.append({"key": k, "effect": eff, **({"value": v} if v else {})})
        if taints:
            node["spec"]["taints"] = taints
        return node

    def status(self, pods: list[Obj]) -> Obj:
        cpu = os.cpu_count() or 1
        mem = nodeinfo.mem_ki()
        max_pods = int(self.cfg.get("maxPods", 110))
        cap = {"cpu": str(cpu), "ephemeral-storage": "61202244Ki", "hugepages-1Gi": "0",
               "hugepages-2Mi": "0", "memory": f"{mem}Ki", "pods": str(max_pods)}
        alloc = dict(cap, memory=f"{max(mem - 102400, 0)}Ki", **{
            "ephemeral-storage": "56403987978"})
        self.devices = daemons.resources(self, pods)
        for name, ids in self.devices.items():
            cap[name] = alloc[name] = str(len(ids))
        runtime_ok = nodeinfo.containerd_active() and nodeinfo.cri_plugin()[0]
        if not runtime_ok:
            ready = ("False", "KubeletNotReady", "container runtime is down")
        elif not self.cni_ready():
            ready = ("False", "KubeletNotReady", NO_CNI)
        else:
            ready = ("True", "KubeletReady", "kubelet is posting ready status")
        now = ts()
        conds = [{"type": t, "status": "False", "reason": r, "message": m,
                  "lastHeartbeatTime": now, "lastTransitionTime": now}
                 for t, r, m in (("MemoryPressure", "KubeletHasSufficientMemory",
                                  "kubelet has sufficient memory available"),
                                 ("DiskPressure", "KubeletHasNoDiskPressure",
                                  "kubelet has no disk pressure"),
                                 ("PIDPressure", "KubeletHasSufficientPID",
                                  "kubelet has sufficient PID available"))]
        conds.append({"type": "Ready", "status": ready[0], "reason": ready[1],
                      "message": ready[2], "lastHeartbeatTime": now, "lastTransitionTime": now})
        return {"capacity": cap, "allocatable": alloc, "conditions": conds,
                "addresses": [{"type": "InternalIP", "address": self.node_ip},
                              {"type": "Hostname", "address": self.node_name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {
                    "machineID": (read("/etc/machine-id") or "").strip(),
                    "systemUUID": (read("/sys/class/dmi/id/product_uuid") or "").strip(),
                    "bootID": (nodeinfo.read_abs("/proc/sys/kernel/random/boot_id") or
                               "").strip(),
                    "kernelVersion": nodeinfo.kernel(), "osImage": nodeinfo.os_image(),
                    "containerRuntimeVersion": f"containerd://{nodeinfo.containerd_version()}",
                    "kubeletVersion": git_version(self.version),
                    # deprecated and left empty by the real kubelet, but always serialized
                    # (no omitempty): typed clients (the Python client) require the key
                    "kubeProxyVersion": "",
                    "operatingSystem": "linux", "architecture": "amd64"}}

    def sync_node(self, pods: list[Obj]) -> Obj:
        """Register the node once, post its status when it changed or a heartbeat is due,
        renew its lease; returns the node as the API has it now."""
        path = f"/api/v1/nodes/{self.node_name}"
        if not self.registered:
            try:
                self.client.get(path)
            except ApiError as e:
                if e.code != 404:
                    raise
                self.client.request("POST", "/api/v1/nodes", self.node_object())
                klog("I", f'"Successfully registered node" node="{self.node_name}"',
                     "kubelet_node_status.go:78")
            self.registered = True
        node = self.client.get(path)
        old = {c["type"]: c for c in node.get("status", {}).get("conditions") or []}
        st = self.status(pods)
        for c in st["conditions"]:
            o = old.get(c["type"])
            if o and o.get("status") == c["status"]:
                c["lastTransitionTime"] = o.get("lastTransitionTime", c["lastTransitionTime"])
        now_ = time.monotonic()
        if now_ - self.status_posted >= HEARTBEAT or \
                _without_heartbeats(node.get("status") or {}) != _without_heartbeats(st):
            node["status"] = st
            posted = self.client.request("PUT", path + "/status", node)
            node = posted if isinstance(posted, dict) and posted.get("metadata") else node
            self.status_posted = now_
        if now_ - self.lease_renewed >= HEARTBEAT:
            self.renew_lease(node)
            self.lease_renewed = now_
        return node

    def renew_lease(self, node: Obj) -> None:
        """The node's heartbeat Lease in kube-node-lease (what `kubectl describe node` shows
        under Lease:), owned by the Node so that deleting the node removes it."""
        now_ = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        name = self.node_name
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {
            "name": name, "namespace": "kube-node-lease", "ownerReferences": [{
                "apiVersion": "v1", "kind": "Node", "name": name,
                "uid": node["metadata"].get("uid")}]},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now_}}
        path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        try:
            self.client.request("PUT", f"{path}/{name}", lease)
        except ApiError as e:
            if e.code != 404:
                raise
            self.client.request("POST", path, lease)

    # -------------------------------------------------------------- static pods
    def static_manifests(self) -> dict[str, Obj]:
        """The static pod manifests, each parsed again only when its file changed (the
        file-source's check each sync, as the real kubelet re-reads the folder); the caller
        gets its own copy of each."""
        d = self.cfg.get("staticPodPath") or "/etc/kubernetes/manifests"
        out = {}
        try:
            names = sorted(os.listdir(P(d)))
        except OSError:
            return {}
        cache: dict[str, tuple[Any, Obj | None]] = {}
        for fn in names:
            if fn.endswith((".yaml", ".yml", ".json")):
                try:
                    st = os.stat(P(f"{d}/{fn}"))
                except OSError:
                    continue
                key = (st.st_mtime_ns, st.st_size, st.st_ino)
                got = self.manifest_cache.get(fn)
                if got is None or got[0] != key:
                    docs = yaml_load_all(read(f"{d}/{fn}") or "")
                    got = (key, docs[0] if docs and isinstance(docs[0], dict) else None)
                cache[fn] = got
                if got[1] is not None:
                    out[fn] = copy.deepcopy(got[1])
        self.manifest_cache = cache
        return out

    def _sync_static(self, proc: StaticProcess, manifest: Obj | None, pod: str,
                     build: Any) -> bool:
        """Run ``proc`` for a static pod manifest (stop it when the manifest is gone); True
        when it runs. ``build(argv, image)`` gives (command, env, version, log file)."""
        if manifest is None:
            proc.stop()
            return False
        c = manifest["spec"]["containers"][0]
        argv = list(c.get("command") or [])[1:] + list(c.get("args") or [])
        cmd, env, version, log = build(argv, c.get("image", ""))
        started = proc.running()
        # a new image tag (kubeadm upgrade) restarts it, like any change of the manifest
        if not proc.sync(cmd, env, version, log):
            return False
        if not started:
            klog("I", f'"Starting static pod" pod="kube-system/{pod}-{self.node_name}"',
                 "kubelet.go:2468")
        return True

    def sync_etcd(self, manifest: Obj | None) -> bool:
        """Run the REAL etcd with the command of kubeadm's static pod manifest."""
        def build(argv: list[str], image: str) -> tuple[list[str], dict[str, str], str, str]:
            # paths of the manifest are the node's (GPUK8S_LAB_ROOT for the in-host tests)
            argv = [f"{a.split('=', 1)[0]}={P(a.split('=', 1)[1])}"
                    if a.split("=", 1)[0] in PATH_FLAGS else a for a in argv]
            return [P(ETCD_BINARY), *argv], {}, image, "/var/log/etcd.log"

        return self._sync_static(self.etcd, manifest, "etcd", build)

    def sync_apiserver(self, manifest: Obj | None) -> bool:
        """Run the stand-in kube-apiserver for the static pod manifest; True when it runs."""
        def build(argv: list[str], image: str) -> tuple[list[str], dict[str, str], str, str]:
            ver = image.rsplit(":", 1)[-1].lstrip("v") if ":" in image else ""
            libdir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            return ([sys.executable, "-m", "k8s.apiserver", *argv],
                    {"PYTHONPATH": libdir, "GPUK8S_LAB_K8S_VERSION": ver}, ver,
                    "/var/log/kube-apiserver.log")

        return self._sync_static(self.apiserver, manifest, "kube-apiserver", build)

    def sync_mirror_pods(self, manifests: dict[str, Obj], pods: list[Obj], api_up: bool) -> None:
        want = {}
        for m in manifests.values():
            name = f"{m['metadata']['name']}-{self.node_name}"
            want[name] = m
        for p in pods:
            ann = p["metadata"].get("annotations") or {}
            if "kubernetes.io/config.mirror" in ann and p["metadata"]["name"] not in want:
                self.client.request("DELETE", f"/api/v1/namespaces/kube-system/pods/"
                                    f"{p['metadata']['name']}")
        have = {p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get(
            "kubernetes.io/config.hash") for p in pods}
        for name, m in want.items():
            h = hashlib.md5(json.dumps(m, sort_keys=True).encode()).hexdigest()
            if name in have:
                if have[name] == h:
                    continue
                # the manifest changed (kubeadm upgrade): the mirror pod follows it
                with contextlib.suppress(ApiError):
                    self.client.request("DELETE", f"/api/v1/namespaces/kube-system/pods/{name}")
            mirror = json.loads(json.dumps(m))
            mirror["metadata"]["name"] = name
            mirror["metadata"]["namespace"] = mirror["metadata"].get("namespace", "kube-system")
            mirror["metadata"]["annotations"] = {"kubernetes.io/config.hash": h,
                                                 "kubernetes.io/config.mirror": h,
                                                 "kubernetes.io/config.source": "file"}
            mirror["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node",
                                                      "name": self.node_name, "controller": True}]
            mirror["spec"]["nodeName"] = self.node_name
            mirror.pop("status", None)
            with contextlib.suppress(ApiError):
                self.client.request("POST", f"/api/v1/namespaces/{mirror['metadata']['namespace']}"
                                    "/pods", mirror)

    # -------------------------------------------------------------- pods
    def log_path(self, pod: Obj, container: str) -> str:
        md = pod["metadata"]
        return f"/var/log/pods/{md['namespace']}_{md['name']}_{md['uid']}/{container}/0.log"

    def set_status(self, pod: Obj, phase: str, states: dict[str, Obj], ready: bool,
                   events: list[tuple[str, str, str]] = (),  # type: ignore[assignment]
                   restarts: dict[str, int] | None = None,
                   last: dict[str, Obj] | None = None) -> None:
        md = pod["metadata"]
        st = pod.setdefault("status", {})
        host_net = pod["spec"].get("hostNetwork")
        ip = self.node_ip if host_net else self._pod_ip(md["uid"])
        new = dict(st)
        new.update({"phase": phase, "hostIP": self.node_ip,
                    "startTime": st.get("startTime") or ts()})
        if phase != "Pending" or any("running" in s for s in states.values()):
            new["podIP"] = ip
            new["podIPs"] = [{"ip": ip}]
        prev = {c["name"]: c.get("state", {}) for c in st.get("containerStatuses") or []}
        for name, state in states.items():
            if "running" in state and "running" in prev.get(name, {}):
                states[name] = prev[name]
        new["containerStatuses"] = [
            {"name": c["name"], "image": c.get("image", ""), "imageID": "",
             "ready": ready and "running" in states.get(c["name"], {}),
             "restartCount": (restarts or {}).get(c["name"], 0),
             "started": "running" in states.get(c["name"], {}),
             "state": states.get(c["name"], {"waiting": {"reason": "ContainerCreating"}}),
             **({"lastState": (last or {})[c["name"]]} if c["name"] in (last or {}) else {})}
            for c in pod["spec"].get("containers") or []]
        cond_ready = "True" if ready else "False"
        new["conditions"] = [
            {"type": "PodReadyToStartContainers", "status": "True" if phase != "Pending" else
             "False"},
            {"type": "Initialized", "status": "True"},
            {"type": "Ready", "status": cond_ready},
            {"type": "ContainersReady", "status": cond_ready},
            {"type": "PodScheduled", "status": "True"}]
        if phase == "Succeeded":
            for c in new["conditions"]:
                if c["type"] in ("Ready", "ContainersReady"):
                    c["status"] = "False"
                    c["reason"] = "PodCompleted"
        if phase == "Failed" and st.get("reason"):
            new["reason"] = st["reason"]
        self._put_status(pod, new, events)

    def _put_status(self, pod: Obj, new: Obj, events: list[tuple[str, str, str]]) -> None:
        md, st = pod["metadata"], pod.get("status", {})
        if {k: v for k, v in new.items() if k != "startTime"} == \
                {k: v for k, v in st.items() if k != "startTime"}:
            return
        pod["status"] = new
        try:
            self.client.request("PUT", f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}"
                                "/status", pod)
        except ApiError:
            return
        for etype, reason, msg in events:
            self.event(pod, etype, reason, msg)

    def real_status(self, pod: Obj, rep: Obj) -> None:
        """The status of a pod podrun runs, from its report (status.json)."""
        st = pod.get("status", {})
        spec = pod["spec"]
        phase = rep.get("phase", "Pending")

        def entries(group: str) -> list[Obj]:
            out = []
            for c in spec.get(group) or []:
                got = (rep.get(group) or {}).get(c["name"], {})
                state = got.get("state") or {"waiting": {"reason": "PodInitializing" if
                                                         group == "containers" and
                                                         spec.get("initContainers") else
                                                         "ContainerCreating"}}
                running = "running" in state
                entry = {"name": c["name"], "image": c.get("image", ""), "imageID": "",
                         "restartCount": got.get("restartCount", 0), "started": running,
                         "ready": running and realpods.probe_ok(c, rep.get("podIP")),
                         "state": state}
                if got.get("lastState"):
                    entry["lastState"] = got["lastState"]
                out.append(entry)
            return out

        containers = entries("containers")
        ready = phase == "Running" and all(c["ready"] for c in containers)
        new: Obj = {"phase": phase, "hostIP": self.node_ip, "hostIPs": [{"ip": self.node_ip}],
                    "startTime": st.get("startTime") or ts(), "containerStatuses": containers,
                    "qosClass": st.get("qosClass", "BestEffort")}
        if st.get("resourceClaimStatuses"):  # the resourceclaim controller's, kept
            new["resourceClaimStatuses"] = st["resourceClaimStatuses"]
        if spec.get("initContainers"):
            new["initContainerStatuses"] = entries("initContainers")
        if rep.get("podIP"):
            new["podIP"], new["podIPs"] = rep["podIP"], [{"ip": rep["podIP"]}]
        inits_done = all("terminated" in c["state"] and c["state"]["terminated"]["exitCode"]
                         == 0 for c in new.get("initContainerStatuses", []))
        flag = "True" if ready else "False"
        new["conditions"] = [
            {"type": "PodReadyToStartContainers", "status": "True" if rep.get("podIP") else
             "False"},
            {"type": "Initialized", "status": "True" if inits_done else "False"},
            {"type": "Ready", "status": flag}, {"type": "ContainersReady", "status": flag},
            {"type": "PodScheduled", "status": "True"}]
        if phase in ("Succeeded", "Failed"):
            for c in new["conditions"]:
                if c["type"] in ("Ready", "ContainersReady"):
                    c.update({"status": "False", "reason": "PodCompleted" if phase ==
                              "Succeeded" else "PodFailed"})
        uid = pod["metadata"]["uid"]
        self._put_status(pod, new, [])
        for etype, reason, msg in (rep.get("events") or [])[self.posted.get(uid, 0):]:
            self.event(pod, etype, reason, msg)
        self.posted[uid] = len(rep.get("events") or [])

    def event(self, pod: Obj, etype: str, reason: str, msg: str) -> None:
        md = pod["metadata"]
        name = f"{md['name']}.{hashlib.md5((reason + msg).encode()).hexdigest()[:16]}"
        ev = {"metadata": {"name": name, "namespace": md["namespace"]},
              "involvedObject": {"kind": "Pod", "name": md["name"], "namespace": md["namespace"],
                                 "uid": md["uid"], "apiVersion": "v1"},
              "reason": reason, "message": msg, "type": etype,
              "source": {"component": "kubelet", "host": self.node_name},
              "firstTimestamp": ts(), "lastTimestamp": ts(), "count": 1}
        with contextlib.suppress(ApiError):
            self.client.request("POST", f"/api/v1/namespaces/{md['namespace']}/events", ev)

    def _pod_ip(self, uid: str) -> str:
        """An emulated pod's IP: from the top of the node's podCIDR (host-local hands out the
        bottom to real pods), fixed per pod."""
        n = int(hashlib.sha256(uid.encode()).hexdigest()[:4], 16)
        net = ipaddress.ip_network(self.pod_cidr or "10.244.255.0/24")
        return str(net[net.num_addresses - 2 - n % 40])

    def held(self) -> dict[str, int]:
        """Devices given to pods, per resource name."""
        owner = {d: name for name, ids in self.devices.items() for d in ids}
        out: dict[str, int] = {}
        for ids in self.gpu_assign.values():
            for d in ids:
                name = owner.get(d) or ("nvidia.com/gpu" if d.startswith("GPU-") else d)
                out[name] = out.get(name, 0) + 1
        return out

    def sync_pod(self, pod: Obj, cfg: Obj, avail: dict[str, int],
                 used: dict[str, int]) -> dict[str, int]:
        """Drive one pod's status; returns the devices it holds per resource name."""
        md, spec = pod["metadata"], pod["spec"]
        phase = pod.get("status", {}).get("phase")
        uid = md["uid"]
        if phase in ("Succeeded", "Failed"):
            self.gpu_assign.pop(uid, None)
            return {}
        want = {k: int(v) for k, v in pod_requests(pod).items() if is_device_resource(k) and v}
        held = self.held()
        for name, n in want.items() if uid not in self.gpu_assign else ():
            free = avail.get(name, 0) - max(used.get(name, 0), held.get(name, 0))
            if n > free:
                pod.setdefault("status", {})["reason"] = "UnexpectedAdmissionError"
                pod["status"]["message"] = (
                    "Allocate failed due to requested number of devices unavailable for "
                    f"{name}. Requested: {n}, Available: {max(free, 0)}, which is unexpected")
                self.set_status(pod, "Failed", {}, False, [
                    ("Warning", "UnexpectedAdmissionError", pod["status"]["message"])])
                return {}
        if spec.get("resourceClaims") and uid not in self.started and \
                uid not in self.gpu_assign and (err := dra_node.prepare(self, pod)):
            self.set_status(pod, "Pending", {}, False, [(
                "Warning", "FailedPrepareDynamicResources",
                f"Failed to prepare dynamic resources: {err}")])
            return {}
        handler = self.pod_runtime(pod, cfg)
        rc = spec.get("runtimeClassName")
        if rc and handler is None:
            self.set_status(pod, "Pending", {}, False, [(
                "Warning", "FailedCreatePodSandBox", f"Failed to create pod sandbox: "
                f'runtimeclasses.node.k8s.io "{rc}" not found')])
            return {}
        if handler not in nodeinfo.runtime_handlers(cfg):
            self.set_status(pod, "Pending", {}, False, [(
                "Warning", "FailedCreatePodSandBox", "Failed to create pod sandbox: rpc error: "
                "code = Unknown desc = failed to get sandbox runtime: no runtime for "
                f'"{handler}" is configured')])
            return {}
        if not spec.get("hostNetwork") and not self.cni_ready():
            sandbox = hashlib.sha256(uid.encode()).hexdigest()
            self.set_status(pod, "Pending", {}, False, [(
                "Warning", "FailedCreatePodSandBox", "Failed to create pod sandbox: rpc error: "
                f'code = Unknown desc = failed to setup network for sandbox "{sandbox}": cni '
                "plugin not initialized")])
            return {}
        if want and uid not in self.gpu_assign:
            self.gpu_assign[uid] = [d for name, n in sorted(want.items())
                                    for d in self.allocate(name, n)]
        if daemons.emulated(pod):
            self.sync_emulated(pod, handler)
            return want
        return self.sync_real(pod, handler, want)

    def note_gpu_clients(self, pods: list[Obj]) -> None:
        """Which running pods hold this node's GPUs, for the nvidia-smi stand-in (a MIG mode
        change is refused while any does, as the driver refuses it under a client): the GPU
        DaemonSets' pods (those selecting nvidia.com/gpu.present: the device plugin, DCGM
        exporter and DRA kubelet plugin keep NVML open) and pods given GPUs. One
        "namespace/name" a line in GPU_CLIENTS; empty when none."""
        clients = []
        for p in pods:
            if p.get("status", {}).get("phase") != "Running":
                continue
            gpu_daemon = "nvidia.com/gpu.present" in (p["spec"].get("nodeSelector") or {})
            if gpu_daemon or p["metadata"]["uid"] in self.gpu_assign:
                clients.append(f"{p['metadata']['namespace']}/{p['metadata']['name']}\n")
        text = "".join(sorted(clients))
        if read(GPU_CLIENTS) != text:
            write(GPU_CLIENTS, text)

    def sync_emulated(self, pod: Obj, handler: str | None) -> None:
        """System pods whose images the lab does not have (daemons.DAEMONS), Running without
        a process."""
        spec, uid = pod["spec"], pod["metadata"]["uid"]
        first = uid not in self.started
        if first:
            self.started[uid] = time.monotonic()
            daemons.start(self, pod)
        started_at = ts()
        states: dict[str, Obj] = {}
        ready = True
        events: list[tuple[str, str, str]] = []
        restarts: dict[str, int] = {}
        last: dict[str, Obj] = {}
        for c in spec.get("containers") or []:
            entry = daemons.container(c)
            if first:
                log = entry.log(self, handler) if entry and entry.log else ""
                write(self.log_path(pod, c["name"]), log)
            states[c["name"]] = {"running": {"startedAt": started_at}}
            prog = self.run_program(pod, c, entry)
            if prog is None:
                if first:
                    events.append(("Normal", "Started", f"Started container {c['name']}"))
                continue
            outcome, restarts[c["name"]], fresh = prog
            if fresh:
                write(self.log_path(pod, c["name"]), "".join(ln + "\n" for ln in outcome.log))
            if outcome.state == "crash":
                ready = False
                last[c["name"]] = {"terminated": {"exitCode": outcome.exit_code,
                                                  "reason": "Error", "finishedAt": started_at}}
                states[c["name"]] = {"waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {int(programs.backoff(restarts[c['name']]))}s "
                               f"restarting failed container={c['name']} "
                               f"pod={pod['metadata']['name']}_{pod['metadata']['namespace']}"
                               f"({pod['metadata']['uid']})"}}
                if fresh:
                    events.append(("Warning", "BackOff", "Back-off restarting failed "
                                   f"container {c['name']} in pod {pod['metadata']['name']}_"
                                   f"{pod['metadata']['namespace']}({pod['metadata']['uid']})"))
            elif outcome.state == "unready":
                ready = False
                if fresh:
                    events.append(("Warning", "Unhealthy", "Readiness probe failed: "
                                   + (outcome.log[-1] if outcome.log else "")))
            elif fresh:
                events.append(("Normal", "Started", f"Started container {c['name']}"))
        self.set_status(pod, "Running", states, ready, events, restarts, last)

    def run_program(self, pod: Obj, container: Obj, entry: daemons.Container | None
                    ) -> tuple[programs.Outcome, int, bool] | None:
        """The container's emulated program (its registry ``entry``'s), run at the pod's start
        and again after each CrashLoopBackOff pause (or readiness period) while it fails:
        (outcome, restarts, whether it ran now). None: no program for this container."""
        if entry is None or entry.program is None:
            return None
        key = (pod["metadata"]["uid"], container["name"])
        got = self.programs.get(key)
        now = time.monotonic()
        if got is not None and (got[0].state == "ok" or now < got[2]):
            return got[0], got[1], False
        outcome = entry.program(self, pod, container)
        restarts = (got[1] if got else 0) + (1 if outcome.state == "crash" and got else 0)
        pause = programs.backoff(restarts + 1) if outcome.state == "crash" else 5.0
        self.programs[key] = [outcome, restarts, now + pause]
        if outcome.state != "ok":
            klog("W", f'"Emulated program failed" pod="{pod["metadata"]["namespace"]}/'
                 f'{pod["metadata"]["name"]}" container="{container["name"]}" '
                 f'state="{outcome.state}"', "programs.go:1")
        return outcome, restarts, True

    def pod_api(self, pod: Obj) -> programs.Api | None:
        """The API as the pod's ServiceAccount: a token bound to the pod (TokenRequest, as the
        kubelet's projected service account token volume asks for one)."""
        md = pod["metadata"]
        try:
            token = realpods.token_request(self.client, pod, 3607)
        except ApiError as e:
            klog("E", f'"Failed to get service account token" pod="{md["namespace"]}/'
                 f'{md["name"]}" err="{e}"', "token_manager.go:120")
            return None
        creds = kubeconfig.Creds(self.creds.server, self.creds.ca_pem, token=token,
                                 insecure=self.creds.insecure)
        return programs.Api(Client(creds, timeout=10, agent=pod["metadata"]["name"],
                                   keep_alive=True))

    def sync_real(self, pod: Obj, handler: str | None, want: dict[str, int]) -> dict[str, int]:
        """Pods run for real by podrun (a transient unit per pod): start it once, then copy
        what it reports into the pod's status. Returns the devices the pod holds."""
        md = pod["metadata"]
        uid = md["uid"]
        if uid not in self.started:
            self.started[uid] = time.monotonic()
            if realpods.report(uid) is None:   # not adopted from an earlier kubelet
                try:
                    spec = realpods.prepare(
                        self.client, pod, self.node_ip,
                        sorted({u.split("::")[0] for u in self.gpu_assign.get(uid, [])}),
                        handler == "nvidia", os.path.dirname(os.path.dirname(
                            self.log_path(pod, "x"))), self.cfg)
                except (realpods.VolumeError, ApiError) as e:
                    del self.started[uid]   # tried again next sync, as the kubelet retries
                    self.set_status(pod, "Pending", {}, False, [("Warning", "FailedMount",
                                                                 str(e))])
                    return want
                dra_node.cdi(self, pod, spec)
                spec["deviceAllocation"] = programs.device_plugin_allocation(
                    self.plugin_container, spec["gpus"])
                try:
                    realpods.start(uid, spec)
                except realpods.NoRuntime as e:
                    self.set_status(pod, "Pending", {}, False, [(
                        "Warning", "FailedCreatePodSandBox", str(e))])
                    return want
        rep = realpods.report(uid) or {}
        if rep.get("phase") == "Running":
            try:   # the token manager renews the pod's projected tokens
                realpods.refresh_tokens(self.client, pod)
            except (ApiError, OSError) as e:
                klog("E", f'"Couldn\'t update token" pod="{md["namespace"]}/{md["name"]}" '
                     f'err="{e}"', "token_manager.go:128")
        if rep.get("phase") in ("Succeeded", "Failed"):
            self.gpu_assign.pop(uid, None)
        elif \
                time.monotonic() - self.started[uid] > 30 and not realpods.active(uid):
            # the runner ended early (its sandbox failed): start it again, as the kubelet
            # retries a pod sandbox
            realpods.stop(uid)
            del self.started[uid]
            self.posted.pop(uid, None)
        self.real_status(pod, rep)
        return {} if rep.get("phase") in ("Succeeded", "Failed") else want

    def allocate(self, name: str, count: int) -> list[str]:
        """The device plugin's Allocate for one resource: its first free devices, by UUID (a
        GPU's, or a MIG device's for nvidia.com/mig-<profile>); with time-slicing, free
        replicas ``<UUID>::<n>`` spread over the devices (the plugin's "distributed" policy)."""
        taken = {u for uuids in self.gpu_assign.values() for u in uuids}
        return [u for u in self.devices.get(name, []) if u not in taken][:count]

    def sync(self) -> None:
        manifests = self.static_manifests()
        self.sync_etcd(manifests.get("etcd.yaml"))
        api_up = self.sync_apiserver(manifests.get("kube-apiserver.yaml"))
        try:
            pods = self.client.get(f"/api/v1/pods?fieldSelector=spec.nodeName={self.node_name}"
                                   )["items"]
        except (Unreachable, TLSError) as e:
            klog("E", f'"Unable to register node with API server" err="Post \\"'
                 f'{self.creds.server}/api/v1/nodes\\": dial tcp {e}" node="{self.node_name}"',
                 "kubelet_node_status.go:108")
            return
        # pods the API marked for deletion (a DaemonSet's, off a node it no longer selects):
        # stopped here, then deleted below, once nothing on the node counts them any more
        terminating = [p for p in pods if p["metadata"].get("deletionTimestamp")]
        pods = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        node = self.sync_node(pods)   # one read of the node a sync, as it was posted
        self.sync_mirror_pods(manifests, pods, api_up)
        cfg = nodeinfo.containerd_config()
        self.pod_cidr = node.get("spec", {}).get("podCIDR")
        avail = {k: int(parse_quantity(v)) for k, v in
                 (node["status"].get("allocatable") or {}).items() if is_device_resource(k)}
        daemons.sync(self, pods)
        live = {p["metadata"]["uid"] for p in pods}
        for uid in list(self.gpu_assign):   # pods gone from the API free their devices
            if uid not in live:             # before any new pod is admitted
                del self.gpu_assign[uid]
        for p in pods:   # the devices of terminated pods are free again, and a restarted
            uid = p["metadata"]["uid"]   # kubelet takes its allocations from its checkpoint
            if p.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                self.gpu_assign.pop(uid, None)
            elif uid not in self.gpu_assign and (held := realpods.checkpointed_gpus(uid)):
                self.gpu_assign[uid] = held
        used: dict[str, int] = {}
        for p in pods:
            if "kubernetes.io/config.mirror" in (p["metadata"].get("annotations") or {}):
                running = p["metadata"]["name"] != f"kube-apiserver-{self.node_name}" or api_up
                self.set_status(p, "Running" if running else "Pending",
                                {c["name"]: {"running": {"startedAt": ts()}} if running else
                                 {"waiting": {"reason": "CrashLoopBackOff"}}
                                 for c in p["spec"].get("containers") or []}, running)
                continue
            for name, n in self.sync_pod(p, cfg, avail, used).items():
                used[name] = used.get(name, 0) + n
        self.note_gpu_clients(pods)
        for p in terminating:
            md = p["metadata"]
            with contextlib.suppress(ApiError):
                self.client.request("DELETE", f"/api/v1/namespaces/{md['namespace']}/pods/"
                                    f"{md['name']}")
        for uid in list(self.started):
            if uid not in live:
                del self.started[uid]
                self.posted.pop(uid, None)
        # pods gone from the API: their runners (also those of an earlier kubelet) stop
        runners = os.listdir(P(realpods.STATE_DIR)) if os.path.isdir(P(realpods.STATE_DIR)) \
            else []
        for uid in runners:
            if uid not in live:
                realpods.stop(uid)
        logs = P("/var/log/pods")
        for entry in os.listdir(logs) if os.path.isdir(logs) else []:
            if entry.rsplit("_", 1)[-1] not in live:
                shutil.rmtree(os.path.join(logs, entry), ignore_errors=True)

    # -------------------------------------------------------------- servers
    def serve(self) -> None:
        kubelet = self

        class Health(http.server.BaseHTTPRequestHandler):
            disable_nagle_algorithm = True  # as Go's servers: no 40 ms delayed-ACK stalls

            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:
                code, body, ctype = kubelet.http_get(self.path)
                data = body.encode() if isinstance(body, str) else body
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        addr = self.cfg.get("healthzBindAddress", "127.0.0.1")
        port = int(self.cfg.get("healthzPort", 10248))
        hs = http.server.ThreadingHTTPServer((addr, port), Health)
        threading.Thread(target=hs.serve_forever, daemon=True).start()
        crt, key = "/var/lib/kubelet/pki/kubelet.crt", "/var/lib/kubelet/pki/kubelet.key"
        if not os.path.exists(P(crt)):
            pki.gen_ca(crt, key, f"{self.node_name}-ca@{int(time.time())}", days=365)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(P(crt), P(key))
        ks = http.server.ThreadingHTTPServer(("0.0.0.0", int(self.cfg.get("port", 10250))),
                                             Health)
        ks.socket = ctx.wrap_socket(ks.socket, server_side=True)
        threading.Thread(target=ks.serve_forever, daemon=True).start()

    def http_get(self, path: str) -> tuple[int, str | bytes, str]:
        if path.startswith("/healthz"):
            return 200, "ok", "text/plain"
        if path.startswith("/configz"):
            cfg = dict(self.cfg)
            cfg["featureGates"] = self.gates
            return 200, json.dumps({"kubeletconfig": cfg}), "application/json"
        if path.startswith("/containerLogs/"):
            import urllib.parse

            query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
            parts = path.split("?")[0].split("/")[2:]
            if len(parts) == 3:
                ns, pod, container = parts
                for d in os.listdir(P("/var/log/pods")) if os.path.isdir(P("/var/log/pods")) \
                        else []:
                    if d.startswith(f"{ns}_{pod}_"):
                        # the current (last) run of the container: <restart count>.log
                        folder = P(f"/var/log/pods/{d}/{container}")
                        runs = sorted((int(f[:-4]) for f in os.listdir(folder)
                                       if f[:-4].isdigit() and f.endswith(".log")),
                                      reverse=True) if os.path.isdir(folder) else []
                        previous = (query.get("previous") or [""])[0] == "true"
                        if previous and len(runs) < 2:
                            return 400, (f'previous terminated container "{container}" in pod '
                                         f'"{pod}" not found'), "text/plain"
                        run = runs[1] if previous else (runs[0] if runs else None)
                        data = nodeinfo.read_abs(f"{folder}/{run}.log") if run is not None \
                            else None
                        if data is not None:
                            return 200, _trim_log(data, query), "text/plain"
            return 404, "container not found", "text/plain"
        if path.startswith("/exec/"):
            return self.exec_in(path)
        return 404, "404 page not found", "text/plain"

    def exec_in(self, path: str) -> tuple[int, str | bytes, str]:
        """GET /exec/<ns>/<pod>/<container>?command=...: run the command in the container's
        running task (`ctr task exec`, no stdin, no tty) and answer its output and exit code as
        JSON (stdout/stderr base64); the API server streams them to the client."""
        import base64
        import urllib.parse

        u = urllib.parse.urlsplit(path)
        parts = u.path.split("/")[2:]
        argv = urllib.parse.parse_qs(u.query).get("command") or []
        if len(parts) != 3 or not argv:
            return 400, "exec needs /exec/<namespace>/<pod>/<container>?command=...", \
                "text/plain"
        ns, pod, container = (urllib.parse.unquote(x) for x in parts)
        try:
            obj = self.client.get(f"/api/v1/namespaces/{ns}/pods/{pod}")
        except ApiError:
            return 404, f'pod "{pod}" not found', "text/plain"
        uid = obj["metadata"]["uid"]
        prefix = f"{container}-{uid[:8]}-"
        ls = subprocess.run(["ctr", "-n", "k8s.io", "task", "ls"], capture_output=True,
                            text=True, timeout=30)
        running = sorted((line.split()[0] for line in ls.stdout.splitlines()[1:]
                          if line.startswith(prefix) and "RUNNING" in line),
                         key=lambda t: int(t.rsplit("-", 1)[1]))
        if not running:
            return 400, f'container "{container}" in pod "{pod}" is not running', "text/plain"
        exec_id = f"exec-{os.urandom(4).hex()}"
        try:
            r = subprocess.run(["ctr", "-n", "k8s.io", "task", "exec", "--exec-id", exec_id,
                                running[-1], *argv], capture_output=True, timeout=300,
                               stdin=subprocess.DEVNULL)
            code, out, err = r.returncode, r.stdout, r.stderr
        except subprocess.TimeoutExpired as e:
            code, out, err = 124, e.stdout or b"", (e.stderr or b"") + b"timed out after 300s\n"
        if code != 0 and b"executable file not found" in err:
            # what the real runtime reports for a missing command (kubectl prints it)
            return 200, json.dumps({"error": f"OCI runtime exec failed: exec failed: unable to "
                                    f"start container process: exec: \"{argv[0]}\": "
                                    f"executable file not found in $PATH: unknown"}), \
                "application/json"
        return 200, json.dumps({"stdout": base64.b64encode(out).decode(),
                                "stderr": base64.b64encode(err).decode(),
                                "exitCode": code}), "application/json"

    def watch_pods(self) -> None:
        """Wake the sync loop as soon as one of this node's pods changes, as the real kubelet
        learns of its pods from a watch (its pod config's API source), instead of leaving a
        new pod waiting out the rest of STATUS_PERIOD."""
        follow(self.client, f"/api/v1/pods?watch=true&timeoutSeconds={WATCH_SECONDS}"
               "&fieldSelector=" + urllib.parse.quote(f"spec.nodeName={self.node_name}"),
               WATCH_SECONDS, self.wake)

    def run(self) -> None:
        self.serve()
        klog("I", '"Started kubelet"', "server.go:180")
        threading.Thread(target=self.watch_pods, daemon=True, name="pod-watch").start()
        while True:
            self.wake.clear()  # a change from here on brings the next sync forward
            try:
                self.sync()
            except (ApiError, Unreachable, TLSError, OSError) as e:
                klog("E", f'"Error syncing" err="{e}"')
            time.sleep(MIN_SYNC_GAP)
            self.wake.wait(STATUS_PERIOD - MIN_SYNC_GAP)


def _trim_log(data: str, query: dict[str, list[str]]) -> str:
    """kubectl logs --tail=N (tailLines) and --limit-bytes (limitBytes), done by the kubelet
    as the real one does: the client prints what it gets."""
    tail = (query.get("tailLines") or [""])[0]
    if tail.lstrip("-").isdigit() and int(tail) >= 0:
        lines = data.splitlines(keepends=True)
        data = "".join(lines[-int(tail):]) if int(tail) else ""
    limit = (query.get("limitBytes") or [""])[0]
    if limit.isdigit():
        data = data.encode()[:int(limit)].decode(errors="ignore")
    return data


def main(argv: list[str], version_raw: str) -> int:
    version = package_version(version_raw)
    if "--version" in argv or any(a.startswith("--version=") for a in argv):
        print(f"Kubernetes {git_version(version)}")
        return 0
    Kubelet(argv, version).run()
    return 0
