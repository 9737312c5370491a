"""The node side of `invoke accept`: one POSIX sh script, run as root on the GPU box, and the
parser of what it prints. The script reads the GPUs' health from nvidia-smi and the kernel log,
builds gpuk8s/data/accept.cu with the node's nvcc for its own GPUs (kept under
/var/lib/gpuk8s/accept by the source's hash, so a second run does not build again), and runs it
while nvidia-smi samples the PCIe link, temperature and clock event reasons under that load.

Everything the node prints is data: each line is matched against a strict pattern, and a line
that does not match is left out (a missing figure then fails the check that needed it)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from gpuk8s.facts.xid import bus_key, parse_xid

#: nvidia-smi --query-gpu fields read once before the benchmark (names as nvidia-smi 580 knows
#: them: tests/fixtures/real/h200-accept/health.csv)
HEALTH_FIELDS = (
    "index", "pci.bus_id", "name", "pcie.link.gen.max", "pcie.link.width.max",
    "pcie.link.width.current", "ecc.mode.current", "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total", "retired_pages.pending", "remapped_rows.pending",
    "remapped_rows.failure", "temperature.gpu", "power.limit", "power.default_limit",
    "persistence_mode", "driver_version",
)
#: sampled every 500 ms while the benchmark runs: the link trains down when idle, so its
#: generation only means something under load
SAMPLE_FIELDS = ("index", "pcie.link.gen.gpucurrent", "pcie.link.width.current",
                 "temperature.gpu", "power.draw", "clocks_event_reasons.active")
STATE_DIR = "/var/lib/gpuk8s/accept"
_EOF = "GPUK8S_ACCEPT_EOF"
#: the loaded kernel module's version, from /proc/driver/nvidia/version's first line ("NVRM
#: version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ...")
_MODULE = ("m=$(head -n1 /proc/driver/nvidia/version 2>/dev/null \\\n"
           "  | grep -o '[0-9]\\{3,\\}\\.[0-9]\\{1,3\\}\\(\\.[0-9]\\{1,3\\}\\)\\{0,1\\}' \\\n"
           "  | head -n1)")


def source() -> str:
    text = resources.files("gpuk8s").joinpath("data/accept.cu").read_text()
    assert _EOF not in text
    return text


def source_hash() -> str:
    return hashlib.sha256(source().encode()).hexdigest()[:16]


def script(quick: bool) -> str:
    """The whole node script. Exit 0 whatever it found (the judge reads the lines); it never
    changes a GPU setting."""
    smi = ",".join(HEALTH_FIELDS)
    sample = ",".join(SAMPLE_FIELDS)
    h = source_hash()
    return f"""exec 2>&1
