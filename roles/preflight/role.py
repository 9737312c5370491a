"""preflight: check every host before anything changes; problems stop the run."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from typing import Any

from gpuk8s import mig
from gpuk8s.checks import LAB_KEY_FINGERPRINT, LAB_SUBNET, Rule, check_str_list
from gpuk8s.facts import Fact
from gpuk8s.facts.controlplane import Reaches
from gpuk8s.facts.kube import Containerd, RegistryAnswers, api_check_url
from gpuk8s.facts.nvidia import Nvidia
from gpuk8s.facts.system import (
    OS_RELEASE_IDS,
    KernelModules,
    OsRelease,
    PciDevices,
    System,
    SystemInfo,
)
from gpuk8s.gpusharing import sharing_of
from gpuk8s.ops import Op
from gpuk8s.ops import registry as reg
from gpuk8s.roles import HostContext, PreflightExports, Problem, Problems
from gpuk8s.sinks import node_name_problem
from roles.base.role import MODULES

SUPPORTED_OS = {("ubuntu", "22.04"), ("ubuntu", "24.04"), ("debian", "12")}
CONTROL_PLANE_PORTS = (6443, 2379, 2380, 10250, 10257, 10259)
WORKER_PORTS = (10250,)

#: checks whose failure makes a run unsafe, not just unwise: preflight_ignore cannot lift them
NEVER_IGNORED = {"hostname", "init", "gpu_sharing", "lab_signing_key"}
#: checks whose failure leaves nothing to plan for the host: `plan` stops at them too, instead
#: of listing steps (enable kubelet, modprobe ...) that cannot run there
UNPLANNABLE = frozenset({"hostname", "init", "gpu_sharing", "lab_signing_key"})
#: kernel modules the node needs: the base role's, which it persists and loads
NEEDED_MODULES: tuple[str, ...] = MODULES
_LOOPBACK = ("localhost", "localhost.localdomain", "ip6-localhost", "::1")


#: a rule that needs only the inventory: the host's variables, groups and the inventory's
#: cluster values (ctx.facts is empty where `gpuk8s check` runs it)
InventoryRule = Callable[[HostContext], list[Problem]]
#: every such rule, in the order they report: preflight runs them on each host, and
#: `gpuk8s check` runs the same ones before any host is contacted (register with
#: @inventory_rule; tests/unit/test_check.py fails on a vars-only rule left out)
INVENTORY_RULES: list[InventoryRule] = []


def inventory_rule(rule: InventoryRule) -> InventoryRule:
    INVENTORY_RULES.append(rule)
    return rule


#: this role's variables beyond their type (their defaults are in defaults.yaml)
RULES: dict[str, Rule] = {
    "preflight_ignore": Rule(check_str_list),
}


def _mirror_urls(vars: Mapping[str, Any]) -> dict[str, list[str]]:
    """mirror URL -> the registries it mirrors (registry_mirrors, read as the role does)."""
    urls: dict[str, list[str]] = {}
    for registry, mirrors in reg.mirrors(vars.get("registry_mirrors") or {}).items():
        for m in mirrors:
            urls.setdefault(m.url, []).append(registry)
    return urls


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [OsRelease(), System(), PciDevices(), KernelModules("nouveau"),
            KernelModules(*NEEDED_MODULES), Nvidia(), Containerd(),
            RegistryAnswers(*_mirror_urls(vars)), *_endpoint_facts(vars)]


def _endpoint_facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    """The admin's own endpoint (control_plane_endpoint), checked from every node."""
    endpoint = vars.get("control_plane_endpoint")
    if not endpoint or vars.get("control_plane_endpoint_mode") == "local_lb":
        return []
    return [Reaches(str(endpoint))]


