"""Node-level GPU smoke test (`verify --local`): nvidia-smi must see every PCI GPU, and a CUDA
computation must run on each GPU and give the right answer. Runs through the same transports as
everything else, so it works on this machine (ansible_connection: local) or over SSH."""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from gpuk8s.errors import Gpuk8sError
from gpuk8s.facts.gather import gather
from gpuk8s.facts.nvidia import Nvidia
from gpuk8s.facts.system import PciDevices
from gpuk8s.gpucheck_script import (
    NO_COMPUTE,
    NO_TORCH_NVCC_LEFT_OUT,
    REMOTE_PYTHONS,
    check_script,
    local_pythons,
)
from gpuk8s.ops import Op
from gpuk8s.report import Reporter
from gpuk8s.session import open_session
from gpuk8s.transport import ConnectSpec, Redactor, open_transport

#: the check's "SMI-GPUS <count>" line (gpuk8s's own echo; a node may print anything)
_SMI_GPUS = re.compile(r"SMI-GPUS (\d{1,6})\s*")
_RESULT = re.compile(r"(OK|FAIL) GPU (\d{1,4}) ")
_MS = r"(\d{1,9}(?:\.\d{1,6})?)"
#: the program's "TIMING GPU <i> kernel_ms=<ms> first_launch_ms=<ms>" line
_TIMING = re.compile(rf"TIMING GPU (\d{{1,4}}) kernel_ms={_MS} first_launch_ms={_MS}\s*")
_COMPILE = re.compile(rf"COMPILE-MS {_MS}\s*")
_CUDA = re.compile(r"(\d{1,3})\.(\d{1,3})")
#: the check's own exit codes (gpucheck_script.check_script), and the executor's for a timeout
_EXIT_CAUSE = {3: "nothing could compute", 4: "nvcc could not build the check",
               124: "the check timed out"}


def _first(lines: list[str], prefix: str) -> str:
    return next((x[len(prefix):] for x in lines if x.startswith(prefix)), "")


def nvcc_package(cuda_version: str) -> str:
    """The apt package of nvcc for the driver's CUDA version ("13.0" -> cuda-nvcc-13-0)."""
    m = _CUDA.fullmatch(cuda_version.strip())
    return f"cuda-nvcc-{m.group(1)}-{m.group(2)}" if m else "cuda-nvcc-<major>-<minor>"


def parse_check(output: str, exit_code: int, pci_gpus: int, *, cuda_version: str = ""
                ) -> dict[str, Any]:
    """Judge the check's output: every PCI GPU seen by nvidia-smi and computed right on; also
    read nvcc's flags and build time, each GPU's kernel and first-launch times, and the
    interpreters asked for PyTorch. ``cuda_version`` (the driver's) names the nvcc package in
    the fix when nothing could compute.

    The output comes from the node, so it is not trusted to be well formed: a malformed
    ``SMI-GPUS`` line fails the host's check with an error naming the line, never raises; a
    malformed timing line is left out."""
    lines = output.splitlines()
    smi_line = next((x for x in lines if x.startswith("SMI-GPUS")), None)
    count = _SMI_GPUS.fullmatch(smi_line) if smi_line is not None else None
    smi = int(count.group(1)) if count else 0
    gpus = [x for x in lines if _RESULT.match(x)]
    compile_ms = next((float(m.group(1)) for x in lines if (m := _COMPILE.fullmatch(x))), None)
    timings = [{"gpu": int(m.group(1)), "kernel_ms": float(m.group(2)),
                "first_launch_ms": float(m.group(3))}
               for x in lines if (m := _TIMING.fullmatch(x))]
    pythons = [{"path": path, "status": status} for path, _, status in
               (x[len("PYTHON "):].partition(": ") for x in lines if x.startswith("PYTHON "))]
    ok = (exit_code == 0 and smi == pci_gpus and len(gpus) == pci_gpus
          and all(x.startswith("OK") for x in gpus))
    error = "" if ok else "\n".join(lines[-5:])
    none = next((x for x in lines if x.startswith((NO_COMPUTE, NO_TORCH_NVCC_LEFT_OUT))), "")
    if exit_code == 3 and none:
        tried = "; ".join(f"{p['path']}: {p['status']}" for p in pythons) or "none"
        if none.startswith(NO_TORCH_NVCC_LEFT_OUT):  # nvcc may well be there: not asked
            error = (f"{NO_TORCH_NVCC_LEFT_OUT}. Python interpreters tried: {tried}. Fix: "
                     "install PyTorch with CUDA for one of these interpreters, or name one "
                     "that has it (--python PATH); or run without --without-nvcc")
        else:
            error = (f"{NO_COMPUTE}. Python interpreters tried: {tried}. Fix: install nvcc "
                     f"(apt-get install {nvcc_package(cuda_version)}, from NVIDIA's CUDA "
                     "repository), or PyTorch with CUDA for one of these interpreters (or "
                     "name one that has it: --python PATH)")
    if smi_line is not None and count is None:
        ok = False
        error = f"malformed nvidia-smi count line from the check: {smi_line[:200]!r}"
    cause = "" if ok else _cause(smi_line is not None and count is None, none, exit_code,
                                 smi, pci_gpus, gpus)
    return {"pci_gpus": pci_gpus, "nvidia_smi_gpus": smi, "runner": _first(lines, "RUNNER "),
            "arch": _first(lines, "ARCH "), "compile_ms": compile_ms, "pythons": pythons,
            "results": gpus, "timings": timings, "ok": ok, "cause": cause, "error": error}