export PATH="$PATH:/usr/local/cuda/bin"
d={STATE_DIR}; mkdir -p "$d"; chmod 700 "$d"
echo "ACCEPT-NODE 1"
n=0
for dev in /sys/bus/pci/devices/*; do
  [ "$(cat "$dev/vendor" 2>/dev/null)" = 0x10de ] || continue
  case $(cat "$dev/class" 2>/dev/null) in 0x0300*|0x0302*) n=$((n+1));; esac
done
echo "PCI-GPUS $n"
{_MODULE}
echo "MODULE $m"
echo "SMI-BEGIN"
nvidia-smi --query-gpu={smi} --format=csv,noheader,nounits
echo "SMI-END $?"
echo "APPS-BEGIN"
nvidia-smi --query-compute-apps=gpu_bus_id,pid --format=csv,noheader 2>/dev/null
echo "APPS-END"
echo "XID-BEGIN"
dmesg 2>/dev/null | grep -F 'NVRM: Xid' | tail -n 200
echo "XID-END"
bin="$d/accept-{h}"
if [ ! -x "$bin" ]; then
  nvcc=$(command -v nvcc)
  if [ -z "$nvcc" ]; then
    echo "BUILD none: no nvcc (the CUDA toolkit: cuda_toolkit_enabled: true)"; exit 0
  fi
  cat > "$d/accept.cu" <<'{_EOF}'
{source()}{_EOF}
  caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d . | sort -u)
  built=""
  sm=$(for c in $caps; do case $c in *[!0-9]*) ;; *) echo "-arch=sm_$c";; esac; done)
  for flags in -arch=native $sm; do
    if "$nvcc" -O3 $flags -o "$bin.tmp" "$d/accept.cu" -lcublas -ldl > "$d/nvcc.log" 2>&1; then
      built=$flags; break
    fi
  done
  if [ -z "$built" ]; then echo "BUILD failed:"; tail -n 5 "$d/nvcc.log"; exit 0; fi
  mv "$bin.tmp" "$bin"
  echo "BUILD $built"
else
  echo "BUILD cached"
fi
nvidia-smi --query-gpu={sample} --format=csv,noheader,nounits -lms 500 > "$d/samples" 2>/dev/null &
smi=$!
"$bin"{" --quick" if quick else ""}
echo "BENCH-EXIT $?"
kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
echo "SAMPLES-BEGIN"
cat "$d/samples"
echo "SAMPLES-END"
"""


# -- parsing -----------------------------------------------------------------------------------
_NUM = r"(\d{1,9}(?:\.\d{1,6})?)"
_BUS = r"([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])"
_PATTERNS = {
    "device": re.compile(rf"DEVICE (\d{{1,3}}) bus={_BUS} cc=(\d{{1,2}}\.\d{{1,2}}) "
                         r"sms=\d{1,5} mem_mib=\d{1,9}"),
    "cuda": re.compile(r"CUDA devices=(\d{1,3}) runtime=\d{1,9} driver=\d{1,9}"),
    "matmul": re.compile(rf"MATMUL (\d{{1,3}}) (bf16|fp16|tf32|fp32) {_NUM}"),
    "per_gpu": re.compile(rf"(MEMBW|H2D|D2H) (\d{{1,3}}) {_NUM}"),
    "p2p": re.compile(rf"P2P (\d{{1,3}}) (\d{{1,3}}) {_NUM} (peer|staged)"),
    "nccl": re.compile(rf"NCCL allreduce bytes=(\d{{1,15}}) busbw={_NUM} algbw={_NUM}"),
    "nccl_missing": re.compile(r"NCCL unavailable (.{0,200})"),
    "nccl_version": re.compile(r"NCCL version=(\d{1,9})"),
    "error": re.compile(r"ERROR (.{1,300})"),
}


@dataclass
class NodeReading:
    """What one node's script reported, every value parsed (nothing from the node is kept as
    raw text except in the error/notes lists, which reports show escaped)."""
    pci_gpus: int = 0
    module: str = ""
    smi_exit: int | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)   # one per nvidia-smi GPU
    xids: list[dict[str, Any]] = field(default_factory=list)
    build: str = ""
    bench_exit: int | None = None
    cuda_devices: int | None = None
    devices: dict[int, dict[str, str]] = field(default_factory=dict)   # CUDA index -> bus, cc
    figures: dict[str, dict[int, float]] = field(default_factory=dict)  # metric -> CUDA index
    p2p: list[dict[str, Any]] = field(default_factory=list)
    nccl: dict[str, Any] = field(default_factory=dict)
    samples: dict[int, dict[str, Any]] = field(default_factory=dict)   # smi index -> maxima
    busy: dict[str, int] = field(default_factory=dict)   # bus -> processes before the benchmark
    errors: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


def _int(text: str) -> int | None:
    text = text.strip()
    if text.startswith("0x"):
        try:
            return int(text, 16)
        except ValueError:
            return None
    return int(text) if text.isdigit() else None


def _float(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def _smi_row(line: str) -> dict[str, Any] | None:
    cells = [c.strip() for c in line.split(", ")]
    if len(cells) != len(HEALTH_FIELDS) or not cells[0].isdigit():
        return None
    raw = dict(zip(HEALTH_FIELDS, cells, strict=True))
    if not re.fullmatch(_BUS, raw["pci.bus_id"]):
        return None
    row: dict[str, Any] = {"index": int(raw["index"]), "bus": bus_key(raw["pci.bus_id"]),
                           "name": raw["name"][:100]}
    for k in ("pcie.link.gen.max", "pcie.link.width.max", "pcie.link.width.current",
              "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
              "temperature.gpu"):
        row[k] = _int(raw[k])
    for k in ("power.limit", "power.default_limit"):
        row[k] = _float(raw[k])
    for k in ("ecc.mode.current", "retired_pages.pending", "remapped_rows.pending",
              "remapped_rows.failure", "persistence_mode", "driver_version"):
        row[k] = raw[k][:40]
    return row


def _sample(line: str, into: dict[int, dict[str, Any]]) -> None:
    cells = [c.strip() for c in line.split(", ")]
    if len(cells) != len(SAMPLE_FIELDS) or not cells[0].isdigit():
        return
    i = int(cells[0])
    s = into.setdefault(i, {"link_gen": 0, "link_width": 0, "temperature": 0,
                            "power": 0.0, "reasons": 0})
    gen, width, temp = _int(cells[1]), _int(cells[2]), _int(cells[3])
    power, reasons = _float(cells[4]), _int(cells[5])
    s["link_gen"] = max(s["link_gen"], gen or 0)
    s["link_width"] = max(s["link_width"], width or 0)
    s["temperature"] = max(s["temperature"], temp or 0)
    s["power"] = max(s["power"], power or 0.0)
    s["reasons"] |= reasons or 0


def parse(output: str) -> NodeReading:
    r = NodeReading()
    section = ""
    names = {"MEMBW": "membw", "H2D": "h2d", "D2H": "d2h"}
    for line in output.splitlines():
        line = line.rstrip()
        if line in ("SMI-BEGIN", "APPS-BEGIN", "XID-BEGIN", "SAMPLES-BEGIN"):
            section = line.split("-")[0]
            continue
        if line.startswith(("SMI-END", "APPS-END", "XID-END", "SAMPLES-END")):
            if line.startswith("SMI-END "):
                r.smi_exit = _int(line[len("SMI-END "):])
            section = ""
            continue
        if section == "SMI":
            row = _smi_row(line)
            if row is not None:
                r.gpus.append(row)
            elif line.strip():
                r.errors.append(f"nvidia-smi: {line[:200]}")
            continue
        if section == "APPS":  # "00000000:18:00.0, 4242": a process on that GPU
            bus, _, pid = line.partition(", ")
            if re.fullmatch(_BUS, bus.strip()) and pid.strip().isdigit():
                key = bus_key(bus.strip())
                r.busy[key] = r.busy.get(key, 0) + 1
            continue
        if section == "XID":
            if (x := parse_xid(line)) is not None:
                r.xids.append({"uptime_s": x.uptime_s, "bus": f"{x.bus}.0", "xid": x.xid,
                               "text": x.text})
            continue
        if section == "SAMPLES":
            _sample(line, r.samples)
            continue
        if m := re.fullmatch(r"PCI-GPUS (\d{1,3})", line):
            r.pci_gpus = int(m.group(1))
        elif m := re.fullmatch(r"MODULE ([0-9.]{0,20})", line):
            r.module = m.group(1)
        elif line.startswith("BUILD "):
            r.build = line[len("BUILD "):][:200]
        elif m := re.fullmatch(r"BENCH-EXIT (\d{1,3})", line):
            r.bench_exit = int(m.group(1))
        elif m := _PATTERNS["cuda"].fullmatch(line):
            r.cuda_devices = int(m.group(1))
        elif m := _PATTERNS["device"].fullmatch(line):
            r.devices[int(m.group(1))] = {"bus": bus_key(m.group(2)), "cc": m.group(3)}
        elif m := _PATTERNS["matmul"].fullmatch(line):
            r.figures.setdefault(f"matmul_{m.group(2)}", {})[int(m.group(1))] = float(m.group(3))
        elif m := _PATTERNS["per_gpu"].fullmatch(line):
            r.figures.setdefault(names[m.group(1)], {})[int(m.group(2))] = float(m.group(3))
        elif m := _PATTERNS["p2p"].fullmatch(line):
            r.p2p.append({"src": int(m.group(1)), "dst": int(m.group(2)),
                          "value": float(m.group(3)), "path": m.group(4)})
        elif m := _PATTERNS["nccl"].fullmatch(line):
            r.nccl.update(bytes=int(m.group(1)), busbw=float(m.group(2)),
                          algbw=float(m.group(3)))
        elif m := _PATTERNS["nccl_version"].fullmatch(line):
            r.nccl["version"] = int(m.group(1))
        elif m := _PATTERNS["nccl_missing"].fullmatch(line):
            r.nccl["missing"] = m.group(1)
        elif m := _PATTERNS["error"].fullmatch(line):
            r.errors.append(m.group(1))
    if r.build.startswith("failed"):
        r.errors.append("nvcc could not build the benchmark: " + r.build)
    return r
