# LAB STAND-IN: not NVIDIA's DRA driver for GPUs, nor the real kubelet. Test infrastructure for
# gpuk8s; never shipped to users.
"""The node's part of Dynamic Resource Allocation: NVIDIA's DRA kubelet plugin (image
`registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu`, v0.4.0), EMULATED by the kubelet
stand-in (the lab has neither the image nor NVML), and the kubelet's DRA manager.

What is upstream's (kubernetes-sigs/dra-driver-nvidia-gpu v0.4.0, cmd/gpu-kubelet-plugin, and
the k8s.io/dynamic-resource-allocation 0.36 it vendors):
- one ResourceSlice per node for driver gpu.nvidia.com, pool = the node name, generation 1,
  resourceSliceCount 1, named `00000-gpu.nvidia.com-<node>-` + 5 random characters, owned by
  the Node (controller);
- a whole GPU is `gpu-<minor>` with the attributes type "gpu", uuid, productName, brand
  (go-nvlib: "Nvidia" for nvidia-smi's "NVIDIA"), architecture, the versions
  cudaComputeCapability, driverVersion, cudaDriverVersion (semver, "580.159.04" ->
  "580.159.4", "13.0" -> "13.0.0") and resource.kubernetes.io/pciBusID ("0000:00:06.0"), and
  the capacity memory (bytes as a binary quantity: "81559Mi");
- a GPU with MIG enabled offers its MIG devices instead (static MIG): `gpu-<minor>-mig-
  <profile without dots, '+' as '-'>-<GI profile ID>-<placement start>`, type "mig", uuid,
  parentUUID, profile and the parent's attributes; capacity multiprocessors, copyEngines,
  decoders, encoders, jpegEngines, ofaEngines, memory and memorySlice<N> = 1 per slice;
- the plugin's ResourceSlice controller (vendored k8s.io/dynamic-resource-allocation
  resourceslice/resourceslicecontroller.go@v0.4.0) lists, creates, updates and deletes its
  node's slices as the plugin's ServiceAccount (its pod's projected token), and a refused call
  is logged ("processing ResourceSlice objects", `create resource slice: <error>`) and tried
  again; the plugin writes nothing else (no Node, no claim status, no events);
- the devices are enumerated when the plugin starts (MIG devices made later are published
  after a restart); the kubelet wipes a driver's slices 30 s after the driver became unusable,
  and at its own start, and prepares a pod's claims before its sandbox: `Failed to prepare
  dynamic resources: prepare dynamic resources: ...` (FailedPrepareDynamicResources) when a
  claim is missing, not reserved for the pod or its driver is not registered; the container
  then gets the allocated devices through CDI (NVIDIA_VISIBLE_DEVICES=void, whatever the
  runtime handler; none when containerd's enable_cdi is off).

What is the lab's: facts come from the node's GPU view (gpuview.View.detailed: the nvidia-smi
stand-in's `--query-gpu`, `-q`, `-L`, `mig -lgi/-lci/-lgip`), not NVML; "registered" = the
plugin pod runs on the node and nvidia-smi answers (the real plugin exits when NVML cannot
initialise); the plugin's token is a TokenRequest bound to its pod (as the kubelet's projected
volume asks for one), written where the kubelet writes it, /var/lib/kubelet/pods/<pod
uid>/volumes/kubernetes.io~projected/<the pod's kube-api-access-* volume, admission's>/token,
renewed at 80% of its hour; the kubelet's own wipes use the kubelet's credentials; no pcieRoot
attribute (the lab's PCI folder has no sysfs links); the MIG memory comes from -lgip's GiB; the
plugin's log is clearly labelled lab text; devices reach the container as the device plugin's do
(podrun, labgpu.VISIBLE_ENV), for every container of the pod.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import time
from typing import Any

from . import gpuview, nodeinfo
from .client import ApiError
from .common import API_ACCESS_PREFIX, P, api_access_volume, write

Obj = dict[str, Any]
DRIVER = "gpu.nvidia.com"
IMAGE = "dra-driver-nvidia-gpu"
WIPE_DELAY = 30.0
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
BRANDS = {"NVIDIA": "Nvidia", "NVIDIA RTX": "NvidiaRTX", "GeForce RTX": "GeForce"}
PREFIX = "prepare dynamic resources: "
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PODS_DIR = "/var/lib/kubelet/pods"
PROJECTED = "volumes/kubernetes.io~projected"
#: the kubelet's token manager renews a projected token at 80% of its lifetime (3607 s)
TOKEN_RENEW = 0.8 * 3607


# ------------------------------------------------------------------ the node's GPUs -> devices
def semver(text: str) -> str:
    """Masterminds semver's String() of a NVML version ("580.159.04" -> "580.159.4")."""
    parts = [int(p) for p in re.findall(r"\d+", text)[:3]]
    return ".".join(str(p) for p in parts + [0] * (3 - len(parts)))