def _cause(malformed: bool, none: str, exit_code: int, smi: int, pci_gpus: int,
           results: list[str]) -> str:
    """A failed check's cause in a few words (the table's cell); the whole output is in the
    run's log, the detail and fix in the error."""
    if malformed:
        return "malformed nvidia-smi count line"
    if none:
        return none.partition(":")[0].replace("no CUDA compiler (nvcc)", "no nvcc")
    if smi != pci_gpus:
        return f"nvidia-smi sees {smi} of {pci_gpus} PCI GPUs"
    failed = [f"GPU {m.group(2)}" for x in results
              if (m := _RESULT.match(x)) and m.group(1) == "FAIL"]
    if failed:
        return "wrong results on " + ", ".join(failed)
    if exit_code in _EXIT_CAUSE:
        return _EXIT_CAUSE[exit_code]
    if len(results) != pci_gpus:
        return f"{len(results)} of {pci_gpus} GPUs computed (exit code {exit_code})"
    return f"exit code {exit_code}"


def verify_local(inventory: str | Path, *, limit: str | None = None,
                 reporter: Reporter | None = None,
                 opener: Callable[[ConnectSpec, Redactor], Any] = open_transport,
                 nvcc: bool = True, python: str | None = None) -> list[dict[str, Any]]:
    """Run the node GPU check on every GPU host in scope; return one row per host.
    ``nvcc=False`` leaves the compiler out, to exercise the PyTorch fallback; ``python``: the
    one interpreter the PyTorch path uses (on this machine it must exist; over SSH it is the
    node's path, or a name looked up on the node's PATH)."""
    python = _python_arg(python)
    session = open_session(inventory, limit=limit, sets=(), command="verify-local",
                           reporter=reporter, opener=opener)
    with closing(session):
        gather(session, session.scope)
        rows: list[dict[str, Any]] = []
        for host in session.scope:
            pci = [d for d in session.facts[host][PciDevices()] if d.is_gpu]
            if not pci:
                continue
            state = session.facts[host][Nvidia()]
            # this machine: the interpreter running gpuk8s first; over SSH, the node's own
            local = session.host(host).connection == "local"
            pythons = (_local_python(python) if local else python,) if python else \
                local_pythons() if local else REMOTE_PYTHONS
            script = check_script([g.compute_cap for g in state.gpus], pythons, nvcc=nvcc)
            op = Op("verify-local | GPU check", ("set +e", script),
                    "+ nvidia-smi and a CUDA vecadd on every GPU", timeout=600)
            rc, out = session.runner(host).run_now([op], keep_going=True)[0]
            rows.append({"host": host, "driver": state.loaded_version,
                         **parse_check(out, rc, len(pci), cuda_version=state.cuda_version)})
        _print(session.reporter, rows)
        session.runlog.write_report(verify_local=rows)
        if not rows:
            raise Gpuk8sError("no host in scope has an NVIDIA GPU on its PCI bus")
        failed = [r for r in rows if not r["ok"]]
        if failed:
            raise Gpuk8sError(f"GPU check failed on {', '.join(r['host'] for r in failed)}"
                              + "".join(f"\n{r['host']}: {r['error']}\n  (the check's whole "
                                        f"output: {session.runlog.path / (r['host'] + '.log')})"
                                        for r in failed))
        return rows


