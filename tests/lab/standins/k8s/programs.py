# LAB STAND-IN: not the real calico-node, kube-controllers or NVIDIA plugins. Test infrastructure
# for gpuk8s; never shipped to users.
"""What the system daemons the lab cannot run do against the API server, with their pod's
ServiceAccount token, at the tags gpuk8s pins, and how they fail.

The kubelet stand-in runs a pod's program when it starts the pod (and again after each
CrashLoopBackOff pause while it fails): the program checks the flags, environment and
capabilities upstream requires, then makes upstream's start-up API calls as the pod's
ServiceAccount (a TokenRequest bound to the pod, as the kubelet's projected token volume does).
Its Outcome says whether the container exits (CrashLoopBackOff, with upstream's log lines),
runs but is never Ready, or runs Ready. The sources, per program, are in tests/lab/CONTRACT.md
("Emulated programs").
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

from .client import ApiError, Client

Obj = dict[str, Any]
CRD = "/apis/crd.projectcalico.org/v1"


@dataclass
class Outcome:
    """``state``: "ok" (running and Ready), "unready" (running, readiness fails) or "crash"
    (the container exits with ``exit_code``); ``log``: what the container printed."""

    state: str = "ok"
    log: list[str] = field(default_factory=list)
    exit_code: int = 0


class Api:
    """The pod's API calls: (code, body) per request, 403s kept as the real client shows them."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def call(self, method: str, path: str, body: Any = None,
             content_type: str = "application/json") -> tuple[int, Obj]:
        try:
            got = (self.client.request(method, path, body) if method != "PATCH" else
                   self.client.request(method, path, body, content_type))
            return 200, got if isinstance(got, dict) else {}
        except ApiError as e:
            return e.code, e.body


def env_of(container: Obj) -> dict[str, str]:
    out: dict[str, str] = {}
    for e in container.get("env") or []:
        if "value" in e:
            out[e["name"]] = str(e["value"])
        elif e.get("valueFrom"):
            out[e["name"]] = "<from " + next(iter(e["valueFrom"])) + ">"
    return out


def has_sys_admin(container: Obj) -> bool:
    sc = container.get("securityContext") or {}
    return sc.get("privileged") is True or \
        "SYS_ADMIN" in ((sc.get("capabilities") or {}).get("add") or [])