def binary_quantity(n: int) -> str:
    """resource.NewQuantity(n, BinarySI).String(): the largest binary suffix dividing n."""
    for exp, suffix in ((6, "Ei"), (5, "Pi"), (4, "Ti"), (3, "Gi"), (2, "Mi"), (1, "Ki")):
        if n and n % (1024 ** exp) == 0:
            return f"{n // 1024 ** exp}{suffix}"
    return str(n)


def pci_bus_id(nvsmi: str) -> str:
    """go-nvlib's GetPCIBusID: lower case, the 8-digit domain cut to 4 ("0000:00:06.0")."""
    bus = nvsmi.strip().lower()
    return bus[4:] if bus.startswith("0000") and len(bus.split(":")[0]) == 8 else bus


def _attrs(gpu: gpuview.Gpu, cuda: str) -> Obj:
    return {"productName": {"string": gpu.name},
            "brand": {"string": BRANDS.get(gpu.brand, gpu.brand)},
            "architecture": {"string": gpu.architecture},
            "cudaComputeCapability": {"version": semver(gpu.compute_cap)},
            "driverVersion": {"version": semver(gpu.driver_version)},
            "cudaDriverVersion": {"version": semver(cuda)},
            PCI_BUS_ID: {"string": pci_bus_id(gpu.bus_id)}}


def build_devices(gpus: list[gpuview.Gpu], cuda: str) -> list[Obj]:
    """The plugin's devices, by name, from the node's GPUs (gpuview.View.detailed)."""
    out = []
    for gpu in gpus:
        minor = gpu.minor if gpu.minor is not None else gpu.index
        if gpu.mig_mode != "Enabled":
            out.append({"name": f"gpu-{minor}", "attributes": {
                "type": {"string": "gpu"}, "uuid": {"string": gpu.uuid},
                **_attrs(gpu, cuda)}, "capacity": {"memory": {
                    "value": binary_quantity(gpu.memory_mib * 1024 * 1024)}}})
            continue
        for dev in gpu.migs:
            if not dev.placed or len(dev.engines) != 7:
                continue  # nvidia-smi's views disagree: the device is left out
            mem, sm, dec, enc, ce, jpeg, ofa = dev.engines
            pname = re.sub(r"[^a-z0-9-]", "-", dev.profile.lower().replace(".", "")).strip("-")
            cap = {"multiprocessors": sm, "copyEngines": ce, "decoders": dec, "encoders": enc,
                   "jpegEngines": jpeg, "ofaEngines": ofa,
                   "memory": binary_quantity(round(mem * 1024) * 1024 * 1024)}
            capacity = {k: {"value": str(v)} for k, v in cap.items()}
            for i in range(dev.start, dev.start + dev.size):
                capacity[f"memorySlice{i}"] = {"value": "1"}
            out.append({"name": f"gpu-{minor}-mig-{pname}-{dev.profile_id}-{dev.start}",
                        "attributes": {"type": {"string": "mig"}, "uuid": {"string": dev.uuid},
                                       "parentUUID": {"string": gpu.uuid},
                                       "profile": {"string": dev.profile},
                                       **_attrs(gpu, cuda)},
                        "capacity": capacity})
    return sorted(out, key=lambda d: [int(x) if x.isdigit() else x
                                      for x in re.split(r"(\d+)", d["name"])])


