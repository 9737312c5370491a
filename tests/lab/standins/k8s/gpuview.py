# LAB STAND-IN: not NVML. Test infrastructure for gpuk8s; never shipped to users.
"""The node's GPUs as the NVIDIA daemons in its pods see them: ONE view, shared by the emulated
device plugin (its resources and start-up: device_plugin.py), DCGM exporter (dcgm.py) and DRA
kubelet plugin (dra_node.py).

The real daemons ask NVML; here the view asks the node's nvidia-smi stand-in (its fake GPUs are
tests/lab/standins/nvidia/labgpu.py, their MIG state labmig.py; the k8s packages do not ship
those, and going through nvidia-smi gives the daemons NVML's failures: no driver loaded (exit 9),
a driver/library mismatch (18), no library (127)). A daemon on the node sees all of the node's
GPUs, whatever the kubelet's own environment says (GPUK8S_LAB_VISIBLE_GPUS,
NVIDIA_VISIBLE_DEVICES are a container's). One View is one look: each nvidia-smi output is read
once, when first asked for, so a caller runs only the commands it needs. What nvidia-smi prints
is not trusted: a line that does not parse is left out. The PCI devices (pci_gpus) are what the
kernel lists, with or without a driver.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .common import P, run
from .nodeinfo import memo, read_abs, stat_key

#: what the DRA plugin reads of each GPU (`nvidia-smi --query-gpu`, csv,noheader,nounits)
DETAIL_QUERY = ("index,uuid,name,memory.total,pci.bus_id,compute_cap,driver_version,"
                "mig.mode.current")
#: the nvidia-smi questions a kept View answers from its memo (View.kept)
KEPT = (("-L",), ("--query-gpu=uuid,mig.mode.current", "--format=csv,noheader"))
#: a container's GPU selection (the nvidia-smi stand-in's and the toolkit's), not a daemon's
CONTAINER_ENV = ("GPUK8S_LAB_VISIBLE_GPUS", "NVIDIA_VISIBLE_DEVICES")


@dataclass(frozen=True)
class MigDevice:
    """A MIG device (a GPU instance with a compute instance): profile and UUID from
    `nvidia-smi -L`; where `mig -lgi/-lci/-lgip` were read and agree with -L, its GPU and
    compute instance IDs, GI profile ID, placement (first memory slice, slice count) and
    ``engines``: memory GiB, multiprocessors, decoders, encoders, copy engines, JPEG, OFA."""

    profile: str
    uuid: str
    gi: int = -1
    ci: int = -1
    profile_id: int = -1
    start: int = 0
    size: int = 0
    engines: tuple[float, ...] = ()

    @property
    def placed(self) -> bool:
        """Whether the instance listings were read for it (View.detailed)."""
        return self.gi >= 0


@dataclass(frozen=True)
class Gpu:
    """One GPU. `-L` gives index, name, uuid and the MIG devices; the MIG mode comes from
    `--query-gpu=uuid,mig.mode.current` (View.gpus); the rest only from View.detailed
    (`--query-gpu=DETAIL_QUERY` and `-q`): empty until read."""

    index: int
    uuid: str
    name: str = ""
    mig_mode: str = ""        # Enabled, Disabled, [N/A]
    migs: tuple[MigDevice, ...] = ()
    memory_mib: int = 0
    bus_id: str = ""          # nvidia-smi's form, 00000000:00:06.0
    compute_cap: str = ""
    driver_version: str = ""
    brand: str = ""           # -q's Product Brand, as nvidia-smi prints it ("NVIDIA")
    architecture: str = ""
    minor: int | None = None  # -q's Minor Number (/dev/nvidia<minor>)


# ------------------------------------------------------------------ the kernel's view
def pci_gpus() -> list[str]:
    """The node's NVIDIA display/3D controllers (vendor 0x10de, class 0x0300/0x0302), by PCI
    sysfs name: what the kernel lists, driver or not."""
    out = []
    for d in sorted(glob.glob(P("/sys/bus/pci/devices/*"))):
        vendor = (read_abs(os.path.join(d, "vendor")) or "").strip().lower()
        cls = (read_abs(os.path.join(d, "class")) or "").strip().lower()
        if vendor == "0x10de" and (cls.startswith("0x0300") or cls.startswith("0x0302")):
            out.append(os.path.basename(d))
    return out


# ------------------------------------------------------------------ nvidia-smi's outputs
_GPU_LINE = re.compile(r"GPU (\d+): (.*) \(UUID: (GPU-[0-9A-Fa-f-]+)\)")
_MIG_LINE = re.compile(r"\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[0-9A-Fa-f-]+)\)")


def parse_list(text: str) -> list[Gpu]:
    """`nvidia-smi -L`: the GPUs (index, name, UUID) with their MIG devices (profile, UUID)."""
    out: list[Gpu] = []
    for line in text.splitlines():
        if m := _GPU_LINE.fullmatch(line):
            out.append(Gpu(int(m.group(1)), m.group(3), name=m.group(2)))
        elif (m := _MIG_LINE.fullmatch(line)) and out:
            out[-1] = dataclasses.replace(
                out[-1], migs=(*out[-1].migs, MigDevice(m.group(1), m.group(2))))
    return out


def parse_modes(text: str) -> dict[str, str]:
    """`--query-gpu=uuid,mig.mode.current --format=csv,noheader`: GPU UUID -> MIG mode."""
    rows = (ln.split(", ") for ln in text.splitlines())
    return {r[0].strip(): r[1].strip() for r in rows if len(r) == 2}


def with_modes(gpus: Sequence[Gpu], modes: dict[str, str]) -> list[Gpu]:
    """The GPUs, each with its MIG mode from ``modes`` (parse_modes; "" when not there)."""
    return [dataclasses.replace(g, mig_mode=modes.get(g.uuid, "")) for g in gpus]


def parse_query(csv: str) -> list[Gpu]:
    """Rows of `--query-gpu=DETAIL_QUERY --format=csv,noheader,nounits` (a malformed row is
    skipped)."""
    out = []
    for line in csv.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) != 8 or not cols[0].isdigit() or not cols[3].isdigit():
            continue
        out.append(Gpu(int(cols[0]), cols[1], name=cols[2], memory_mib=int(cols[3]),
                       bus_id=cols[4], compute_cap=cols[5], driver_version=cols[6],
                       mig_mode=cols[7]))
    return out


def parse_q(text: str) -> tuple[str, dict[str, dict[str, Any]]]:
    """`nvidia-smi -q`: (CUDA Version, GPU UUID -> brand, architecture, minor)."""
    cuda = ""
    gpus: dict[str, dict[str, Any]] = {}
    cur: dict[str, Any] = {}
    for line in text.splitlines():
        if line.startswith("GPU "):
            cur = {}
            continue
        m = re.match(r"^(\s*)(\S.*?)\s*: (.*)$", line)
        if not m:
            continue
        key, value = m.group(2), m.group(3).strip()
        if not m.group(1) and key == "CUDA Version":
            cuda = value
        elif key == "Product Brand":
            cur["brand"] = value
        elif key == "Product Architecture":
            cur["architecture"] = value
        elif key == "GPU UUID":
            gpus[value] = cur
        elif key == "Minor Number" and value.isdigit():
            cur["minor"] = int(value)
    return cuda, gpus


_LGI = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s*\|$")
_LCI = re.compile(r"^\|\s*(\d+)\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+\d+:\d+\s*\|$")
_LGIP = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+\d+/\d+\s+([\d.]+)\s+\S+\s+(\d+)\s+"
                   r"(\d+)\s+(\d+)\s*\|$")
_LGIP2 = re.compile(r"^\|\s+(\d+)\s+(\d+)\s+(\d+)\s*\|$")


def parse_mig(lgi: str, lci: str, lgip: str) -> dict[int, list[MigDevice]]:
    """GPU index -> its MIG devices (a GPU instance with a compute instance) by GI then CI ID,
    with the GI profile's ID, placement and engines from `mig -lgi`, `-lci` and `-lgip` (no
    UUID: that is -L's)."""
    gis = {}
    for line in lgi.splitlines():
        if m := _LGI.match(line.strip()):
            gis[(int(m.group(1)), int(m.group(4)))] = (m.group(2), int(m.group(3)),
                                                       int(m.group(5)), int(m.group(6)))
    profiles: dict[tuple[int, str], list[float]] = {}
    last: tuple[int, str] | None = None
    for line in lgip.splitlines():
        if m := _LGIP.match(line.strip()):
            last = (int(m.group(1)), m.group(2))
            profiles[last] = [float(m.group(4)), *(int(m.group(i)) for i in (5, 6, 7))]
        elif (m := _LGIP2.match(line.strip())) and last is not None:
            profiles[last] += [int(m.group(i)) for i in (1, 2, 3)]
            last = None
    out: dict[int, list[MigDevice]] = {}
    for line in lci.splitlines():
        if not (m := _LCI.match(line.strip())):
            continue
        gpu, gi, ci = int(m.group(1)), int(m.group(2)), int(m.group(5))
        if (gpu, gi) not in gis:
            continue
        name, pid, start, size = gis[(gpu, gi)]
        out.setdefault(gpu, []).append(MigDevice(
            name, "", gi=gi, ci=ci, profile_id=pid, start=start, size=size,
            engines=tuple(profiles.get((gpu, name), []))))
    for devs in out.values():
        devs.sort(key=lambda d: (d.gi, d.ci))
    return out


