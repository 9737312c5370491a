"""The node side of `verify --local`: one POSIX sh script that counts the GPUs nvidia-smi sees,
then runs a vector add on each, compiled with the host's nvcc for the GPU's own architecture
(so no PTX is JIT-compiled at the first launch), or with PyTorch from the first interpreter that
has it with CUDA. Its lines for gpuk8s (parsed by :func:`gpuk8s.gpucheck.parse_check`):

- ``SMI-GPUS <n>``; ``RUNNER nvcc <version>`` or ``RUNNER torch <version> ... with <python>``
- ``ARCH <flags>`` (``-arch=native``, ``-arch=sm_90``, ``-gencode=...``, ``default``) and
  ``COMPILE-MS <ms>`` (nvcc's wall time)
- ``PYTHON <path>: <status>`` for every interpreter asked whether it has PyTorch with CUDA
- per GPU, from the program: ``OK|FAIL GPU <i> ...`` then
  ``TIMING GPU <i> kernel_ms=<ms> first_launch_ms=<ms>``

Every value from outside gpuk8s's own text (interpreter paths, compute capabilities from the
facts) reaches the script through :func:`gpuk8s.sinks.shell`."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from gpuk8s.sinks import shell

#: where nvcc is looked for when it is not on PATH, in this order (gpuk8s's own globs, put in
#: the script unquoted so that they expand)
NVCC_FALLBACKS = ("/usr/local/cuda/bin/nvcc", "/usr/local/cuda-*/bin/nvcc")
#: the first nvcc release with ``-arch=native`` (CUDA 11.6); older ones get ``-arch=sm_XY``
NATIVE_ARCH_SINCE = (11, 6)
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
#: interpreters tried on a host reached over SSH: python3 on the login PATH, then the system ones
REMOTE_PYTHONS = ("python3", *SYSTEM_PYTHONS)
#: a compute capability as nvidia-smi prints it ("9.0", "12.0")
_CAP = re.compile(r"\d{1,2}\.\d{1,2}")
_EOF = "GPUK8S_EOF"
#: the script's last line when nothing can compute (exit 3): nvcc missing, or left out
NO_COMPUTE = "no CUDA compiler (nvcc) and no PyTorch with CUDA"
NO_TORCH_NVCC_LEFT_OUT = "nvcc left out (--without-nvcc) and no PyTorch with CUDA"


def local_pythons(executable: str | None = None, base_prefix: str | None = None,
                  path: str | None = None) -> tuple[str, ...]:
    """Interpreters tried on this machine (``ansible_connection: local``), in order: the one
    running gpuk8s (a venv's python cannot import the system site-packages, where a system
    PyTorch lives), every other python3 on the user's PATH (a PyTorch venv such as
    /opt/torch/.venv; the check's own script runs with a fixed PATH, so they are resolved
    here), the system ones, then python3 of the installation the venv was made from."""
    executable = sys.executable if executable is None else executable
    base = str(Path(sys.base_prefix if base_prefix is None else base_prefix) / "bin" / "python3")
    on_path = [str(Path(d) / "python3") for d in
               (os.environ.get("PATH", "") if path is None else path).split(os.pathsep)
               if d and os.access(Path(d) / "python3", os.X_OK)
               and Path(d) != Path(executable).parent]  # the running venv's python3 again
    return tuple(dict.fromkeys(p for p in (executable, *on_path, *SYSTEM_PYTHONS, base) if p))


def arch_caps(caps: Sequence[str]) -> tuple[str, ...]:
    """The well-formed compute capabilities of ``caps`` (from the facts: node output), unique."""
    return tuple(dict.fromkeys(c.strip() for c in caps if _CAP.fullmatch(c.strip())))


def _data(name: str) -> str:
    text = resources.files("gpuk8s").joinpath(f"data/{name}").read_text()
    if any(line == _EOF for line in text.splitlines()):  # pragma: no cover - our own files
        raise ValueError(f"data/{name} holds the heredoc delimiter {_EOF}")
    return text if text.endswith("\n") else text + "\n"


def _nvcc_part(caps: Sequence[str], nvcc_fallbacks: Sequence[str]) -> str:
    """Find nvcc; build with -arch=native (nvcc >= 11.6), else -arch=sm_XY for the GPUs'
    compute capabilities (the facts', else nvidia-smi's), else nvcc's default (PTX, JIT at the
    first launch); a flag nvcc refuses falls through to the next. Times the build."""
    major, minor = NATIVE_ARCH_SINCE
    lookup = "" if not nvcc_fallbacks else f"""
if [ -z "$nvcc" ]; then
  for f in {" ".join(nvcc_fallbacks)}; do [ -x "$f" ] && {{ nvcc=$f; break; }}; done
fi"""
    return f"""nvcc=$(command -v nvcc 2>/dev/null){lookup}
