"""Facts about containerd and the Kubernetes cluster as seen from a node."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from gpuk8s.errors import FactError
from gpuk8s.facts import Fact, Source

ADMIN_CONF = "/etc/kubernetes/admin.conf"
#: kubeadm's static pods that take --feature-gates (etcd does not)
GATED_COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
MANIFESTS = "/etc/kubernetes/manifests"
KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"


@dataclass(frozen=True)
class ContainerdState:
    version: str = ""                 # "2.1.4" or "" when not installed
    cri_disabled: bool = False
    systemd_cgroup: bool | None = None
    runtimes: tuple[str, ...] = ()
    default_runtime: str = ""
    sandbox_image: str = ""
    config_error: str = ""


_VERSION_RE = re.compile(r"containerd\s+\S+\s+v?(\d+\.\d+\.\d+)")


def parse_config_dump(dump: str) -> dict[str, Any]:
    """The few keys we need from ``containerd config dump`` (TOML, v2 or v3 layout)."""
    import tomllib

    data = tomllib.loads(dump)
    plugins = data.get("plugins", {})
    out: dict[str, Any] = {"disabled": data.get("disabled_plugins", [])}
    runtime = plugins.get("io.containerd.cri.v1.runtime") or \
        plugins.get("io.containerd.grpc.v1.cri", {})
    ctrd = runtime.get("containerd", {})
    runtimes = ctrd.get("runtimes", {})
    out["runtimes"] = tuple(sorted(runtimes))
    out["default_runtime"] = ctrd.get("default_runtime_name", "")
    out["systemd_cgroup"] = runtimes.get("runc", {}).get("options", {}).get("SystemdCgroup")
    images = plugins.get("io.containerd.cri.v1.images", {})
    out["sandbox"] = images.get("pinned_images", {}).get("sandbox", "") or \
        plugins.get("io.containerd.grpc.v1.cri", {}).get("sandbox_image", "")
    return out


class Containerd(Fact[ContainerdState]):
    """containerd's version and the effective config (imports merged) it would run with."""

    def command(self) -> str:
        return """if command -v containerd >/dev/null 2>&1; then containerd --version
echo '## dump'; containerd config dump 2>&1; fi; true"""

    def parse(self, output: str, exit_code: int) -> ContainerdState:
        head, _, dump = output.partition("## dump\n")
        m = _VERSION_RE.search(head)
        if not m:
            return ContainerdState()
        try:
            cfg = parse_config_dump(dump)
        except Exception as exc:
            return ContainerdState(m.group(1), config_error=str(exc).splitlines()[0])
        disabled = cfg["disabled"]
        return ContainerdState(
            m.group(1),
            cri_disabled=any(p in ("cri", "io.containerd.grpc.v1.cri") for p in disabled),
            systemd_cgroup=cfg["systemd_cgroup"], runtimes=cfg["runtimes"],
            default_runtime=cfg["default_runtime"], sandbox_image=cfg["sandbox"])


@dataclass(frozen=True)
class NodeStatus:
    name: str
    ready: bool
    unschedulable: bool
    kubelet_version: str
    runtime_version: str
    gpu_allocatable: int | None
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[str, ...] = ()
    ready_message: str = ""
    #: allocatable NVIDIA resources (nvidia.com/gpu, nvidia.com/mig-3g.40gb, ...) -> count
    nvidia: dict[str, int] = field(default_factory=dict)
    #: why `invoke accept` quarantined the node (its annotation), "" when it did not
    gpu_unhealthy: str = ""
    #: joined cordoned by add-node, waiting for `accept --quick` to pass (accept_on_add)
    accept_pending: bool = False
    #: gpuk8s cordoned the node (CORDONED_BY): release may uncordon it
    cordoned_by_accept: bool = False
    #: capacity nvidia.com/gpu: above the allocatable count, the device plugin found GPUs
    #: unhealthy (its health checks take them out of allocatable)
    gpu_capacity: int | None = None