# ------------------------------------------------------------------ Calico v3.32.1
def _clog(level: str, src: str, msg: str) -> str:
    """libcalico-go/lib/logutils/logutils.go@v3.32.1: '<date> <time> [LEVEL][pid] <file> <line>:
    <msg> <fields>'."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return f"{now} [{level}][9] {src}: {msg}"


def _unauthorized(body: Obj) -> str:
    """K8sErrorToCalico (libcalico-go/lib/backend/k8s/resources/errors.go@v3.32.1)."""
    return f"connection is unauthorized: {body.get('message', 'Forbidden')}"


def calico_node(api: Api, pod: Obj, container: Obj, node: str) -> Outcome:
    """calico-node -startup (node/pkg/lifecycle/startup/startup.go@v3.32.1), then Felix's
    syncer lists (libcalico-go/lib/backend/syncersv1/felixsyncer/felixsyncerv1.go@v3.32.1)."""
    env = env_of(container)
    out = Outcome()
    log = out.log.append
    log(_clog("INFO", "startup/startup.go 120", "Early log level set to info"))
    for method, path in (("GET", f"/api/v1/nodes/{node}"),
                         ("GET", f"{CRD}/blockaffinities"),
                         ("GET", "/api/v1/nodes")):
        code, body = api.call(method, path)
        if code == 403:
            log(_clog("ERROR", "startup/startup.go 150", f"Unable to query node "
                      f"configuration error={_unauthorized(body)}"))
            return _terminate(out)
    code, me = api.call("GET", f"/api/v1/nodes/{node}")
    if code == 200:  # CreateOrUpdate -> Nodes().UpdateStatus (PUT nodes/<name>/status)
        code, body = api.call("PUT", f"/api/v1/nodes/{node}/status", me)
        if code == 403:
            log(_clog("ERROR", "startup/startup.go 221", "Unable to set node resource "
                      f"configuration error={_unauthorized(body)}"))
            return _terminate(out)
    cidr = env.get("CALICO_IPV4POOL_CIDR", "192.168.0.0/16")
    code, body = api.call("GET", f"{CRD}/ippools")
    if code == 200 and not body.get("items"):
        code, body = api.call("POST", f"{CRD}/ippools", {
            "apiVersion": "crd.projectcalico.org/v1", "kind": "IPPool",
            "metadata": {"name": "default-ipv4-ippool"},
            "spec": {"cidr": cidr, "blockSize": int(env.get("CALICO_IPV4POOL_BLOCK_SIZE", 26)),
                     "vxlanMode": env.get("CALICO_IPV4POOL_VXLAN", "Never"),
                     "ipipMode": env.get("CALICO_IPV4POOL_IPIP", "Always"),
                     "natOutgoing": True, "nodeSelector": "all()"}})
    if code == 403:
        log(_clog("ERROR", "startup/startup.go 1129", "Failed to create default IPv4 IP pool "
                  f"error={_unauthorized(body)}"))
        return _terminate(out)
    # EnsureInitialized (libcalico-go/lib/clientv3/client.go@v3.32.1 284-323)
    code, body = _get_or_create(api, "clusterinformations", "ClusterInformation", {
        "calicoVersion": "v3.32.1", "clusterType": "k8s,kubeadm", "datastoreReady": True})
    if code == 403:
        log(_clog("ERROR", "startup/startup.go 1259", "Unable to initialize global Calico "
                  f"resources error={_unauthorized(body)}"))
        return _terminate(out)
    for tier in ("default", "kube-admin", "kube-baseline"):
        code, body = api.call("POST", f"{CRD}/tiers", {
            "apiVersion": "crd.projectcalico.org/v1", "kind": "Tier",
            "metadata": {"name": tier}, "spec": {}})
        if code == 403:  # client.go 473: a warning, start-up goes on
            log(_clog("WARNING", "startup/client.go 473", f"Unauthorized to create tier "
                      f"{tier}. error={_unauthorized(body)}"))
    code, body = _get_or_create(api, "felixconfigurations", "FelixConfiguration",
                                {"bpfLogLevel": "", "vxlanVNI": 4096})
    if code == 403:
        log(_clog("ERROR", "startup/startup.go 1277", "Unable to set default felix "
                  f"configuration error={_unauthorized(body)}"))
        return _terminate(out)
    # ensureDefaultBGPConfigExists (startup.go 1367-1392): since v3.32.0
    code, body = _get_or_create(api, "bgpconfigurations", "BGPConfiguration",
                                {"logSeverityScreen": "Info", "nodeToNodeMeshEnabled": True})
    if code not in (200, 409):
        err = _unauthorized(body) if code == 403 else body.get("message", f"HTTP {code}")
        log(_clog("ERROR", "startup/startup.go 1387", "Error creating default "
                  f"BGPConfiguration. error={err}"))
        log(_clog("ERROR", "startup/startup.go 233", "Unable to set global default "
                  f"configuration error={err}"))
        return _terminate(out)
    log(_clog("INFO", "startup/startup.go 238", "Startup complete"))
    return felix(api, out)


def _get_or_create(api: Api, plural: str, kind: str, spec: Obj) -> tuple[int, Obj]:
    """Calico's "default" object of a kind: read, and created when it is not there."""
    code, body = api.call("GET", f"{CRD}/{plural}/default")
    if code == 404:
        code, body = api.call("POST", f"{CRD}/{plural}", {
            "apiVersion": "crd.projectcalico.org/v1", "kind": kind,
            "metadata": {"name": "default"}, "spec": spec})
    return code, body


def _terminate(out: Outcome) -> Outcome:
    """utils.Terminate (node/pkg/lifecycle/utils/utils.go@v3.32.1 46-48), and rc.local's
    `calico-node -startup || exit 1`: the container exits 1."""
    out.log.append(_clog("WARNING", "startup/utils.go 47", "Terminating"))
    out.log.append("Calico node failed to start")
    out.state, out.exit_code = "crash", 1
    return out