def _endpoint_problems(ctx: HostContext) -> Problems:
    """control_plane_endpoint must resolve on every node; a load balancer that does not answer
    yet is only a warning (its backends are the control planes this run builds)."""
    facts = _endpoint_facts(ctx.vars)
    if not facts:
        return [], []
    endpoint = str(ctx.var("control_plane_endpoint"))
    state = ctx.facts[facts[0]].get(endpoint, "no answer")
    host = endpoint.rpartition(":")[0].strip("[]")
    if state == "unresolved":
        return [("endpoint", f"control_plane_endpoint {endpoint}: {host!r} does not resolve on "
                 "this node", f"add {host} to DNS or to /etc/hosts on every node, or give its "
                 "address")], []
    if state != "ok" and not ctx.cluster.get("joined", {}).get(ctx.host):
        return [], [("endpoint", f"control_plane_endpoint {endpoint} does not answer on TCP "
                     "yet", "fine if your load balancer's backends are the control planes "
                     "this run builds; otherwise check it forwards TCP 6443")]
    return [], []


def _mirror_problems(ctx: HostContext) -> Problems:
    """Every registry mirror answers on this node (any HTTP answer of /v2/: 200, or 401 from a
    registry that wants a login)."""
    errors: list[Problem] = []
    warnings: list[Problem] = []
    urls = _mirror_urls(ctx.vars)
    answers = ctx.facts[RegistryAnswers(*urls)]
    for url, registries in urls.items():
        status, error = answers.get(url, (0, "not checked"))
        of = f"mirror {url} (of {', '.join(registries)})"
        if error == "no curl":
            warnings.append(("registry_mirror", f"{of} not checked: curl is not installed",
                             "install curl, or check by hand: curl -sk URL/v2/"))
        elif error or status not in (200, 401):
            errors.append(("registry_mirror", f"{of} does not answer from this node: "
                           + (error or f"HTTP {status} for {api_check_url(url)}"),
                           f"check the URL, the registry and the network from the node: "
                           f"curl -sk {api_check_url(url)} (it answers 200, or 401 when it "
                           "wants a login)"))
    return errors, warnings


def _host_address(ctx: HostContext) -> str:
    """The host's inventory address (cluster_values records it before preflight runs)."""
    node = (ctx.cluster.get("nodes") or {}).get(ctx.host) or {}
    return str(node.get("address") or ctx.vars.get("ansible_host") or ctx.host)


def lab_key_problems(vars: Mapping[str, Any], address: str) -> list[Problem]:
    """A repo pinned to the gpuk8s lab's signing key, whose private key is public
    (tests/lab/keys/): refused unless the host's inventory ``address`` is in the lab's subnet,
    or the inventory says lab_signing_key_allowed: true. Reads the inventory only (no fact):
    `invoke check` can run it with each host's merged vars and address."""
    # only the pins are read: other values (repo URLs) render from the host's facts
    pins = sorted(name for name in vars if name.endswith("_key_fingerprint")
                  and isinstance(vars[name], str)
                  and "".join(vars[name].split()).upper() == LAB_KEY_FINGERPRINT)
    if not pins or vars.get("lab_signing_key_allowed") is True:
        return []
    try:
        in_lab = ipaddress.ip_address(address.strip("[]")) in LAB_SUBNET
    except ValueError:
        in_lab = False
    if in_lab:
        return []
    return [("lab_signing_key", f"{', '.join(pins)} pin(s) the gpuk8s lab's repo signing key "
             f"{LAB_KEY_FINGERPRINT}, whose private key is public (tests/lab/keys/): anyone "
             f"could sign the packages this host installs as root; {address} is not in the "
             f"lab's subnet {LAB_SUBNET}",
             "pin your own repositories' signing keys (or drop those lines for the upstream "
             "defaults); for a throwaway lab of your own served by tests/lab's repos, set "
             "lab_signing_key_allowed: true")]


@inventory_rule
def _lab_key_rule(ctx: HostContext) -> list[Problem]:
    return lab_key_problems(ctx.vars, _host_address(ctx))


def _init_problems(sysinfo: SystemInfo) -> list[Problem]:
    """The kubelet and containerd run as systemd services: a host whose PID 1 is not systemd
    (a container, a microVM or sandbox started without an init, WSL without systemd) is
    refused, with what it appears to be."""
    if sysinfo.systemd:
        return []
    what = {"wsl": "WSL without systemd", "vm": "a VM started without an init system"}.get(
        sysinfo.virt, f"a {sysinfo.virt} container" if sysinfo.in_container else "")
    if sysinfo.in_container and sysinfo.hypervisor:
        what += " or a VM booted from a container image (the CPU reports a hypervisor)"
    seen = f"; this looks like {what}" if what else ""
    return [("init", f"no systemd (PID 1 is {sysinfo.init}): gpuk8s needs a systemd host"
             f"{seen}", "run gpuk8s against a machine or VM booted with systemd (the kubelet "
             "and containerd run as its services); `invoke facts` and `invoke verify --local` "
             "still work here")]


