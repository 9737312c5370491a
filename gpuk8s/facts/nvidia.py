"""Facts about the NVIDIA driver as the host sees it (nvidia-smi, /proc/driver/nvidia)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuk8s.facts import Fact

QUERY_FIELDS = ("index,name,uuid,driver_version,memory.total,pci.bus_id,compute_cap,"
                "persistence_mode,mig.mode.current")


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    driver_version: str
    memory_mib: int
    bus_id: str
    compute_cap: str
    persistence_mode: str = ""
    mig_mode: str = ""


@dataclass(frozen=True)
class NvidiaState:
    """What the loaded driver reports. ``error`` is nvidia-smi's message when it failed."""

    smi_present: bool
    gpus: tuple[Gpu, ...] = ()
    error: str = ""
    exit_code: int = 0
    module: str = ""          # "open" | "proprietary" | "" (not loaded)
    module_version: str = ""
    cuda_version: str = ""    # highest CUDA the driver supports, from the nvidia-smi header
    nvswitch: bool = False
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def loaded_version(self) -> str:
        if self.gpus:
            return self.gpus[0].driver_version
        return self.module_version


def parse_query_csv(text: str) -> tuple[Gpu, ...]:
    """Parse ``--query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits`` output."""
    gpus = []
    for line in text.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 7 or not cols[0].isdigit():
            continue
        mem = cols[4].split()[0]
        gpus.append(Gpu(int(cols[0]), cols[1], cols[2], cols[3],
                        int(mem) if mem.isdigit() else 0, cols[5], cols[6],
                        cols[7] if len(cols) > 7 else "", cols[8] if len(cols) > 8 else ""))
    return tuple(gpus)


_PROC_RE = re.compile(r"NVRM version: NVIDIA UNIX (Open Kernel Module for \S+|\S+ Kernel Module)"
                      r"\s+(\d+\.\d+(?:\.\d+)?)")
_CUDA_RE = re.compile(r"CUDA Version:\s*([0-9.]+)")


def parse_proc_version(text: str) -> tuple[str, str]:
    """(flavour, version) from /proc/driver/nvidia/version; ("", "") when absent."""
    m = _PROC_RE.search(text)
    if not m:
        return "", ""
    return ("open" if m.group(1).startswith("Open") else "proprietary"), m.group(2)


class Nvidia(Fact[NvidiaState]):
    """nvidia-smi query, its header's CUDA version and the kernel module's flavour."""

    def command(self) -> str:
        return f"""if command -v nvidia-smi >/dev/null 2>&1; then
  echo '## query'; nvidia-smi --query-gpu={QUERY_FIELDS} --format=csv,noheader,nounits 2>&1
  echo "## rc $?"; echo '## header'; nvidia-smi 2>/dev/null | grep -m1 'CUDA Version'
else echo '## absent'; fi
echo '## proc'; cat /proc/driver/nvidia/version 2>/dev/null
echo '## nvswitch'; ls /proc/driver/nvidia-nvswitch/devices 2>/dev/null | head -n1; true"""

    def parse(self, output: str, exit_code: int) -> NvidiaState:
        sections: dict[str, list[str]] = {}
        current = ""
        rc = 0
        for line in output.splitlines():
            if line.startswith("## rc "):
                rc = int(line.split()[2])
            elif line.startswith("## "):
                current = line[3:]
                sections.setdefault(current, [])
            else:
                sections.setdefault(current, []).append(line)
        flavour, module_version = parse_proc_version("\n".join(sections.get("proc", [])))
        if "absent" in sections:
            return NvidiaState(False, module=flavour, module_version=module_version)
        query = "\n".join(sections.get("query", []))
        gpus = parse_query_csv(query) if rc == 0 else ()
        cuda = _CUDA_RE.search("\n".join(sections.get("header", [])))
        if gpus and not flavour:
            module_version = gpus[0].driver_version
        return NvidiaState(True, gpus, "" if rc == 0 else query.strip(), rc, flavour,
                           module_version, cuda.group(1) if cuda else "",
                           bool([x for x in sections.get("nvswitch", []) if x.strip()]))


class CudaToolkits(Fact[dict[str, str]]):
    """Installed CUDA toolkits: ``{"13.0": "13.0.2"}`` from /usr/local/cuda-*/version.json."""

    def command(self) -> str:
        return r"""for d in /usr/local/cuda-*; do [ -f "$d/version.json" ] || continue
v=$(grep -A2 '"cuda"' "$d/version.json" | sed -n 's/.*"version" *: *"\([^"]*\)".*/\1/p' | head -n1)
echo "${d#/usr/local/cuda-} $v"; done; true"""

    def parse(self, output: str, exit_code: int) -> dict[str, str]:
        return {p[0]: p[1] for p in (line.split() for line in output.splitlines()) if len(p) == 2}
