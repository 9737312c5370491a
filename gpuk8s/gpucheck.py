"""Node-level GPU smoke test (`verify --local`): nvidia-smi must see every PCI GPU, and a CUDA
computation must run on each GPU and give the right answer. Runs through the same transports as
everything else, so it works on this machine (ansible_connection: local) or over SSH."""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import closing
from importlib import resources
from pathlib import Path
from typing import Any

from gpuk8s.errors import Gpuk8sError
from gpuk8s.facts.gather import gather
from gpuk8s.facts.nvidia import Nvidia
from gpuk8s.facts.system import PciDevices
from gpuk8s.ops import Op
from gpuk8s.report import Reporter
from gpuk8s.session import open_session
from gpuk8s.transport import ConnectSpec, Redactor, open_transport

TORCH_CHECK = """\
import torch
for i in range(torch.cuda.device_count()):
    n = 1 << 24
    a = (torch.arange(n, dtype=torch.float32) % 1024).to(f"cuda:{i}")
    b = (2 * (torch.arange(n, dtype=torch.float32) % 2048)).to(f"cuda:{i}")
    c = (a + b).cpu()
    bad = int((c != a.cpu() + b.cpu()).sum())
    name = torch.cuda.get_device_name(i)
    print(("FAIL" if bad else "OK") + f" GPU {i} {name}: vecadd of {n} floats: {bad} wrong")
"""


def check_script() -> str:
    """Compile and run the CUDA vector add on every GPU with nvcc; without a compiler, run the
    same computation with PyTorch; without either, say so (exit 3)."""
    source = resources.files("gpuk8s").joinpath("data/vecadd.cu").read_text()
    return f"""exec 2>&1
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
echo "SMI-GPUS $n"
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc 2>/dev/null \\
  | head -n1)
if [ -n "$nvcc" ]; then
  cat > "$d/vecadd.cu" <<'GPUK8S_EOF'
{source}GPUK8S_EOF
  echo "RUNNER nvcc $("$nvcc" --version | sed -n 's/.*release \\([0-9.]*\\),.*/\\1/p')"
  "$nvcc" -O2 -o "$d/vecadd" "$d/vecadd.cu" || exit 4
  i=0; rc=0
  while [ "$i" -lt "$n" ]; do "$d/vecadd" "$i" || rc=1; i=$((i + 1)); done
  exit $rc
elif python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  echo "RUNNER torch $(python3 -c 'import torch; print(torch.__version__)')"
  python3 - <<'GPUK8S_EOF'
{TORCH_CHECK}GPUK8S_EOF
else
  echo "no CUDA compiler (nvcc) and no PyTorch with CUDA: cannot run a computation"; exit 3
fi
"""


#: the check's "SMI-GPUS <count>" line (gpuk8s's own echo; a node may print anything)
_SMI_GPUS = re.compile(r"SMI-GPUS (\d{1,6})\s*")


def parse_check(output: str, exit_code: int, pci_gpus: int) -> dict[str, Any]:
    """Judge the check's output: every PCI GPU seen by nvidia-smi and computed right on.

    The output comes from the node, so it is not trusted to be well formed: a malformed
    ``SMI-GPUS`` line fails the host's check with an error naming the line, never raises."""
    lines = output.splitlines()
    smi_line = next((x for x in lines if x.startswith("SMI-GPUS")), None)
    count = _SMI_GPUS.fullmatch(smi_line) if smi_line is not None else None
    smi = int(count.group(1)) if count else 0
    runner = next((x.split(" ", 1)[1] for x in lines if x.startswith("RUNNER ")), "")
    gpus = [x for x in lines if re.match(r"(OK|FAIL) GPU \d+ ", x)]
    ok = (exit_code == 0 and smi == pci_gpus and len(gpus) == pci_gpus
          and all(x.startswith("OK") for x in gpus))
    error = "" if ok else "\n".join(lines[-5:])
    if smi_line is not None and count is None:
        ok = False
        error = f"malformed nvidia-smi count line from the check: {smi_line[:200]!r}"
    return {"pci_gpus": pci_gpus, "nvidia_smi_gpus": smi, "runner": runner, "results": gpus,
            "ok": ok, "error": error}


def verify_local(inventory: str | Path, *, limit: str | None = None,
                 reporter: Reporter | None = None,
                 opener: Callable[[ConnectSpec, Redactor], Any] = open_transport
                 ) -> list[dict[str, Any]]:
    """Run the node GPU check on every GPU host in scope; return one row per host."""
    session = open_session(inventory, limit=limit, sets=(), command="verify-local",
                               reporter=reporter, opener=opener)
    with closing(session):
        gather(session, session.scope)
        rows: list[dict[str, Any]] = []
        for host in session.scope:
            pci = [d for d in session.facts[host][PciDevices()] if d.is_gpu]
            if not pci:
                continue
            op = Op("verify-local | GPU check", ("set +e", check_script()),
                    "+ nvidia-smi and a CUDA vecadd on every GPU", timeout=600)
            rc, out = session.runner(host).run_now([op], keep_going=True)[0]
            rows.append({"host": host, "driver": session.facts[host][Nvidia()].loaded_version,
                         **parse_check(out, rc, len(pci))})
        _print(session.reporter, rows)
        session.runlog.write_report(verify_local=rows)
        if not rows:
            raise Gpuk8sError("no host in scope has an NVIDIA GPU on its PCI bus")
        failed = [r["host"] for r in rows if not r["ok"]]
        if failed:
            raise Gpuk8sError(f"GPU check failed on {', '.join(failed)}")
        return rows


def _print(rep: Reporter, rows: list[dict[str, Any]]) -> None:
    """The table; every value but the counts comes from the node, so each cell is a
    :meth:`Reporter.cell` (plain text, control characters escaped), never markup."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="node GPU check", title_justify="left")
    for col in ("host", "PCI GPUs", "nvidia-smi", "driver", "computation", "result"):
        table.add_column(col)
    for r in rows:
        result = Text("ok", style="green") if r["ok"] else \
            Text.assemble(("FAILED", "red"), "\n", rep.cell(r["error"]))
        table.add_row(rep.cell(r["host"]), str(r["pci_gpus"]), str(r["nvidia_smi_gpus"]),
                      rep.cell(r["driver"]),
                      rep.cell(r["runner"] + "\n" + "\n".join(r["results"])), result)
    rep.console.print(table)