def _module_problems(sysinfo: SystemInfo, present: Mapping[str, bool]) -> list[Problem]:
    """Each needed module is in the kernel already, or modprobe can load it."""
    missing = [m for m in NEEDED_MODULES if not present.get(m)]
    if not missing or sysinfo.in_container:
        return []  # a container's modules are its host's to load (the base role warns)
    names = ", ".join(missing)
    if not sysinfo.modprobe:
        return [("modules", f"{names} not loaded or built in, and modprobe is not installed",
                 "install kmod (apt-get install kmod), or use a kernel with them built in")]
    if not sysinfo.modules_dir:
        return [("modules", f"{names} not loaded or built in, and /lib/modules/"
                 f"{sysinfo.kernel} is missing, so modprobe has nothing to load",
                 f"install the modules of the running kernel (linux-modules-{sysinfo.kernel} "
                 "on Ubuntu), or boot a kernel that has them")]
    return []


def _headers_problems(ctx: HostContext, sysinfo: SystemInfo) -> list[Problem]:
    """A driver built by DKMS needs the running kernel's headers from some package source,
    unless a driver is already loaded (then gpuk8s leaves it as it is)."""
    nv = ctx.facts.get(Nvidia())
    # headers_candidate "-": the probe found no NVIDIA device waiting for a driver
    if sysinfo.headers or sysinfo.headers_candidate or (nv is not None and nv.loaded_version):
        return []
    return [("kernel_headers", f"no package source has linux-headers-{sysinfo.kernel} (the "
             "running kernel's headers, which the NVIDIA driver's DKMS build needs)",
             "boot your distribution's kernel, install those headers by hand, or install the "
             "NVIDIA driver yourself before bootstrapping (a loaded driver is left as it is)")]


@inventory_rule
def _endpoint_address_problems(ctx: HostContext) -> list[Problem]:
    """With one control plane the API endpoint is its inventory address: a loopback one (a
    local connection to `localhost`) is an endpoint no other node reaches."""
    first = (ctx.cluster.get("control_planes") or [{}])[0].get("host")
    if ctx.host != first or ctx.cluster.get("endpoint_mode") != "direct":
        return []
    address = str(ctx.cluster.get("advertise_address", ""))
    if not _is_loopback(address):
        return []
    return [("endpoint", f"the control plane's address is {address}, so the API endpoint "
             f"would be {address}:6443: loopback, which no other node reaches and the API "
             "server cannot advertise",
             f"give {ctx.host} its LAN address as ansible_host (with ansible_connection: local "
             "gpuk8s still runs its commands locally), or set control_plane_endpoint")]


def _is_loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return address.lower().rstrip(".") in _LOOPBACK
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


def plan(ctx: HostContext) -> list[Op]:
    return []


@inventory_rule
def _sharing_allocation_problems(ctx: HostContext) -> list[Problem]:
    """Time-slicing is the device plugin's: it cannot go with gpu_allocation dra."""
    if sharing_of(ctx.var("gpu_sharing")).mode == "time-slicing" and \
            ctx.var("gpu_allocation") == "dra":
        return [("gpu_sharing", "gpu_sharing time-slicing is a setting of NVIDIA's device "
                 "plugin, and gpu_allocation is dra (no device plugin runs)",
                 "use gpu_sharing: {mode: none} or {mode: mig, ...} with dra, or "
                 "gpu_allocation: device-plugin for time-slicing")]
    return []