#: what Felix's syncer lists in a Kubernetes-datastore cluster (felixsyncerv1.go@v3.32.1):
#: (ResourceType as Felix logs it, list path)
FELIX_LISTS = (
    ("ClusterInformation", f"{CRD}/clusterinformations"),
    ("FelixConfiguration", f"{CRD}/felixconfigurations"),
    ("GlobalNetworkPolicy", f"{CRD}/globalnetworkpolicies"),
    ("StagedGlobalNetworkPolicy", f"{CRD}/stagedglobalnetworkpolicies"),
    ("NetworkPolicy", f"{CRD}/networkpolicies"),
    ("StagedNetworkPolicy", f"{CRD}/stagednetworkpolicies"),
    ("StagedKubernetesNetworkPolicy", f"{CRD}/stagedkubernetesnetworkpolicies"),
    ("Tier", f"{CRD}/tiers"),
    ("GlobalNetworkSet", f"{CRD}/globalnetworksets"),
    ("NetworkSet", f"{CRD}/networksets"),
    ("HostEndpoint", f"{CRD}/hostendpoints"),
    ("IPPool", f"{CRD}/ippools"),
    ("KubernetesNetworkPolicy", "/apis/networking.k8s.io/v1/networkpolicies"),
    ("ClusterNetworkPolicy", "/apis/policy.networking.k8s.io/v1alpha2/clusternetworkpolicies"),
    ("KubeVirtLiveMigration",
     "/apis/kubevirt.io/v1/virtualmachineinstancemigrations"),
    ("Profile", "/api/v1/namespaces"),
    ("Profile", "/api/v1/serviceaccounts"),
    ("WorkloadEndpoint", "/api/v1/pods"),
    ("KubernetesEndpointSlice", "/apis/discovery.k8s.io/v1/endpointslices"),
    ("KubernetesService", "/api/v1/services"),
)


def felix(api: Api, out: Outcome) -> Outcome:
    """Felix is Ready once every list of its syncer succeeded; only a 404 counts as "not
    installed", a 403 is retried every second for ever (watchercache.go@v3.32.1) and Felix's
    /readiness answers 503."""
    for rtype, path in FELIX_LISTS:
        code, body = api.call("GET", path)
        if code not in (200, 404):
            out.log.append(_clog("INFO", "felix/watchercache.go 194", "Failed to perform list "
                                 "of current data during resync ResourceType=" + rtype +
                                 " error=" + (_unauthorized(body) if code == 403 else
                                              body.get("message", f"HTTP {code}"))))
            out.log.append("calico/node is not ready: felix is not ready: readiness probe "
                           "reporting 503")
            out.state = "unready"
            return out
    return out


def calico_kube_controllers(api: Api, pod: Obj, container: Obj, node: str) -> Outcome:
    """kube-controllers/pkg/config/runconfig.go@v3.32.1: the KubeControllersConfiguration
    "default" (get, create) and its status (UpdateStatus); a failure is retried every second
    and no controller starts. Its readiness check still answers Ready (upstream's behaviour)."""
    out = Outcome()
    path = f"{CRD}/kubecontrollersconfigurations"
    code, body = _get_or_create(api, "kubecontrollersconfigurations",
                                "KubeControllersConfiguration",
                                {"controllers": {"node": {"reconcilerPeriod": "5m"}}})
    if code == 403:
        out.log.append(_clog("WARNING", "kube-controllers/runconfig.go 193", "unable to list "
                             f"KubeControllersConfiguration(default) error="
                             f"{_unauthorized(body)}"))
        return out
    if code == 200:
        body = {**body, "status": {"runningConfig": body.get("spec") or {}}}
        code, got = api.call("PUT", f"{path}/default/status", body)
        if code not in (200, 409):
            err = _unauthorized(got) if code == 403 else got.get("message", f"HTTP {code}")
            out.log.append(_clog("WARNING", "kube-controllers/runconfig.go 221", "unable to "
                                 f"perform status update on KubeControllersConfiguration"
                                 f"(default) error={err}"))
            return out
    out.log.append(_clog("INFO", "kube-controllers/main.go 251", "Started the controllers"))
    return out


# ------------------------------------------------------------------ flannel v0.28.9
def _klog(level: str, src: str, msg: str) -> str:
    now = dt.datetime.now(dt.UTC)
    return f"{level}{now:%m%d %H:%M:%S.%f}       1 {src}] {msg}"


FLANNEL_KEYS = ("flannel.alpha.coreos.com/backend-data", "flannel.alpha.coreos.com/backend-type",
                "flannel.alpha.coreos.com/kube-subnet-manager",
                "flannel.alpha.coreos.com/public-ip")