@dataclass(frozen=True)
class ClusterState:
    """The cluster seen with admin.conf on a control plane (empty before kubeadm init)."""

    reachable: bool = False
    error: str = ""
    nodes: dict[str, NodeStatus] = field(default_factory=dict)
    #: applied gpuk8s objects: "kind/namespace/name" -> sha256 annotation
    managed: dict[str, str] = field(default_factory=dict)


#: the kinds gpuk8s applies that the Cluster fact reads back: kind -> kubectl's resource name
#: (ops/kube.py stamp refuses any kind applied that neither this nor the Dra fact reads)
MANAGED_RESOURCES = {
    "Namespace": "namespaces", "ServiceAccount": "serviceaccounts", "ConfigMap": "configmaps",
    "Service": "services", "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings", "DaemonSet": "daemonsets",
    "Deployment": "deployments", "RuntimeClass": "runtimeclasses",
    "CustomResourceDefinition": "customresourcedefinitions",
    "ResourceQuota": "resourcequotas", "LimitRange": "limitranges",
    "RoleBinding": "rolebindings",
}
#: what the Cluster fact's `kubectl get` lists
MANAGED_KINDS = ",".join(MANAGED_RESOURCES.values())
#: the DRA kinds gpuk8s applies, which the Dra fact reads back: kind -> kubectl's resource name
DRA_RESOURCES = {"DeviceClass": "deviceclasses",
                 "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
                 "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings"}


#: the taint key and label of a node whose GPUs failed (`invoke accept`, gpu_health_watch)
GPU_UNHEALTHY = "gpuk8s.io/gpu-unhealthy"
#: the annotation `invoke accept` writes on a node it quarantines: the failed checks
GPU_UNHEALTHY_REASON = "gpuk8s.io/gpu-unhealthy-reason"
GPU_UNHEALTHY_SINCE = "gpuk8s.io/gpu-unhealthy-since"
#: the annotation a GPU worker add-node joined cordoned carries until accept admits it
ACCEPT_PENDING = "gpuk8s.io/accept-pending"
#: the annotation that says gpuk8s cordoned the node for accept (release and admission uncordon
#: only such a node)
CORDONED_BY = "gpuk8s.io/cordoned-by"
#: CORDONED_BY's value when gpuk8s cordoned the node for accept or the Xid watch
CORDONED_BY_ACCEPT = "gpuk8s-accept"


def parse_nodes(data: dict[str, Any]) -> dict[str, NodeStatus]:
    nodes = {}
    for item in data.get("items", []):
        meta, spec, status = item.get("metadata", {}), item.get("spec", {}), item.get("status", {})
        ready: dict[str, Any] = next(
            (c for c in status.get("conditions", []) if c.get("type") == "Ready"), {})
        gpu = status.get("allocatable", {}).get("nvidia.com/gpu")
        info = status.get("nodeInfo", {})
        nodes[meta["name"]] = NodeStatus(
            meta["name"], ready.get("status") == "True", bool(spec.get("unschedulable")),
            info.get("kubeletVersion", ""), info.get("containerRuntimeVersion", ""),
            int(gpu) if gpu is not None else None, dict(meta.get("labels", {})),
            tuple(f"{t['key']}:{t.get('effect', '')}" for t in spec.get("taints", [])),
            ready.get("message", ""),
            {k: int(v) for k, v in status.get("allocatable", {}).items()
             if k.startswith("nvidia.com/") and str(v).isdigit()},
            str(meta.get("annotations", {}).get(GPU_UNHEALTHY_REASON, "")),
            meta.get("annotations", {}).get(ACCEPT_PENDING) == "true",
            meta.get("annotations", {}).get(CORDONED_BY) == CORDONED_BY_ACCEPT,
            _count(status.get("capacity", {}).get("nvidia.com/gpu")))
    return nodes


def _count(value: Any) -> int | None:
    return int(value) if str(value).isdigit() else None


#: seconds the cluster read may take before it counts as "the API does not answer"
CLUSTER_WAIT = 15