if [ -n "$nvcc" ]; then
  cat > "$d/vecadd.cu" <<'{_EOF}'
{_data("vecadd.cu")}{_EOF}
  ver=$("$nvcc" --version 2>/dev/null \\
    | sed -n 's/.*release \\([0-9][0-9]*\\.[0-9][0-9]*\\).*/\\1/p' | head -n1)
  echo "RUNNER nvcc $ver"
  native=""
  case $ver in
    [0-9]*.[0-9]*) maj=${{ver%%.*}}; min=${{ver#*.}}
      if [ "$maj" -gt {major} ] || {{ [ "$maj" -eq {major} ] && [ "$min" -ge {minor} ]; }}; then
        native=-arch=native
      fi;;
  esac
  caps={shell(" ".join(arch_caps(caps)))}
  [ -n "$caps" ] || caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null)
  sm=""
  for c in $caps; do
    case $c in *[!0-9.]*|*.*.*|.*|*.) continue;; *.*) ;; *) continue;; esac
    s=${{c%.*}}${{c#*.}}
    case " $sm " in *" $s "*) ;; *) sm="$sm $s";; esac
  done
  set -- $sm
  if [ $# -eq 1 ]; then sm=-arch=sm_$1; else
    sm=""; for s in "$@"; do sm="$sm -gencode=arch=compute_$s,code=sm_$s"; done; sm=${{sm# }}
  fi
  built=""
  for flags in "$native" "$sm" default; do
    [ -n "$flags" ] || continue
    f=$flags; [ "$f" = default ] && f=""
    t0=$(now_ms)
    if "$nvcc" -O2 $f -o "$d/vecadd" "$d/vecadd.cu" > "$d/nvcc.log" 2>&1; then
      t1=$(now_ms)
      # -arch=native that saw no GPU builds for nvcc's default: use the known sm_XY instead
      if [ "$flags" != "$native" ] || [ -z "$sm" ] \
          || ! grep -q 'Cannot find valid GPU' "$d/nvcc.log"; then built=$flags; break; fi
    fi
    echo "nvcc $flags not used:"; cat "$d/nvcc.log"
  done
  [ -n "$built" ] || exit 4
  cat "$d/nvcc.log"
  echo "ARCH $built"
  [ -n "$t0" ] && [ -n "$t1" ] && echo "COMPILE-MS $((t1 - t0))"
  i=0; rc=0
  while [ "$i" -lt "$n" ]; do "$d/vecadd" "$i" || rc=1; i=$((i + 1)); done
  exit $rc
fi
"""


def _torch_part(pythons: Sequence[str], nvcc: bool = True) -> str:
    """Ask each interpreter in turn (a bare name is looked up on PATH) whether it has PyTorch
    with CUDA; run the vector add with the first that has; else exit 3 (saying whether nvcc
    was missing or left out)."""
    none = NO_COMPUTE if nvcc else NO_TORCH_NVCC_LEFT_OUT
    return f"""cat > "$d/torch_probe.py" <<'{_EOF}'
{_data("torch_probe.py")}{_EOF}
py=""; seen="|"
for p in {" ".join(shell(p) for p in pythons)}; do
  case $p in
    */*) ;;
    *) q=$(command -v "$p" 2>/dev/null)
       case $q in /*) p=$q;; *) echo "PYTHON $p: not on PATH"; continue;; esac;;
  esac
  case $seen in *"|$p|"*) continue;; esac
  seen="$seen$p|"
  if [ ! -x "$p" ]; then echo "PYTHON $p: not found"; continue; fi
  r=$("$p" "$d/torch_probe.py" 2>&1); prc=$?
  r=$(printf '%s\\n' "$r" | tail -n 1)
  [ -n "$r" ] || r="exit code $prc, no output"
  echo "PYTHON $p: $r"
  if [ "$prc" -eq 0 ]; then py=$p; break; fi
done
if [ -z "$py" ]; then
  echo "{none}: cannot run a computation"; exit 3
fi
echo "RUNNER $r with $py"
cat > "$d/torch_vecadd.py" <<'{_EOF}'
{_data("torch_vecadd.py")}{_EOF}
"$py" "$d/torch_vecadd.py"
"""


def check_script(caps: Sequence[str] = (), pythons: Sequence[str] = REMOTE_PYTHONS, *,
                 nvcc: bool = True, nvcc_fallbacks: Sequence[str] = NVCC_FALLBACKS) -> str:
    """The whole check. ``caps``: the GPUs' compute capabilities from the facts (nvidia-smi is
    asked when empty); ``pythons``: interpreters for the PyTorch fallback, in order;
    ``nvcc=False`` skips the compiler (to exercise the fallback on a host that has one).
    Exit codes: 0 all right, 1 a GPU failed, 3 nothing can compute, 4 nvcc failed."""
    return f"""exec 2>&1
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
now_ms() {{ t=$(date +%s%N 2>/dev/null); case $t in ''|*[!0-9]*) ;; *) echo $((t / 1000000));;
  esac; }}
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
echo "SMI-GPUS $n"
{_nvcc_part(caps, nvcc_fallbacks) if nvcc else ""}{_torch_part(pythons, nvcc)}"""