def flanneld(api: Api, pod: Obj, container: Obj, node: str) -> Outcome:
    """flanneld --kube-subnet-mgr (pkg/subnet/kube/kube.go, main.go@v0.28.9): its own pod (for
    spec.nodeName), every node (its informer), its own node, then its lease as annotations
    PATCHed on nodes/<n>/status (only when they differ) and the NetworkUnavailable=False
    condition. A refused pod get exits at once; a refused node list retries and exits after
    10 minutes (here: at once); a refused lease patch exits after 30 s (here: at once); a
    refused condition patch is only logged."""
    out = Outcome()
    md = pod["metadata"]
    code, body = api.call("GET", f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}")
    if code == 403:
        out.log.append(_klog("E", "main.go:251", "Failed to create SubnetManager: error "
                             f"retrieving pod spec for '{md['namespace']}/{md['name']}': "
                             f"{body.get('message', 'Forbidden')}"))
        out.state, out.exit_code = "crash", 1
        return out
    code, body = api.call("GET", "/api/v1/nodes?limit=500&resourceVersion=0")
    if code == 403:
        out.log += [
            _klog("E", "reflector.go:200", '"Failed to watch" err="failed to list *v1.Node: '
                  + body.get("message", "Forbidden").replace('"', '\\"')
                  + '" logger="UnhandledError" reflector="pkg/subnet/kube/kube.go:538" '
                  'type="*v1.Node"'),
            _klog("E", "main.go:251", "Failed to create SubnetManager: error waiting for "
                  "nodeController to sync state: context deadline exceeded")]
        out.state, out.exit_code = "crash", 1
        return out
    code, me = api.call("GET", f"/api/v1/nodes/{node}")
    if code != 200:
        out.log.append(_klog("E", "kube.go:738", "Failed to get node for backend data: "
                             + me.get("message", f"HTTP {code}")))
        me = {}
    if not (me.get("spec") or {}).get("podCIDR"):
        out.log.append(_klog("E", "main.go:384", "Error registering network: failed to acquire "
                             f'lease: node "{node}" pod cidr not assigned'))
        out.state, out.exit_code = "crash", 1
        return out
    ip = next((a["address"] for a in (me.get("status") or {}).get("addresses") or []
               if a.get("type") == "InternalIP"), "")
    have = (me.get("metadata") or {}).get("annotations") or {}
    mac = "aa:" + ":".join(hashlib.sha256(node.encode()).hexdigest()[i:i + 2]
                           for i in range(0, 10, 2))
    want = dict(zip(FLANNEL_KEYS, (json.dumps({"VNI": 1, "VtepMAC": mac},
                                              separators=(",", ":")), "vxlan", "true", ip),
                    strict=True))
    changed = {k: v for k, v in want.items() if have.get(k) != v}
    if changed:
        code, body = api.call("PATCH", f"/api/v1/nodes/{node}/status",
                              {"metadata": {"annotations": changed}},
                              "application/strategic-merge-patch+json")
        if code == 403:
            out.log.append(_klog("E", "main.go:384", "Error registering network: failed to "
                                 "acquire lease: timeout contacting kube-api, failed to patch "
                                 f'node "{node}". Error: context deadline exceeded'))
            out.state, out.exit_code = "crash", 1
            return out
    code, body = api.call("PATCH", f"/api/v1/nodes/{node}/status", {"status": {"conditions": [
        {"type": "NetworkUnavailable", "status": "False", "reason": "FlannelIsUp",
         "message": "Flannel is running on this node"}]}},
        "application/strategic-merge-patch+json")
    if code == 403:
        out.log.append(_klog("E", "main.go:502", "CompleteLease execute error err: "
                             + body.get("message", "Forbidden")))
    out.log.append(_klog("I", "main.go:520", "Wrote subnet file to /run/flannel/subnet.env"))
    return out


# ------------------------------------------------------------------ NVIDIA DRA driver v0.4.0
DRA_FLAGS = (("node-name", "NODE_NAME"), ("image-name", "IMAGE_NAME"))


def dra_gpu_plugin(api: Api, pod: Obj, container: Obj, node: str) -> Outcome:
    """gpu-kubelet-plugin (cmd/gpu-kubelet-plugin/main.go@v0.4.0): --node-name and
    --image-name are Required (urfave/cli v2.27.7 prints the help, then 'Required flag(s) ...
    not set', exit 1); then it reads its own Node and lists its ResourceSlices."""
    out = Outcome()
    env = env_of(container)
    args = " ".join(container.get("args") or [])
    missing = [flag for flag, var in DRA_FLAGS if not env.get(var) and f"--{flag}" not in args]
    if missing:
        out.log += ["NAME:", "   gpu-kubelet-plugin - gpu-kubelet-plugin implements the "
                    "GPU kubelet plugin for the NVIDIA DRA driver", "",
                    "USAGE:", "   gpu-kubelet-plugin [global options]", ""]
        words = ", ".join(missing)
        out.log.append(f'Error: Required flag{"s" if len(missing) > 1 else ""} "{words}" '
                       "not set")
        out.state, out.exit_code = "crash", 1
        return out
    for path in (f"/api/v1/nodes/{node}", "/apis/resource.k8s.io/v1/resourceslices?"
                 f"fieldSelector=spec.driver%3Dgpu.nvidia.com%2Cspec.nodeName%3D{node}"):
        code, body = api.call("GET", path)
        if code == 403:
            out.log.append(f'E1126 00:00:00.000000       1 main.go:80] "Error" err="'
                           f'{body.get("message", "Forbidden")}"')
            out.state, out.exit_code = "crash", 1
            return out
    return out