def _kube_reads() -> dict[str, str]:
    """The kubectl reads the facts share, by name: kubectl's arguments after ``get``."""
    return {"nodes": "nodes -o json",
            "managed": f"{MANAGED_KINDS} -A -l app.kubernetes.io/managed-by=gpuk8s -o json",
            "dra_classes": f"{','.join(DRA_RESOURCES.values())} -o json",
            "dra_slices": "resourceslices -o json"}


class KubeReads(Source):
    """The kubectl reads of a probe's cluster facts (args: names from _kube_reads), all side
    by side, with admin.conf: one round for the Cluster fact and the Dra fact together, in the
    background of the rest of a probe (start, then command collects). Each
    read leaves its output in $_gk_k_<name>, its exit code in $_gk_k_<name>_rc and the last
    three lines of its stderr in $_gk_k_<name>_err (with, when it timed out, that the API
    server did not answer). Without admin.conf or kubectl (or a temporary folder for the
    outputs) nothing runs and each exit code is "absent"."""

    def _names(self) -> list[str]:
        reads = _kube_reads()
        return [n for n in self.args if n in reads]

    def start(self) -> str:
        # the reads go on in the background while the rest of the probe runs (on a no-op run
        # they are most of the control plane's probe); command() collects them
        reads = _kube_reads()
        launch = "\n".join(f"  $_gk_k get {reads[n]} >\"$_gk_d/{n}\" 2>\"$_gk_d/{n}.e\" "
                           f"</dev/null & _gk_p_{n}=$!" for n in self._names())
        return f"""unset _gk_kr_on
if [ -f {ADMIN_CONF} ] && command -v kubectl >/dev/null 2>&1 && \\
  _gk_d=$(mktemp -d); then
  # the reads' outputs (managed objects) never stay behind a probe that dies before its end
  trap 'rm -rf "$_gk_d"' EXIT
  # kubectl retries a refused or cut connection (discovery included) well past its request
  # timeout; timeout bounds the whole read when no API server answers (no etcd quorum)
  _gk_k="timeout {CLUSTER_WAIT} kubectl --kubeconfig {ADMIN_CONF} --request-timeout=10s"
{launch}
  _gk_kr_on=1
fi"""

    def command(self) -> str:
        names = self._names()
        wait = "\n".join(f"  wait $_gk_p_{n}; _gk_k_{n}_rc=$?" for n in names)
        keep = "\n".join(
            f"  [ $_gk_k_{n}_rc -eq 124 ] && echo \"$_gk_late\" >>\"$_gk_d/{n}.e\"\n"
            f"  _gk_k_{n}=$(cat \"$_gk_d/{n}\"); _gk_k_{n}_err=$(tail -n 3 \"$_gk_d/{n}.e\")"
            for n in names)
        absent = "; ".join(f"_gk_k_{n}=; _gk_k_{n}_rc=absent" for n in names) or ":"
        return f"""if [ -n "${{_gk_kr_on+x}}" ]; then
  _gk_late="the API server did not answer within {CLUSTER_WAIT}s"
{wait}
{keep}
  rm -rf "$_gk_d"
else {absent}; fi"""

    def ready(self) -> str:
        return " && ".join(f'[ -n "${{_gk_k_{n}_rc+x}}" ]' for n in self.args) or "true"


