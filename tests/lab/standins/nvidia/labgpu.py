# LAB STAND-IN: not the real NVML. Test infrastructure for gpuk8s; never shipped to users.
"""What the lab's fake NVIDIA GPUs look like (shared by the nvidia-smi and nvidia-ctk stand-ins).

GPUs are the PCI entries under /sys/bus/pci/devices with vendor 0x10de and class 0x0300xx or
0x0302xx; NVSwitches have class 0x0680xx. Every absolute path is prefixed with $GPUK8S_LAB_ROOT
(default "/") so the stand-ins can run against a fake tree in unit tests.

Driver state (written by the packages' maintainer scripts and the boot-time unit):
  /usr/lib/gpuk8s-lab/nvidia/module-version   installed "kernel module" version (DKMS stand-in)
  /usr/lib/gpuk8s-lab/nvidia/module-flavour   open | proprietary
  /run/nvidia-lab/loaded-module-version       the "loaded" module (copied at boot only)
  /run/nvidia-lab/persistence-mode            Enabled | Disabled (nvidia-persistenced stand-in)
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

NVIDIA_VENDOR = "0x10de"
CUDA_VERSION = "13.0"
STATE_DIR = "/run/nvidia-lab"
LIB_DIR = "/usr/lib/gpuk8s-lab/nvidia"

# device id -> (name, memory MiB, compute capability, power cap W, architecture, vbios, MIG capable)
MODELS: dict[int, tuple[str, int, str, int, str, str, bool]] = {
    0x2330: ("NVIDIA H100 80GB HBM3", 81559, "9.0", 700, "Hopper", "96.00.99.00.01", True),
    0x2335: ("NVIDIA H200", 143771, "9.0", 700, "Hopper", "96.00.A5.00.1A", True),
    0x20B2: ("NVIDIA A100-SXM4-80GB", 81920, "8.0", 400, "Ampere", "92.00.45.00.06", True),
    0x26B9: ("NVIDIA L40S", 46068, "8.9", 350, "Ada Lovelace", "95.02.66.00.02", False),
}
UNKNOWN_MODEL = ("NVIDIA Graphics Device", 16384, "8.0", 300, "Unknown", "00.00.00.00.00", False)


def root() -> str:
    return os.environ.get("GPUK8S_LAB_ROOT", "/") or "/"


def path(p: str) -> str:
    """Absolute path p inside the lab root."""
    return os.path.join(root(), p.lstrip("/"))


def read(p: str, default: str | None = None) -> str | None:
    try:
        with open(path(p)) as fh:
            return fh.read().strip()
    except OSError:
        return default


def write(p: str, text: str) -> None:
    full = path(p)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as fh:
        fh.write(text)


@dataclass
class GPU:
    index: int
    sysfs_name: str  # 0000:00:06.0
    device_id: int
    pci_class: int
    subsystem: str
    numa_node: int
    name: str
    memory_mib: int
    compute_cap: str
    power_cap: int
    architecture: str
    vbios: str
    mig_capable: bool
    uuid: str
    serial: str

    @property
    def bus_id(self) -> str:
        """nvidia-smi form: 8-hex-digit domain, upper case (00000000:00:06.0)."""
        dom, rest = self.sysfs_name.split(":", 1)
        return f"{int(dom, 16):08X}:{rest.upper()}"


def _pci_entries() -> list[tuple[str, int, int, str, int]]:
    base = path("/sys/bus/pci/devices")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    out = []
    for name in names:
        d = f"/sys/bus/pci/devices/{name}"
        if (read(f"{d}/vendor") or "").lower() != NVIDIA_VENDOR:
            continue
        try:
            device = int(read(f"{d}/device") or "0", 16)
            cls = int(read(f"{d}/class") or "0", 16)
            numa = int(read(f"{d}/numa_node") or "-1")
        except ValueError:
            continue
        sub = (read(f"{d}/subsystem_device") or "0x0000").lower()
        out.append((name.lower(), device, cls, sub, numa))
    return out


#: in a container, the GPUs' host: the kubelet stand-in's device injection mounts the node's
#: /etc/machine-id here, so a GPU keeps its UUID inside containers (its "hardware" identity)
HOST_ID_FILE = "/etc/gpuk8s-lab-gpu-host-id"


def machine_id() -> str:
    return read(HOST_ID_FILE) or read("/etc/machine-id") or "0" * 32


def _uuid(bus: str) -> tuple[str, str]:
    h = hashlib.sha256(f"gpuk8s-lab-gpu:{machine_id()}:{bus}".encode()).hexdigest()
    uuid = f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
    serial = str(1650000000000 + int(h[32:44], 16) % 10_000_000_000)
    return uuid, serial


#: Lab-only fault injection (`invoke lab.gpu-fault`): one file per faulty GPU, named by its PCI
#: address (0000:00:07.0), holding the fault: slow | pcie | ecc | xid | missing. A "missing" GPU
#: is gone from nvidia-smi and CUDA as a GPU that fell off the bus is, though the PCI device
#: stays; the others change what nvidia-smi and the benchmark stand-in report for it.
FAULT_DIR = "/var/lib/gpuk8s-lab/gpu-faults"
FAULT_KINDS = ("slow", "pcie", "ecc", "xid", "missing")


def fault(sysfs_name: str) -> str:
    kind = read(f"{FAULT_DIR}/{sysfs_name}") or ""
    return kind if kind in FAULT_KINDS else ""


#: PCIe generation each model's link trains to (the H200's: 5, tests/fixtures/real/h200-accept)
LINK_GEN = {0x2330: 5, 0x2335: 5, 0x20B2: 4, 0x26B9: 4}


#: Lab-only hook: the GPUs a container was given (comma-separated UUIDs), set by the kubelet
#: stand-in for pods that got nvidia.com/gpu. It plays the NVIDIA Container Toolkit injecting only
#: the allocated devices: nvidia-smi in such a container sees just those, numbered from 0. MIG
#: device UUIDs (MIG-...) show their parent GPU with only those MIG devices (labmig).
VISIBLE_ENV = "GPUK8S_LAB_VISIBLE_GPUS"


def gpus() -> list[GPU]:
    out: list[GPU] = []
    visible = os.environ.get(VISIBLE_ENV)
    wanted = None if visible is None else {u for u in visible.split(",") if u}
    for name, device, cls, sub, numa in _pci_entries():
        if (cls >> 8) not in (0x0300, 0x0302):
            continue
        if fault(name) == "missing":
            continue
        model = MODELS.get(device, UNKNOWN_MODEL)
        uuid, serial = _uuid(name)
        gpu = GPU(len(out), name, device, cls, sub, numa, *model, uuid=uuid, serial=serial)
        if wanted is not None and uuid not in wanted and not _owns_mig(gpu, wanted):
            continue
        out.append(gpu)
    return out


def _owns_mig(gpu: GPU, wanted: set[str]) -> bool:
    """A container given MIG devices (MIG-... UUIDs) sees their parent GPUs."""
    if not any(u.startswith("MIG-") for u in wanted):
        return False
    import labmig  # beside this module; imports it in turn

    return labmig.owns(gpu)


def select(gs: list[GPU], spec: str | None) -> list[GPU] | None:
    """nvidia-smi's -i: comma-separated indexes, PCI bus IDs or UUIDs (None: one names no
    GPU, which nvidia-smi answers with "No devices were found")."""
    if spec is None:
        return gs
    out: list[GPU] = []
    def bus(b: str) -> str:   # bus:device.function, the domain left out
        return ":".join(b.upper().split(":")[-2:])

    for item in (s.strip() for s in spec.split(",") if s.strip()):
        match = [g for g in gs if item in (str(g.index), g.uuid)
                 or (":" in item and bus(item) == bus(g.bus_id))]
        if not match:
            return None
        out += [g for g in match if g not in out]
    return out


def nvswitches() -> list[str]:
    return [name for name, _d, cls, _s, _n in _pci_entries() if (cls >> 8) == 0x0680]


def loaded_module_version() -> str | None:
    return read(f"{STATE_DIR}/loaded-module-version") or None


def installed_module_version() -> str | None:
    return read(f"{LIB_DIR}/module-version") or None


def persistence_mode() -> str:
    return "Enabled" if read(f"{STATE_DIR}/persistence-mode") == "Enabled" else "Disabled"


def nvml_short(version: str) -> str:
    """580.159.04 -> 580.159 (how NVML reports its library version)."""
    return ".".join(version.split(".")[:2])