def slice_body(node: str, node_uid: str, devices: list[Obj]) -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {
        "generateName": f"00000-{DRIVER}-{node}-",
        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node,
                             "uid": node_uid, "controller": True}]},
        "spec": {"driver": DRIVER, "nodeName": node, "devices": devices,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}}


def node_devices() -> tuple[list[Obj] | None, str]:
    """This node's devices as the plugin finds them; (None, why) when NVML cannot start."""
    gpus, cuda, why = gpuview.View().detailed()
    return (None, why) if gpus is None else (build_devices(gpus, cuda), "")


# ------------------------------------------------------------------ the kubelet's side
class Plugin:
    """One kubelet's view of the DRA driver on its node."""

    def __init__(self) -> None:
        self.registered = False
        self.unusable_since: float | None = None
        self.wiped_at_start = False
        self.devices: list[Obj] = []
        self.pod_uid = ""  # the plugin pod whose start enumerated self.devices
        self.logged = ""
        #: the plugin's API as its ServiceAccount (programs.Api), for pod api_pod, since api_at
        self.api: Any = None
        self.api_pod = ""
        self.api_at = 0.0


_PLUGINS: dict[int, Plugin] = {}


def plugin(kubelet: Any) -> Plugin:
    return _PLUGINS.setdefault(id(kubelet), Plugin())


def _plugin_pod(pods: list[Obj]) -> Obj | None:
    return next((p for p in pods if (p.get("status") or {}).get("phase") == "Running" and any(
        IMAGE in (c.get("image") or "") for c in p["spec"].get("containers") or [])), None)


def _log(kubelet: Any, pod: Obj, state: Plugin, line: str) -> None:
    if state.logged == line:
        return
    state.logged = line
    name = next((c["name"] for c in pod["spec"].get("containers") or []
                 if IMAGE in (c.get("image") or "")), "")
    try:
        with open(P(kubelet.log_path(pod, name)), "a") as f:
            f.write(f"LAB STAND-IN gpu-kubelet-plugin: {line}\n")
    except OSError:
        pass


def _slices(kubelet: Any) -> list[Obj]:
    path = f"{SLICES}?fieldSelector=spec.nodeName%3D{kubelet.node_name}"
    items = kubelet.client.get(path).get("items") or []
    return [s for s in items if (s.get("spec") or {}).get("driver") == DRIVER]


def _wipe(kubelet: Any, slices: list[Obj]) -> None:
    """The kubelet's own wipe of the driver's slices, with the kubelet's credentials."""
    for s in slices:
        with contextlib.suppress(ApiError):
            kubelet.client.request("DELETE", f"{SLICES}/{s['metadata']['name']}")


def token_dir(pod_uid: str, pod: Obj | None = None) -> str:
    """Where the kubelet writes the plugin pod's projected ServiceAccount token (a node path):
    the folder of the pod's kube-api-access-* volume, which the API server's ServiceAccount
    admission added to it; without one in ``pod``, the name that admission gives a pod of
    this uid (common.api_access_volume: random upstream, derived from the uid here)."""
    name = next((v["name"] for v in ((pod or {}).get("spec") or {}).get("volumes") or []
                 if str(v.get("name", "")).startswith(API_ACCESS_PREFIX)), None)
    return f"{PODS_DIR}/{pod_uid}/{PROJECTED}/{name or api_access_volume(pod_uid)}"


def _forget_tokens(state: Plugin, pods: list[Obj]) -> None:
    """The plugin pod is gone: its token volume goes with its pod folder."""
    live = {p["metadata"]["uid"] for p in pods}
    if state.api_pod and state.api_pod not in live:
        shutil.rmtree(P(f"{PODS_DIR}/{state.api_pod}"), ignore_errors=True)
        state.api, state.api_pod = None, ""


def plugin_api(kubelet: Any, pod: Obj, state: Plugin) -> Any:
    """The plugin's API as its ServiceAccount: a token bound to its pod (kubelet.pod_api, a
    TokenRequest), written to the pod's projected volume, renewed as the kubelet renews it.
    None when the kubelet cannot get one."""
    uid = pod["metadata"]["uid"]
    if state.api is None or state.api_pod != uid or \
            time.monotonic() - state.api_at >= TOKEN_RENEW:
        api = kubelet.pod_api(pod)
        if api is None:
            return None
        if state.api_pod and state.api_pod != uid:
            shutil.rmtree(P(f"{PODS_DIR}/{state.api_pod}"), ignore_errors=True)
        state.api, state.api_pod, state.api_at = api, uid, time.monotonic()
        write(f"{token_dir(uid, pod)}/token", api.client.creds.token, 0o644)
    return state.api