class Cluster(Fact[ClusterState]):
    """Nodes and gpuk8s-managed objects, read with kubectl and admin.conf (the two reads run
    side by side, with the Dra fact's when it is asked too: on a no-op run this fact is most
    of the control plane's probe)."""

    def sources(self) -> tuple[Source, ...]:
        return (KubeReads("nodes", "managed"),)

    def command(self) -> str:
        return f"""[ -f {ADMIN_CONF} ] && command -v kubectl >/dev/null 2>&1 || exit 0
{self.sources()[0].ensure()}
[ "$_gk_k_nodes_rc" = 0 ] || {{ [ -z "$_gk_k_nodes_err" ] || printf '%s\\n' "$_gk_k_nodes_err"
  exit 3; }}
[ "$_gk_k_managed_rc" = 0 ] || {{
  [ -z "$_gk_k_managed_err" ] || printf '%s\\n' "$_gk_k_managed_err"; exit 4; }}
printf '%s\\n' "$_gk_k_nodes"; echo '## managed'; printf '%s\\n' "$_gk_k_managed"
"""

    def parse(self, output: str, exit_code: int) -> ClusterState:
        if exit_code == 0 and not output.strip():
            return ClusterState()
        if exit_code != 0:
            return ClusterState(False, output.strip().splitlines()[-1] if output.strip() else
                                f"kubectl exited {exit_code}")
        nodes_text, _, managed_text = output.partition("## managed\n")
        managed = {}
        decoder = json.JSONDecoder()
        try:
            for item in decoder.raw_decode(managed_text.strip())[0].get("items", []):
                meta = item.get("metadata", {})
                key = f"{item.get('kind')}/{meta.get('namespace', '')}/{meta.get('name')}"
                managed[key] = meta.get("annotations", {}).get("gpuk8s.io/sha256", "")
            nodes = parse_nodes(decoder.raw_decode(nodes_text.strip())[0])
        except (AttributeError, TypeError) as exc:  # JSON, but not the shape kubectl gives
            raise FactError(f"kubectl returned JSON of an unexpected shape: {exc}") from None
        return ClusterState(True, "", nodes, managed)


@dataclass(frozen=True)
class GateState:
    """The feature gates a node runs with, read from kubeadm's files (not the inventory)."""

    #: static pod -> the gates of its --feature-gates flag; absent: no such manifest here
    components: dict[str, dict[str, bool]] = field(default_factory=dict)
    #: featureGates of /var/lib/kubelet/config.yaml; None: the file does not exist (not joined)
    kubelet: dict[str, bool] | None = None


_GATE = re.compile(r"([A-Za-z][A-Za-z0-9]*)=(true|false)", re.IGNORECASE)


def parse_gate_flag(value: str) -> dict[str, bool]:
    """``A=true,B=false`` -> {A: True, B: False}; FactError on anything else."""
    gates = {}
    for item in filter(None, value.split(",")):
        m = _GATE.fullmatch(item.strip())
        if not m:
            raise FactError(f"unreadable --feature-gates entry {item[:80]!r}")
        gates[m.group(1)] = m.group(2).lower() == "true"
    return dict(sorted(gates.items()))


class FeatureGates(Fact[GateState]):
    """--feature-gates of the control plane's static pod manifests and featureGates of the
    kubelet's config, as kubeadm wrote them."""

    def command(self) -> str:
        return f"""for c in {' '.join(GATED_COMPONENTS)}; do
  f={MANIFESTS}/$c.yaml; [ -f "$f" ] || continue
  echo "## $c"; grep -o -e '--feature-gates=[A-Za-z0-9=,]*' "$f" | head -n 1
done
if [ -f {KUBELET_CONFIG} ]; then
  echo '## kubelet'
  awk '/^featureGates:/ {{p=1; print; next}} p && /^[[:space:]]/ {{print; next}} {{p=0}}' \\
    {KUBELET_CONFIG} | head -n 500
fi
true"""

    def parse(self, output: str, exit_code: int) -> GateState:
        import yaml

        sections: dict[str, list[str]] = {}
        current = None
        for line in output.splitlines():
            if line.startswith("## "):
                current = line[3:].strip()
                sections[current] = []
            elif current is not None:
                sections[current].append(line)
        components = {}
        for name in GATED_COMPONENTS:
            if name in sections:
                flag = "".join(sections[name]).strip()
                components[name] = parse_gate_flag(flag.split("=", 1)[1] if flag else "")
        kubelet = None
        if "kubelet" in sections:
            try:
                block = yaml.safe_load("\n".join(sections["kubelet"])) or {}
            except yaml.YAMLError:
                raise FactError(f"{KUBELET_CONFIG}: featureGates is not YAML") from None
            raw = block.get("featureGates") if isinstance(block, dict) else None
            if raw is not None and not (isinstance(raw, dict) and all(
                    isinstance(k, str) and isinstance(v, bool) for k, v in raw.items())):
                raise FactError(f"{KUBELET_CONFIG}: featureGates is not a map of names to "
                                "true/false")
            kubelet = dict(sorted((raw or {}).items()))
        return GateState(components, kubelet)


