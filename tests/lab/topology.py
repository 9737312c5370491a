"""Lab topology: which nodes, their roles, IPs and fake GPUs; and the Ansible-style inventory."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .paths import HOST_IP, REPO_URL, LabError, key_pins, node_ip, registry_mirrors, state_dir

TOPOLOGY_DIR = Path(__file__).parent / "topologies"

# model -> (device id, class, subsystem device, pci.ids name)
GPU_MODELS: dict[str, tuple[int, int, int, str]] = {
    "H100": (0x2330, 0x030200, 0x16C1, "GH100 [H100 SXM5 80GB]"),
    "H200": (0x2335, 0x030200, 0x18BE, "GH100 [H200 SXM 141GB]"),
    "A100": (0x20B2, 0x030200, 0x147F, "GA100 [A100 SXM4 80GB]"),
    "L40S": (0x26B9, 0x030200, 0x1851, "AD102GL [L40S]"),
}
NVSWITCH = (0x22A3, 0x068000, 0x1796, "GH100 [H100 NVSwitch]")

ROLES = ("control_plane", "worker")
_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")
_GPU_RE = re.compile(r"^(?:(\d+)x)?([A-Za-z0-9]+)$")


@dataclass(frozen=True)
class NodeSpec:
    name: str
    ip: str
    role: str = "worker"
    gpu_model: str | None = None
    gpus: int = 0
    nvswitches: int = 0

    @property
    def gpu_label(self) -> str:
        return f"{self.gpus}x{self.gpu_model}" if self.gpus else "-"


@dataclass
class Topology:
    nodes: list[NodeSpec] = field(default_factory=list)

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise LabError(f"duplicate node names in topology: {names}")
        if not self.nodes:
            raise LabError("empty topology")

    def node(self, name: str) -> NodeSpec:
        for n in self.nodes:
            if n.name == name:
                return n
        raise LabError(f"no node {name!r} in the lab (nodes: {[n.name for n in self.nodes]})")

    # ------------------------------------------------------------ building

    @classmethod
    def from_entries(cls, entries: list[dict[str, Any]]) -> Topology:
        nodes: list[NodeSpec] = []
        for i, entry in enumerate(entries, start=1):
            name = str(entry["name"])
            if not _NAME_RE.match(name):
                raise LabError(f"bad node name {name!r} (lowercase letters, digits, '-')")
            model, count = _parse_gpus(str(entry.get("gpus") or "cpu"))
            default_role = "control_plane" if name.startswith("cp") else "worker"
            role = str(entry.get("role") or default_role)
            if role not in ROLES:
                raise LabError(f"node {name}: role must be one of {ROLES}, not {role!r}")
            nodes.append(NodeSpec(name=name, ip=node_ip(i), role=role, gpu_model=model,
                                  gpus=count, nvswitches=int(entry.get("nvswitches") or 0)))
        return cls(nodes)

    @classmethod
    def from_spec(cls, spec: str) -> Topology:
        """'cp-01:cpu,gpu-01:2xH100,gpu-02:1xH200,cpu-01:cpu' (optional 3rd field: role)."""
        entries: list[dict[str, Any]] = []
        for item in filter(None, (s.strip() for s in spec.split(","))):
            parts = item.split(":")
            entry: dict[str, Any] = {"name": parts[0],
                                     "gpus": parts[1] if len(parts) > 1 else "cpu"}
            if len(parts) > 2:
                entry["role"] = parts[2]
            entries.append(entry)
        return cls.from_entries(entries)

    @classmethod
    def generic(cls, count: int, gpus: str = "cpu") -> Topology:
        """``count`` nodes node-01..node-NN; node-01 is the control plane."""
        width = max(2, len(str(count)))
        entries = [{"name": f"node-{i:0{width}d}", "gpus": gpus if i > 1 else "cpu",
                    "role": "control_plane" if i == 1 else "worker"}
                   for i in range(1, count + 1)]
        return cls.from_entries(entries)

    @classmethod
    def from_yaml(cls, path: str | Path) -> Topology:
        data = yaml.safe_load(Path(path).read_text())
        if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
            raise LabError(f"{path}: expected a mapping with a 'nodes' list")
        return cls.from_entries(data["nodes"])

    @classmethod
    def load(cls, what: str | Path | None = None) -> Topology:
        """A YAML path, a topology name under topologies/, or a node spec string."""
        if what is None or what == "":
            what = "default"
        text = str(what)
        if Path(text).is_file():
            return cls.from_yaml(text)
        named = TOPOLOGY_DIR / f"{text}.yaml"
        if named.is_file():
            return cls.from_yaml(named)
        if ":" in text or "," in text:
            return cls.from_spec(text)
        raise LabError(f"unknown topology {text!r}: not a file, a name in {TOPOLOGY_DIR}, "
                       "or a spec like 'cp-01:cpu,gpu-01:2xH100'")

    def to_yaml(self) -> str:
        entries = []
        for n in self.nodes:
            e: dict[str, Any] = {"name": n.name, "role": n.role,
                                 "gpus": f"{n.gpus}x{n.gpu_model}" if n.gpus else "cpu"}
            if n.nvswitches:
                e["nvswitches"] = n.nvswitches
            entries.append(e)
        return yaml.safe_dump({"nodes": entries}, sort_keys=False)


def _parse_gpus(text: str) -> tuple[str | None, int]:
    if text.lower() in ("cpu", "none", "0", ""):
        return None, 0
    m = _GPU_RE.match(text)
    if not m:
        raise LabError(f"bad gpu spec {text!r} (want e.g. 2xH100, H200, cpu)")
    count = int(m.group(1) or 1)
    model = next((k for k in GPU_MODELS if k.lower() == m.group(2).lower()), None)
    if model is None:
        raise LabError(f"unknown GPU model {m.group(2)!r}; known: {', '.join(GPU_MODELS)}")
    if not 1 <= count <= 16:
        raise LabError(f"gpu count {count} out of range 1..16")
    return model, count


# ------------------------------------------------------------------ inventory

def inventory_vars(*, become_user: bool = False) -> dict[str, Any]:
    st = state_dir()
    k8s = f"{REPO_URL}/pkgs.k8s.io/core:/stable:/v{{{{ kubernetes_version }}}}/deb/"
    cuda = (f"{REPO_URL}/developer.download.nvidia.com/compute/cuda/repos/"
            "{{ nvidia_cuda_distro }}/x86_64/")
    ctk = f"{REPO_URL}/nvidia.github.io/libnvidia-container/stable/deb/amd64/"
    docker = f"{REPO_URL}/download.docker.com/linux/debian"
    v: dict[str, Any] = {
        "ansible_user": "labadmin" if become_user else "root",
        "ansible_ssh_private_key_file": str(st / "ssh" / "id_ed25519"),
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={st / 'ssh' / 'known_hosts'}",
    }
    if become_user:
        # the password is NOT written here: pass it in GPUK8S_BECOME_PASSWORD
        v["ansible_become"] = True
    v.update({
        "kubernetes_version": "1.36",
        # the lab host's kernel runs cgroup v1 only, and the nodes share it
        "kubelet_allow_cgroup_v1": True,
        "kubernetes_repo_url": k8s,
        "kubernetes_repo_key_url": k8s + "Release.key",
        "nvidia_cuda_repo_url": cuda,
        "nvidia_cuda_repo_key_url": cuda + "3bf863cc.pub",
        "nvidia_container_toolkit_repo_url": ctk,
        "nvidia_container_toolkit_repo_key_url":
            f"{REPO_URL}/nvidia.github.io/libnvidia-container/gpgkey",
        "docker_repo_url": docker,
        "docker_repo_key_url": docker + "/gpg",
        # the lab's URLs are plain http: the lab key's fingerprint pins every repo
        **key_pins(),
        "apt_proxy": f"http://{HOST_IP}:3142",
        # every image comes from the lab's registry (Docker Hub and the others are unreachable)
        "registry_mirrors": registry_mirrors(),
    })
    return v


def inventory(topology: Topology, *, become_user: bool = False) -> dict[str, Any]:
    groups: dict[str, dict[str, Any]] = {"control_plane": {}, "workers": {}}
    for n in topology.nodes:
        host: dict[str, Any] = {"ansible_host": n.ip}
        if n.gpus:
            host["gpu_required"] = True
        groups["control_plane" if n.role == "control_plane" else "workers"][n.name] = host
    return {
        "all": {
            "vars": inventory_vars(become_user=become_user),
            "children": {g: {"hosts": hosts} for g, hosts in groups.items()},
        }
    }


def write_inventory(topology: Topology, path: str | Path, *, become_user: bool = False) -> Path:
    """Write the Ansible-compatible inventory: root by key, or labadmin + sudo (become_user)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = ("# gpuk8s lab inventory (written by tests/lab). LAB ONLY: the repo signing key it "
              "pins is public\n# (tests/lab/keys/); never start a real inventory from it.\n"
              + ("# become password: export GPUK8S_BECOME_PASSWORD=\"$(cat "
                 f"{state_dir() / 'secrets' / 'labadmin.password'})\"\n" if become_user else ""))
    out.write_text(header + yaml.safe_dump(inventory(topology, become_user=become_user),
                                           sort_keys=False, width=200))
    return out