def _publish(kubelet: Any, pod: Obj, state: Plugin, devices: list[Obj]) -> None:
    """The plugin's ResourceSlice controller: its node's one slice holds ``devices``, written
    as the plugin's ServiceAccount; a refused call is logged and tried at the next sync."""
    api = plugin_api(kubelet, pod, state)
    if api is None:
        _log(kubelet, pod, state, "processing ResourceSlice objects: no ServiceAccount token "
             "(the kubelet's TokenRequest failed)")
        return
    node = kubelet.node_name
    code, got = api.call("GET", f"{SLICES}?fieldSelector=spec.driver%3D{DRIVER}%2C"
                         f"spec.nodeName%3D{node}")
    if code != 200:
        return _refused(kubelet, pod, state, "retrieve ResourceSlice objects", got)
    slices = [s for s in got.get("items") or [] if (s.get("spec") or {}).get("driver") == DRIVER]
    if len(slices) == 1 and slices[0]["spec"].get("devices") == devices:
        return None
    for extra in slices[1:]:
        code, got = api.call("DELETE", f"{SLICES}/{extra['metadata']['name']}")
        if code not in (200, 404):
            return _refused(kubelet, pod, state, "remove slices", got)
    if slices:
        body = slices[0]
        body["spec"]["devices"] = devices
        code, got = api.call("PUT", f"{SLICES}/{body['metadata']['name']}", body)
        return _refused(kubelet, pod, state, "update resource slice", got) if code != 200 \
            else None
    code, me = api.call("GET", f"/api/v1/nodes/{node}")
    if code != 200:
        return _refused(kubelet, pod, state, f'retrieve node "{node}"', me)
    code, got = api.call("POST", SLICES, slice_body(node, me["metadata"]["uid"], devices))
    return _refused(kubelet, pod, state, "create resource slice", got) if code != 200 else None


def _refused(kubelet: Any, pod: Obj, state: Plugin, what: str, body: Obj) -> None:
    """resourceslicecontroller.go processNextWorkItem: the error goes to the driver's
    HandleError (cmd/gpu-kubelet-plugin/driver.go@v0.4.0: logged), the pool is retried."""
    _log(kubelet, pod, state, f'processing ResourceSlice objects: {what}: '
         f'{body.get("message", "the API server refused the request")}')


def sync(kubelet: Any, pods: list[Obj]) -> None:
    """Each kubelet sync: the emulated plugin publishes this node's ResourceSlice while it runs.
    As the real one it enumerates the devices when it starts (a new plugin pod), not later: MIG
    devices made while it runs are published once it is restarted. NVML (nvidia-smi) failing,
    it exits and is restarted (here: tried again each sync), unregistered; the kubelet wipes the
    slice WIPE_DELAY after the driver became unusable."""
    state = plugin(kubelet)
    try:
        slices = _slices(kubelet)
    except ApiError:
        return  # resource.k8s.io not served (Kubernetes < 1.34) or the API is away
    if not state.wiped_at_start:  # the kubelet wipes its node's slices when it starts
        _wipe(kubelet, slices)
        slices, state.wiped_at_start = [], True
    _forget_tokens(state, pods)
    pod = _plugin_pod(pods)
    started = kubelet.programs.get((pod["metadata"]["uid"], "gpus")) if pod else None
    if pod is None or (started is not None and started[0].state != "ok"):
        # no plugin pod, or its container exits at start (programs.dra_gpu_plugin: a required
        # flag missing, its API calls refused): nothing registers with the kubelet
        state.registered, state.pod_uid = False, ""
    elif not state.registered or pod["metadata"]["uid"] != state.pod_uid:
        devices, why = node_devices()
        if devices is None or not gpuview.pci_gpus():
            _log(kubelet, pod, state, f"NVML cannot start ({why or 'no NVIDIA GPU'}): the "
                 "plugin exits and is restarted; not registered with the kubelet")
            state.registered = False
        else:
            state.registered, state.devices = True, devices
            state.pod_uid, state.unusable_since = pod["metadata"]["uid"], None
            _log(kubelet, pod, state, f"registered with the kubelet; publishing "
                 f"{len(devices)} device(s): {', '.join(d['name'] for d in devices)}")
    if not state.registered:
        state.unusable_since = state.unusable_since or time.monotonic()
        if slices and time.monotonic() - state.unusable_since >= WIPE_DELAY:
            _wipe(kubelet, slices)
        return
    if slices and slices[0]["spec"].get("devices") == state.devices and len(slices) == 1:
        return
    assert pod is not None
    _publish(kubelet, pod, state, state.devices)