def detail(query: str, q: str, listing: str, lgi: str = "", lci: str = "",
           lgip: str = "") -> tuple[str, list[Gpu]]:
    """(CUDA version, the GPUs) from the outputs View.detailed reads: the --query-gpu rows,
    with -q's brand, architecture and minor, and -L's MIG devices placed by the instance
    listings (the n-th MIG device of a GPU in -L is its n-th instance by GI then CI ID; one
    whose profile disagrees, or beyond the listing, stays unplaced)."""
    cuda, extra = parse_q(q)
    instances = parse_mig(lgi, lci, lgip)
    listed = {g.uuid: g.migs for g in parse_list(listing)}
    out = []
    for gpu in parse_query(query):
        more = extra.get(gpu.uuid, {})
        placed = instances.get(gpu.index, [])
        migs = tuple(dataclasses.replace(placed[i], profile=m.profile, uuid=m.uuid)
                     if i < len(placed) and placed[i].profile == m.profile else m
                     for i, m in enumerate(listed.get(gpu.uuid, ())))
        out.append(dataclasses.replace(
            gpu, migs=migs, brand=more.get("brand", ""),
            architecture=more.get("architecture", ""), minor=more.get("minor")))
    return cuda, out


# ------------------------------------------------------------------ one look at the node
def daemon_env() -> dict[str, str]:
    """The environment nvidia-smi runs in for a daemon: the kubelet's, less a container's GPU
    selection."""
    return {k: v for k, v in os.environ.items() if k not in CONTAINER_ENV}