def _python_arg(python: str | None) -> str | None:
    """``--python``: one interpreter path or name, refused when empty or not one word."""
    if python is None:
        return None
    if not python.strip() or any(c in python for c in "\n\r\0"):
        raise Gpuk8sError(f"--python {python!r}: give the path of a Python interpreter with "
                          "PyTorch and CUDA, e.g. --python /opt/torch/.venv/bin/python3")
    return python


def _local_python(python: str) -> str:
    """``--python`` on this machine: an executable (a name is looked up on PATH here, since
    the check's script runs with a fixed PATH), as an absolute path."""
    import os
    import shutil

    found = shutil.which(python) if os.sep not in python else python
    if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise Gpuk8sError(f"--python {python}: no such executable on this machine; give the "
                          "path of a Python interpreter with PyTorch and CUDA, e.g. --python "
                          "/opt/torch/.venv/bin/python3")
    return os.path.abspath(found)


def computation(row: dict[str, Any]) -> str:
    """The "computation" cell: how the check computed (nvcc's flags and build time, or which
    interpreter's PyTorch, after which others), then each GPU's line and its times."""
    head = [row["runner"]]
    if row.get("arch"):
        head.append(row["arch"])
    if row.get("compile_ms") is not None:
        head.append(f"compile {row['compile_ms']:g} ms")
    lines = [", ".join(x for x in head if x)]
    pythons = row.get("pythons") or []
    lines += [f"tried {p['path']}: {p['status']}" for p in pythons
              if row["runner"].startswith("torch") and not row["runner"].endswith(p["path"])]
    times = {t["gpu"]: t for t in row.get("timings") or []}
    for result in row["results"]:
        lines.append(result)
        m = _RESULT.match(result)
        t = times.get(int(m.group(2))) if m else None
        if t:
            lines.append(f"  kernel {t['kernel_ms']:.3f} ms, first launch "
                         f"{t['first_launch_ms']:.3f} ms")
    return "\n".join(lines)


def _print(rep: Reporter, rows: list[dict[str, Any]]) -> None:
    """The table, a line per host; then each host's computation (several lines: how, then
    each GPU's line and times) and a failure's text under it. Every value but the counts
    comes from the node, so each is plain text (control characters escaped), never markup."""
    from rich.text import Text

    from gpuk8s.report import Column

    cols = [Column("host"), Column("PCI GPUs", justify="right"),
            Column("nvidia-smi", justify="right"), Column("driver"), Column("result")]
    rep.table("node GPU check", cols, [
        [r["host"], str(r["pci_gpus"]), str(r["nvidia_smi_gpus"]), r["driver"],
         Text("ok", style="green") if r["ok"] else Text("FAILED", style="red")] for r in rows])
    for r in rows:
        how = computation(r).replace("\n", "\n  ")
        rep.console.print(Text.assemble(rep.cell(r["host"], "bold"), ": ", rep.cell(how)),
                          soft_wrap=True)
        if not r["ok"]:
            error = (r.get("cause") or r["error"]).replace("\n", "\n    ")
            rep.console.print(Text.assemble("  ", ("FAILED", "red"), ": ", rep.cell(error)),
                              soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m gpuk8s.gpucheck [-i inventories/local.yaml] [--without-nvcc]
    [--python PATH]``: the node GPU check without invoke (``invoke verify --local`` runs the
    same)."""
    import argparse
    import sys

    from gpuk8s.report import untrusted

    parser = argparse.ArgumentParser(prog="python -m gpuk8s.gpucheck", description=__doc__)
    parser.add_argument("--inventory", "-i", default="inventories/local.yaml")
    parser.add_argument("--limit", "-l")
    parser.add_argument("--without-nvcc", action="store_true",
                        help="leave nvcc out: run the PyTorch fallback")
    parser.add_argument("--python", metavar="PATH",
                        help="the Python interpreter whose PyTorch (with CUDA) the PyTorch path "
                             "uses, instead of trying the usual ones in turn")
    args = parser.parse_args(argv)
    try:
        verify_local(args.inventory, limit=args.limit, nvcc=not args.without_nvcc,
                     python=args.python)
    except Gpuk8sError as exc:
        print(f"error: {untrusted(exc)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