def prepare(kubelet: Any, pod: Obj) -> str | None:
    """The kubelet's PrepareDynamicResources for a pod with claims: the allocated devices'
    UUIDs go to kubelet.gpu_assign (as the device plugin's do); else the event message."""
    from . import dra

    md = pod["metadata"]
    state = plugin(kubelet)
    uuids: list[str] = []
    for pc in pod["spec"].get("resourceClaims") or []:
        name, from_template, err = dra.claim_name(pod, pc)
        if err:
            return PREFIX + err
        if name is None:
            continue
        try:
            claim = kubelet.client.get(f"/apis/resource.k8s.io/v1/namespaces/"
                                       f"{md['namespace']}/resourceclaims/{name}")
        except ApiError as e:
            return PREFIX + f"fetch ResourceClaim {name}: {e}"
        if from_template and not dra.owned_by(claim, pod):
            return PREFIX + dra.not_owner(claim, pod)
        st = claim.get("status") or {}
        if not any(r.get("uid") == md["uid"] for r in st.get("reservedFor") or []):
            return PREFIX + (f"pod {md['name']} ({md['uid']}) is not allowed to use "
                             f"ResourceClaim {name} ({claim['metadata'].get('uid')})")
        results = ((st.get("allocation") or {}).get("devices") or {}).get("results") or []
        for r in results:
            if r.get("driver") != DRIVER:
                return PREFIX + f"DRA driver {r.get('driver')} is not registered"
            if not state.registered:
                return PREFIX + f"DRA driver {DRIVER} is not registered"
            dev = next((d for d in state.devices if d["name"] == r.get("device")), None)
            if dev is None or r.get("pool") != kubelet.node_name:
                return PREFIX + (f"NodePrepareResources failed for ResourceClaim {name}: "
                                 f"error preparing devices for claim {md['namespace']}/{name}:"
                                 f"{claim['metadata'].get('uid')}: LAB STAND-IN: device "
                                 f"{r.get('pool')}/{r.get('device')} is not on this node")
            uuids.append(dev["attributes"]["uuid"]["string"])
    if uuids:
        kubelet.gpu_assign[md["uid"]] = sorted(set(uuids))
    return None


def cdi_enabled(cfg: Obj) -> bool:
    """containerd's CRI `enable_cdi` (default on in containerd 2.x's config version 3, off in
    1.7's version 2)."""
    plugins = cfg.get("plugins") or {}
    if "io.containerd.cri.v1.runtime" in plugins:
        return bool((plugins["io.containerd.cri.v1.runtime"] or {}).get("enable_cdi", True))
    return bool((plugins.get("io.containerd.grpc.v1.cri") or {}).get("enable_cdi", False))


def cdi(kubelet: Any, pod: Obj, spec: Obj, cfg: Obj | None = None) -> None:
    """podrun's spec of a pod whose claims were prepared: the devices come through CDI
    (whatever the runtime handler), with NVIDIA_VISIBLE_DEVICES=void as NVIDIA's CDI spec;
    with CDI off in containerd the CRI ignores the CDI devices: the containers get none."""
    if not pod["spec"].get("resourceClaims") or not spec.get("gpus"):
        return
    if cdi_enabled(nodeinfo.containerd_config() if cfg is None else cfg):
        spec["gpuRuntime"], spec["cdi"] = True, True
    else:
        spec["gpus"], spec["gpuRuntime"] = [], False