#: what the nvidia-smi stand-in answers from (labgpu.py, labmig.py): its GPUs' PCI entries,
#: the driver's installed and loaded versions, the MIG state, the boot (a reboot applies a
#: pending MIG mode)
_STATE_DIRS = ("/run/nvidia-lab", "/usr/lib/gpuk8s-lab/nvidia", "/var/lib/gpuk8s-lab/nvidia")


def state_key() -> tuple[Any, ...] | None:
    """The state nvidia-smi's -L and MIG mode answers depend on, as it is now; None (ask
    every time) when the nvidia-smi found is not the lab's stand-in, whose reads these are
    (the stand-ins' own tests script one that answers from files of theirs)."""
    smi = shutil.which("nvidia-smi", path=daemon_env().get("PATH")) or "-"
    try:
        with open(smi, "rb") as f:
            if b"import labgpu" not in f.read(4096):
                return None
    except OSError:
        return None
    files = [stat_key(smi)]
    for folder in map(P, _STATE_DIRS):
        files.append(stat_key(folder))
        with contextlib.suppress(OSError):
            files += [stat_key(os.path.join(folder, n)) for n in sorted(os.listdir(folder))]
    return (*files, tuple(pci_gpus()), read_abs(P("/proc/sys/kernel/random/boot_id")))


class View:
    """One look at the node's GPUs through nvidia-smi (``smi``: its command). ``kept``: the
    answers of -L and the MIG mode query are kept between Views while the state they come
    from (state_key) stays as it is (the device plugin's, asked on every kubelet sync)."""

    def __init__(self, smi: Sequence[str] = ("nvidia-smi",), kept: bool = False) -> None:
        self.smi = list(smi)
        self.kept = kept
        self._out: dict[tuple[str, ...], subprocess.CompletedProcess[str]] = {}

    def smi_run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """nvidia-smi ``args``, run once per View."""
        if args not in self._out:
            def ask() -> subprocess.CompletedProcess[str]:
                return run([*self.smi, *args], env=daemon_env())
            self._out[args] = memo(f"nvidia-smi {args}", state_key(), ask, rooted=True) \
                if self.kept and args in KEPT else ask()
        return self._out[args]

    def listing(self) -> str | None:
        """`nvidia-smi -L`; None when nvidia-smi fails (no driver loaded: NVML cannot start)."""
        p = self.smi_run("-L")
        return p.stdout if p.returncode == 0 else None

    def listed(self) -> list[Gpu]:
        """The GPUs -L lists, with their MIG devices ([] when nvidia-smi fails)."""
        return parse_list(self.listing() or "")

    def mig_modes(self) -> dict[str, str]:
        """GPU UUID -> its current MIG mode (Enabled, Disabled, [N/A]); {} when it fails."""
        p = self.smi_run("--query-gpu=uuid,mig.mode.current", "--format=csv,noheader")
        return parse_modes(p.stdout if p.returncode == 0 else "")

    def mig_on(self) -> bool:
        """Whether any GPU has MIG mode on."""
        return any(m == "Enabled" for m in self.mig_modes().values())

    def gpus(self) -> list[Gpu]:
        """The GPUs -L lists, each with its MIG mode ("" when not known)."""
        return with_modes(self.listed(), self.mig_modes())

    def detailed(self) -> tuple[list[Gpu] | None, str, str]:
        """(the GPUs with every detail, CUDA version, "") from --query-gpu, -q, -L and
        `mig -lgi/-lci/-lgip`; (None, "", why) when nvidia-smi fails: the first line it
        printed."""
        p = self.smi_run(f"--query-gpu={DETAIL_QUERY}", "--format=csv,noheader,nounits")
        if p.returncode != 0:
            said = (p.stdout + p.stderr).strip()
            return None, "", said.splitlines()[0] if said else "failed"
        q, listing, lgi, lci, lgip = (self.smi_run(*a).stdout for a in (
            ("-q",), ("-L",), ("mig", "-lgi"), ("mig", "-lci"), ("mig", "-lgip")))
        cuda, gpus = detail(p.stdout, q, listing, lgi, lci, lgip)
        return gpus, cuda, ""

    def query(self, fields: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """`--query-gpu=<fields> --format=csv,noheader,nounits` as nvidia-smi answers it (the
        exit code says whether NVML could start; a field it does not know fails the query)."""
        return self.smi_run(f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits")
