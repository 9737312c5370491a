"""Facts about the NVIDIA driver as the host sees it (nvidia-smi, /proc/driver/nvidia)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuk8s.facts import Fact, Source

QUERY_FIELDS = ("index,name,uuid,driver_version,memory.total,pci.bus_id,compute_cap,"
                "persistence_mode,mig.mode.current")
#: the probe's one ``--query-gpu``: the Nvidia fact's fields first (its parse reads those
#: nine columns and never read past them), then what MigState needs besides. Every field is
#: one real nvidia-smi knows (tests/fixtures/real/h200-ubuntu2404/probe-2026-11-28: its
#: ``--help-query-gpu``; ``virtualization_mode`` is no such field, it refuses the query)
SMI_FIELDS = QUERY_FIELDS + ",mig.mode.pending"


class NvidiaSmi(Source):
    """The one ``nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits`` of a
    probe: its output (stdout and stderr, as the Nvidia fact always read it) in $_gk_smi,
    its exit code in $_gk_smi_rc ("absent" without nvidia-smi)."""

    def command(self) -> str:
        return f"""if command -v nvidia-smi >/dev/null 2>&1; then
  _gk_smi=$(nvidia-smi --query-gpu={SMI_FIELDS} --format=csv,noheader,nounits 2>&1)
  _gk_smi_rc=$?
else _gk_smi=; _gk_smi_rc=absent; fi"""

    def ready(self) -> str:
        return '[ -n "${_gk_smi_rc+x}" ]'


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

    def sources(self) -> tuple[Source, ...]:
        return (NvidiaSmi(),)

    def command(self) -> str:
        # the header's CUDA version: where the query read the GPUs, ``nvidia-smi --version``
        # prints the one the table's header shows (21 ms against the table's 107 ms on the
        # H200, whose table draws every GPU); where it has no such line (older drivers), or
        # where the query failed, the table is asked, as before
        # absent or not is the source's answer, never a second ``command -v``: a driver
        # install still unpacking on the host (a killed run's apt goes on) can bring
        # nvidia-smi between the two, and the fact would read the source's "absent" as its
        # exit code (CI of stop 43, test_chain_a_eight_kill_points)
        return f"""{NvidiaSmi().ensure()}
if [ "$_gk_smi_rc" != absent ]; then
  echo '## query'; [ -z "$_gk_smi" ] || printf '%s\\n' "$_gk_smi"
  echo "## rc $_gk_smi_rc"; echo '## header'; h=
  [ "$_gk_smi_rc" != 0 ] ||
    h=$(nvidia-smi --version 2>/dev/null | sed -n 's/^CUDA Version *: */CUDA Version: /p')
  [ -n "$h" ] || h=$(nvidia-smi 2>/dev/null | grep -m1 'CUDA Version')
  [ -z "$h" ] || printf '%s\\n' "$h"
else echo '## absent'; fi
echo '## proc'; cat /proc/driver/nvidia/version 2>/dev/null
echo '## nvswitch'; ls /proc/driver/nvidia-nvswitch/devices 2>/dev/null | head -n1; true"""

    def parse(self, output: str, exit_code: int) -> NvidiaState:
        sections: dict[str, list[str]] = {}
        current = ""
        rc = 0
        for line in output.splitlines():
            if line.startswith("## rc "):
                word = line[6:].strip()
                if not word.isdigit():
                    raise ValueError(f"nvidia-smi's exit code is not a number: {word!r}")
                rc = int(word)
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
    """Installed CUDA toolkits, ``{"13.0": "13.0.2"}``: /usr/local/cuda-*/version.json, and the
    ``nvcc`` on PATH or under /usr/local/cuda (toolkits not installed from packages)."""

    def command(self) -> str:
        return r"""for d in /usr/local/cuda-*; do [ -f "$d/version.json" ] || continue
v=$(grep -A2 '"cuda"' "$d/version.json" | sed -n 's/.*"version" *: *"\([^"]*\)".*/\1/p' | head -n1)
echo "${d#/usr/local/cuda-} $v"; done
for n in $(command -v nvcc) /usr/local/cuda/bin/nvcc; do [ -x "$n" ] || continue
"$n" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\), V\([0-9.]*\).*/\1 \2/p'; break; done; true"""

    def parse(self, output: str, exit_code: int) -> dict[str, str]:
        found: dict[str, str] = {}
        for parts in (line.split() for line in output.splitlines()):
            if len(parts) == 2:
                found.setdefault(parts[0], parts[1])
        return found


@dataclass(frozen=True)
class Topology:
    """GPU interconnect: active NVLinks per GPU index and the ``topo -m`` link matrix
    (``{"GPU0": {"GPU1": "NV18"}}``). Empty without nvidia-smi or a loaded driver."""

    nvlinks: dict[int, int] = field(default_factory=dict)
    matrix: dict[str, dict[str, str]] = field(default_factory=dict)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_nvlink_status(text: str) -> dict[int, int]:
    """Active links per GPU from ``nvidia-smi nvlink -s``."""
    links: dict[int, int] = {}
    gpu: int | None = None
    for line in text.splitlines():
        m = re.match(r"GPU (\d+):", line)
        if m:
            gpu = int(m.group(1))
            links[gpu] = 0
        elif gpu is not None and re.match(r"\s*Link \d+: [0-9.]+ GB/s", line):
            links[gpu] += 1
    return links