# ------------------------------------------------------------------ device plugin v0.20.0
def device_plugin_mig_ok(container: Obj, toolkit_version: str) -> bool:
    """Whether the plugin can read MIG devices' memory: NVIDIA_MIG_MONITOR_DEVICES=all with
    CAP_SYS_ADMIN (the chart's pair: _helpers.tpl, daemonset-device-plugin.yml@v0.20.0), which
    toolkit 1.20.0's default jit-cdi mode does not honour (only its legacy hook reads the
    variable; NVIDIA/nvidia-container-toolkit PR #1947 came after v1.20.0), or privileged."""
    sc = container.get("securityContext") or {}
    if sc.get("privileged") is True:
        return True
    env = env_of(container)
    newer = tuple(int(x) for x in (toolkit_version.split("-")[0].split(".") + ["0"] * 3)[:3]
                  if x.isdigit()) > (1, 20, 0)
    return has_sys_admin(container) and env.get("NVIDIA_MIG_MONITOR_DEVICES") == "all" and newer


def device_list_strategies(container: Obj) -> list[str]:
    """--device-list-strategy / DEVICE_LIST_STRATEGY (cmd/nvidia-device-plugin/main.go@v0.20.0;
    default envvar). The per-node config file's flags.plugin.deviceListStrategy is not read:
    gpuk8s's configs do not set it, and the env wins over the file (api/config/v1/flags.go
    UpdateFromCLIFlags)."""
    args = [str(a) for a in (container.get("command") or [])[1:] + (container.get("args") or [])]
    value = env_of(container).get("DEVICE_LIST_STRATEGY", "envvar")
    for i, a in enumerate(args):
        if a.startswith("--device-list-strategy="):
            value = a.partition("=")[2]
        elif a == "--device-list-strategy" and i + 1 < len(args):
            value = args[i + 1]
    return [v.strip() for v in value.split(",") if v.strip()]


def device_plugin_allocation(container: Obj | None, ids: list[str]) -> Obj:
    """The plugin's ContainerAllocateResponse for devices ``ids`` (internal/plugin/
    server.go@v0.20.0 getAllocateResponse): envvar -> NVIDIA_VISIBLE_DEVICES=<ids>;
    volume-mounts -> NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices and a /dev/null
    mount at /var/run/nvidia-container-devices/<id> per device (updateResponseForDeviceMounts).
    The cdi-* strategies are not played (gpuk8s does not use them)."""
    strategies = device_list_strategies(container or {})
    envs: dict[str, str] = {}
    mounts: list[Obj] = []
    if "envvar" in strategies:
        envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
    if "volume-mounts" in strategies:
        envs["NVIDIA_VISIBLE_DEVICES"] = "/var/run/nvidia-container-devices"
        mounts = [{"hostPath": "/dev/null",
                   "containerPath": f"/var/run/nvidia-container-devices/{i}"} for i in ids]
    return {"envs": envs, "mounts": mounts}


def device_plugin_sees_gpus(container: Obj, toolkit_config: str | None) -> bool:
    """Whether the toolkit gives the plugin's container its node's GPUs: it asks for them with
    its image's NVIDIA_VISIBLE_DEVICES=all (deployments/container/Dockerfile@v0.20.0), which
    the toolkit honours in a container with CAP_SYS_ADMIN, or in any with
    accept-nvidia-visible-devices-envvar-when-unprivileged (default true)
    (internal/config/image/cuda_image.go@v1.20.0 VisibleDevices)."""
    from .podrun import toolkit_settings

    return has_sys_admin(container) or toolkit_settings(toolkit_config)[0]


DEVICE_PLUGIN_MIG_ERROR = (
    'E1126 00:00:00.000000       1 main.go:177] error starting plugins: unable to add default '
    "resources to config: error visiting devices: error visiting device: error visiting device: "
    "error getting device memory info: Insufficient Permissions")


def backoff(restarts: int) -> float:
    """CrashLoopBackOff's pause before the next start: 10 s doubling (the real kubelet's cap is
    5 min; the lab's is GPUK8S_LAB_BACKOFF_MAX, 20 s, so that a fixed manifest is picked up
    within a test's patience)."""
    cap = float(os.environ.get("GPUK8S_LAB_BACKOFF_MAX", "20"))
    return float(min(cap, 10 * 2 ** max(restarts - 1, 0)))