#: containerd's registry host configuration (config_path): one folder per registry
CERTS_D = "/etc/containerd/certs.d"
#: the first line of every hosts.toml gpuk8s writes
HOSTS_MARKER = "# managed by gpuk8s (role container_runtime)"
_REGISTRY_DIR = re.compile(r"_default|[a-z0-9][a-z0-9.-]*(:[0-9]{1,5})?")


class ManagedRegistryHosts(Fact[tuple[str, ...]]):
    """The registries whose hosts.toml under /etc/containerd/certs.d gpuk8s wrote (first line
    is its marker); folders with other names or without the marker are never listed."""

    def command(self) -> str:
        return f"""for f in {CERTS_D}/*/hosts.toml; do
  [ -f "$f" ] && head -n 1 "$f" | grep -qxF '{HOSTS_MARKER}' && printf '%s\\n' "$f"
done; true"""

    def parse(self, output: str, exit_code: int) -> tuple[str, ...]:
        found = []
        for line in output.splitlines():
            head, _, name = line.removesuffix("/hosts.toml").rpartition("/")
            if head == CERTS_D and _REGISTRY_DIR.fullmatch(name):
                found.append(name)
        return tuple(sorted(found))


def api_check_url(url: str) -> str:
    """Where a mirror's registry API answers its version check: ``<url>/v2/``, or for a
    mirror URL with a path (the API root itself, containerd's override_path: a Harbor
    project, a serve-bundle registry's ``/v2/<registry>``) the server's own ``/v2/``."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    if parts.path.strip("/"):
        return f"{parts.scheme}://{parts.netloc}/v2/"
    return url.rstrip("/") + "/v2/"


class RegistryAnswers(Fact[dict[str, tuple[int, str]]]):
    """Whether a registry's API answers at each URL: url -> (HTTP status of GET <url>/v2/, the
    curl error when none came: "" on an answer, "no curl" when curl is missing). The certificate
    is not checked here (a mirror's own CA reaches the node with bootstrap); 5 s per URL."""

    def command(self) -> str:
        from gpuk8s.sinks import shell

        if not self.args:
            return "true"
        lines = ["command -v curl >/dev/null 2>&1 || { echo 'NOCURL'; exit 0; }"]
        for url in self.args:
            target = shell(api_check_url(url))
            lines.append(f"c=$(curl -sk -o /dev/null -w '%{{http_code}}' --max-time 5 {target} "
                         f"2>&1); echo \"R $? $c\"")
        return "\n".join(lines)

    def parse(self, output: str, exit_code: int) -> dict[str, tuple[int, str]]:
        lines = output.splitlines()
        if lines[:1] == ["NOCURL"]:
            return {url: (0, "no curl") for url in self.args}
        answers: dict[str, tuple[int, str]] = {}
        results = [ln.split(" ", 2) for ln in lines if ln.startswith("R ")]
        for url, parts in zip(self.args, results, strict=False):
            rc, code = parts[1], (parts[2] if len(parts) > 2 else "")
            status = int(code) if code.isdigit() else 0
            answers[url] = (status, "" if rc == "0" and status else
                            _CURL_ERRORS.get(rc, f"curl exit {rc}"))
        return answers


#: curl's exit codes a mirror check meets (curl(1), EXIT CODES)
_CURL_ERRORS = {"6": "could not resolve the host", "7": "connection refused or no route",
                "28": "timed out after 5 s", "35": "TLS handshake failed",
                "52": "empty reply", "56": "connection reset"}