def parse_topo_matrix(text: str) -> dict[str, dict[str, str]]:
    """GPU-to-GPU connection types from ``nvidia-smi topo -m``."""
    lines = [_ANSI.sub("", line) for line in text.splitlines() if line.strip()]
    if not lines:
        return {}
    header = [h for h in lines[0].split("\t") if h.strip()]
    gpus = [h.strip() for h in header if re.fullmatch(r"GPU\d+", h.strip())]
    matrix: dict[str, dict[str, str]] = {}
    for line in lines[1:]:
        cells = [c.strip() for c in line.split("\t")]
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        row = [c for c in cells[1:] if c != ""]
        matrix[cells[0]] = {g: row[i] for i, g in enumerate(gpus) if i < len(row) and
                            g != cells[0]}
    return matrix


class GpuTopology(Fact[Topology]):
    """NVLink status and the topology matrix (multi-GPU boxes)."""

    def sources(self) -> tuple[Source, ...]:
        return (NvidiaSmi(),)

    def command(self) -> str:
        # an nvidia-smi that cannot read the GPUs (no driver loaded) shows no topology
        return f"""command -v nvidia-smi >/dev/null 2>&1 || exit 0
{NvidiaSmi().ensure()}
[ "$_gk_smi_rc" = 0 ] || exit 0
echo '## nvlink'; nvidia-smi nvlink -s 2>/dev/null
echo '## topo'; nvidia-smi topo -m 2>/dev/null; true"""

    def parse(self, output: str, exit_code: int) -> Topology:
        nvlink, _, topo = output.partition("## topo\n")
        nvlink = nvlink.partition("## nvlink\n")[2]
        return Topology(parse_nvlink_status(nvlink), parse_topo_matrix(topo))


@dataclass(frozen=True)
class GpuMig:
    """One GPU's MIG state as nvidia-smi reports it."""

    index: int
    mode: str                     # Enabled | Disabled | [N/A]
    pending: str
    devices: tuple[str, ...] = ()  # MIG devices (GPU instances with a compute instance)
    instances: tuple[str, ...] = ()  # every GPU instance, with or without a compute instance

    @property
    def layout(self) -> tuple[str, ...]:
        """What the GPU is split into, largest first; () when MIG is off."""
        if self.mode != "Enabled":
            return ()
        return tuple(sorted(self.devices, key=_size_key))

    @property
    def tidy(self) -> bool:
        """No GPU instance without its compute instance, no pending mode change."""
        return self.mode == self.pending and sorted(self.devices) == sorted(self.instances)


def _size_key(name: str) -> tuple[int, str]:
    m = re.match(r"(\d+)g", name)
    return (-int(m.group(1)) if m else 0, name)


_MIG_DEVICE_RE = re.compile(r"^\s+MIG (\S+)\s+Device\s+\d+:")
_GI_ROW_RE = re.compile(r"^\|\s+(\d+)\s+MIG (\S+)\s+\d+\s+\d+\s+\d+:\d+\s+\|")


def parse_mig(text: str) -> tuple[GpuMig, ...]:
    """MIG state per GPU from the MigState probe's sections: ``mode`` (index, current, pending
    as CSV), ``list`` (``nvidia-smi -L``: MIG devices indented under their GPU) and ``gi``
    (``nvidia-smi mig -lgi``: every GPU instance)."""
    sections: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            sections.setdefault(current, [])
        else:
            sections.setdefault(current, []).append(line)
    devices: dict[int, list[str]] = {}
    gpu = -1
    for line in sections.get("list", []):
        m = re.match(r"GPU (\d+):", line)
        if m:
            gpu = int(m.group(1))
        elif (d := _MIG_DEVICE_RE.match(line)) and gpu >= 0:
            devices.setdefault(gpu, []).append(d.group(1))
    instances: dict[int, list[str]] = {}
    for line in sections.get("gi", []):
        if g := _GI_ROW_RE.match(line):
            instances.setdefault(int(g.group(1)), []).append(g.group(2))
    out = []
    for line in sections.get("mode", []):
        cols = [c.strip() for c in line.split(",")]
        if len(cols) == 3 and cols[0].isdigit():
            i = int(cols[0])
            out.append(GpuMig(i, cols[1], cols[2], tuple(devices.get(i, ())),
                              tuple(instances.get(i, ()))))
    return tuple(out)


class MigState(Fact[tuple[GpuMig, ...]]):
    """Each GPU's MIG mode (current, pending), MIG devices and GPU instances; () without a
    working nvidia-smi."""

    def sources(self) -> tuple[Source, ...]:
        return (NvidiaSmi(),)

    def command(self) -> str:
        # the mode rows: the shared query's first and last two columns (SMI_FIELDS), as the
        # "index, current, pending" rows of their own query were. MIG devices and GPU
        # instances exist only on a GPU in MIG mode: -L and mig -lgi run only when some GPU's
        # mode is not known to be off (with every GPU off they list none)
        return f"""command -v nvidia-smi >/dev/null 2>&1 || exit 0
{NvidiaSmi().ensure()}
[ "$_gk_smi_rc" = 0 ] || exit 0
echo '## mode'; m=
while IFS=, read -r i _ _ _ _ _ _ _ c p; do
  [ -n "$i" ] || continue
  printf '%s, %s, %s\\n' "$i" "${{c# }}" "${{p# }}"
  case ${{c# }} in Disabled|'[N/A]') ;; *) m=1;; esac
done <<EOF
$_gk_smi
EOF
[ -n "$m" ] || exit 0
echo '## list'; nvidia-smi -L 2>/dev/null
echo '## gi'; nvidia-smi mig -lgi 2>/dev/null; true"""

    def parse(self, output: str, exit_code: int) -> tuple[GpuMig, ...]:
        return parse_mig(output)