@inventory_rule
def _dra_version_problems(ctx: HostContext) -> list[Problem]:
    """DRA's resource.k8s.io/v1 is in Kubernetes 1.34 and newer."""
    k8s_minor = tuple(int(x) for x in str(ctx.var("kubernetes_version")).split(".")[:2])
    if ctx.var("gpu_allocation") == "dra" and k8s_minor < (1, 34):
        return [("gpu_allocation", f"gpu_allocation dra needs Kubernetes 1.34 or newer "
                 f"(resource.k8s.io/v1); kubernetes_version is "
                 f"{ctx.var('kubernetes_version')}", "set kubernetes_version: \"1.36\" "
                 "or gpu_allocation: device-plugin")]
    return []


def _sharing_problems(ctx: HostContext, gpus: list[Any]) -> list[Problem]:
    """A MIG layout this host's GPUs cannot take: refused before any host changes."""
    sharing = sharing_of(ctx.var("gpu_sharing"))
    if sharing.mode != "mig":
        return []
    models = sorted({g.model for g in gpus})
    if len(models) > 1:
        return [("gpu_sharing", f"gpu_sharing mode mig on a host with mixed GPUs "
                 f"({', '.join(models)})", "give this host gpu_sharing: {mode: none} or "
                 "time-slicing")]
    try:
        mig.wanted(sharing.layout_value, models[0], len(gpus))
    except ValueError as exc:
        return [("gpu_sharing", f"gpu_sharing mode mig: {exc}",
                 "use a MIG layout of this GPU's profiles, or gpu_sharing: {mode: "
                 "time-slicing, replicas: 4} to share a GPU without MIG")]
    return []


def check(ctx: HostContext) -> Problems:
    """(errors, warnings) for one host."""
    f = ctx.facts
    os_ = f[OsRelease()]
    sysinfo = f[System()]
    gpus = [d for d in f[PciDevices()] if d.is_gpu]
    errors: list[Problem] = _init_problems(sysinfo)
    errors += _module_problems(sysinfo, f[KernelModules(*NEEDED_MODULES)])
    errors += [p for rule in INVENTORY_RULES for p in rule(ctx)]
    warnings: list[Problem] = []
    os_id, os_ver = os_.get("ID", "?"), os_.get("VERSION_ID", "?")
    invalid = [k for k in OS_RELEASE_IDS if f"{k}_AS_FOUND" in os_]
    if invalid:
        errors.append(("os", "unsupported OS: /etc/os-release " + ", ".join(
            f"{k}={os_[f'{k}_AS_FOUND']!r}" for k in invalid) + " is not an os-release "
            "identifier (only a-z, 0-9, '.', '_' and '-')",
            "use Ubuntu 22.04, Ubuntu 24.04 or Debian 12 with an unmodified /etc/os-release"))
    elif (os_id, os_ver) not in SUPPORTED_OS:
        errors.append(("os", f"{os_.get('PRETTY_NAME', os_id + ' ' + os_ver)} is not supported",
                       "use Ubuntu 22.04, Ubuntu 24.04 or Debian 12"))
    bad_name = node_name_problem(sysinfo.hostname.lower())
    if bad_name:
        errors.append(("hostname", f"hostname {sysinfo.hostname!r} cannot be a Kubernetes node "
                       f"name: {bad_name}", "set a valid hostname on the node "
                       "(hostnamectl set-hostname gpu-01); the kubelet registers under it"))
    if sysinfo.arch not in ("x86_64", "aarch64"):
        errors.append(("arch", f"architecture {sysinfo.arch} is not supported",
                       "use an x86_64 or aarch64 host"))
    is_cp = "control_plane" in ctx.groups
    min_cpus = int(ctx.var("preflight_min_cpus"))
    if is_cp and sysinfo.cpus < min_cpus:
        errors.append(("cpus", f"{sysinfo.cpus} CPU(s); a control plane needs {min_cpus}",
                       "give the host more CPUs or lower preflight_min_cpus"))
    min_mem = int(ctx.var("preflight_min_memory_mb"))
    if sysinfo.memory_mb < min_mem:
        errors.append(("memory", f"{sysinfo.memory_mb} MiB of RAM; needs {min_mem} MiB",
                       "add memory or lower preflight_min_memory_mb"))
    if sysinfo.cgroup != "cgroup2fs":
        problem = ("cgroup", f"cgroup v1 (/sys/fs/cgroup is {sysinfo.cgroup}); kubelet >= 1.35 "
                   "refuses it by default", "boot with systemd.unified_cgroup_hierarchy=1, or set "
                   "kubelet_allow_cgroup_v1: true (kubelet failCgroupV1: false)")
        (warnings if ctx.var("kubelet_allow_cgroup_v1") else errors).append(problem)
    if sysinfo.time_synced not in ("yes", "unknown"):
        warnings.append(("time_sync", "the clock is not NTP-synchronised (certificates and "
                         "tokens are time-sensitive)", "enable systemd-timesyncd or chrony"))
    joined = ctx.cluster.get("joined", {}).get(ctx.host, False)
    if not joined:
        ports = set(CONTROL_PLANE_PORTS if is_cp else WORKER_PORTS)
        if ctx.cluster.get("endpoint_mode") == "local_lb":
            ports.discard(6443)  # the node's own HAProxy (the endpoint) may already hold it
        busy = sorted(ports & set(sysinfo.listening or ()))
        if sysinfo.listening is None:
            warnings.append(("ports", "could not read which ports are in use (no ss, no "
                             "/proc/net/tcp); ports " + ", ".join(map(str, sorted(ports)))
                             + " are not checked", "install iproute2, or check by hand that "
                             "nothing listens there"))
        if busy:
            errors.append(("ports", f"port(s) {', '.join(map(str, busy))} already in use",
                           "stop what listens there (ss -tlnp) before bootstrapping"))
    if ctx.var("gpu_required") and not gpus:
        errors.append(("gpu", "gpu_required is set but no NVIDIA GPU is on the PCI bus",
                       "check the card is seated and enabled in the BIOS, or drop gpu_required"))
    if gpus:
        if "enabled" in sysinfo.secure_boot.lower() and \
                ctx.cluster.get("driver_source", {}).get(ctx.host) == "cuda":
            errors.append(("secure_boot", "Secure Boot is on and the driver would be built by "
                           "DKMS from NVIDIA's repo, unsigned",
                           "use nvidia_driver_source: ubuntu (signed modules), enroll a MOK "
                           "key, or turn Secure Boot off"))
        errors += _headers_problems(ctx, sysinfo)
        errors += _sharing_problems(ctx, gpus)
        if f[KernelModules("nouveau")].get("nouveau"):
            warnings.append(("nouveau", "nouveau is loaded; gpuk8s blacklists it and reboots",
                             "nothing to do"))
    containerd = f[Containerd()]
    major = int(containerd.version.split(".")[0]) if containerd.version else None
    k8s = tuple(int(x) for x in str(ctx.var("kubernetes_version")).split("."))
    if major is not None and major < 2 and k8s >= (1, 36):
        warnings.append(("containerd", f"containerd {containerd.version} is installed; "
                         f"Kubernetes {ctx.var('kubernetes_version')} needs 2.x, so gpuk8s "
                         "replaces it with containerd.io 2.x", "nothing to do"))
    for more_errors, more_warnings in (_mirror_problems(ctx), _endpoint_problems(ctx)):
        errors += more_errors
        warnings += more_warnings
    return _ignored(ctx, errors, warnings)


def inventory_check(ctx: HostContext) -> Problems:
    """(errors, warnings) of the rules that need only the inventory (INVENTORY_RULES), with
    preflight_ignore applied: what `gpuk8s check` reports for a host before contacting it."""
    errors = [p for rule in INVENTORY_RULES for p in rule(ctx)]
    return _ignored(ctx, errors, [])


def _ignored(ctx: HostContext, errors: list[Problem], warnings: list[Problem]) -> Problems:
    """A check listed in preflight_ignore (and not in NEVER_IGNORED) becomes a warning."""
    ignore = set(ctx.var("preflight_ignore")) - NEVER_IGNORED
    return ([p for p in errors if p[0] not in ignore],
            warnings + [p for p in errors if p[0] in ignore])


#: what other code uses of this role (gpuk8s.roles.exports)
EXPORTS = PreflightExports(check=check, inventory_check=inventory_check, unplannable=UNPLANNABLE)
