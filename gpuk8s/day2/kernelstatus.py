"""status's view of a GPU node's kernel and driver: the running and newest installed kernel,
the NVIDIA module for each installed kernel, the loaded module against the user-space
library ("reboot pending"), the CDI spec's driver, and whether gpu_node_lock holds them."""

from __future__ import annotations

import re
import textwrap
from typing import Any

from gpuk8s.facts import HostFacts
from gpuk8s.facts.kernel import GpuKernel, LockPackages
from gpuk8s.facts.nvidia import Nvidia

#: nvidia-smi's second line on a mismatch (driver 535 and later): the library's major.minor
#: only, e.g. "NVML library version: 580.178" (docs/research/issue-32-upstream-facts.md §3)
_NVML_LIBRARY = re.compile(r"NVML library version:\s*(\d+\.\d+(?:\.\d+)?)")
MISMATCH = "Driver/library version mismatch"


def _same(loaded: str, library: str) -> bool:
    """Versions equal, or one the other's prefix (nvidia-smi shows major.minor only)."""
    a, b = loaded.split("."), library.split(".")
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def kernel_row(facts: HostFacts, locked: bool) -> dict[str, Any] | None:
    """The row's "kernel" entry for a GPU node (None elsewhere or when not probed)."""
    state = facts.get(GpuKernel())
    if state is None or not state.present:
        return None
    nv = facts.get(Nvidia())
    pkgs = facts.get(LockPackages())
    loaded = state.loaded or (nv.loaded_version if nv and nv.exit_code == 0 else "")
    library = state.library
    mismatch = bool(nv and MISMATCH in nv.error)
    if not library and nv:
        m = _NVML_LIBRARY.search(nv.error)
        library = m.group(1) if m else (nv.loaded_version if nv.exit_code == 0 else "")
    pending = mismatch or bool(loaded and library and not _same(loaded, library))
    kernels = [{"release": k.release, "running": k.release == state.running,
                "nvidia_module": k.module_version or ("present" if k.module else "")}
               for k in state.kernels]
    row: dict[str, Any] = {
        "running": state.running, "newest": state.newest, "kernels": kernels,
        "loaded_module": loaded, "library": library, "reboot_pending": pending,
        "locked": locked,
        "unheld": pkgs.unheld if pkgs and locked else [],
        "waiting": dict(sorted(pkgs.waiting.items())) if pkgs else {},
    }
    if state.cdi_spec:
        row["cdi_spec"] = {"path": state.cdi_spec, "driver": state.cdi_driver,
                           "stale": bool(state.cdi_driver and library
                                         and not _same(state.cdi_driver, library))}
    return row


def kernel_lines(host: str, row: dict[str, Any]) -> list[tuple[str, str]]:
    """(text, style) lines for one GPU node, each within 80 columns where its words allow
    (status's default view fits 80): its summary, then each warning."""
    running, newest = row["running"], row["newest"]
    mod = {k["release"]: k["nvidia_module"] for k in row["kernels"]}
    loaded, library = row["loaded_module"], row["library"] or "?"
    if not row["reboot_pending"]:
        driver = f"driver {loaded or '?'} loaded = library"
    elif loaded:
        driver = f"driver {loaded} loaded, library {library}: REBOOT PENDING"
    else:  # nvidia-smi's mismatch, where the kernel does not show the loaded version
        driver = f"nvidia-smi: {MISMATCH} (library {library}): REBOOT PENDING"
    summary = (f"{host}: kernel {running}" + (" (newest installed)" if newest == running
                                              else f", {newest} installed")
               + f", NVIDIA module {mod.get(running) or 'none'}; {driver}; "
               + ("held (gpu_node_lock)" if row["locked"] else "NOT held (gpu_node_lock false)"))
    out = [(summary, "red" if row["reboot_pending"] else "")]
    warn = "yellow"
    if not row["locked"]:
        out.append((f"warning: gpu_node_lock is false on {host}: unattended-upgrades or apt "
                    "may install a new kernel or driver library, which the loaded module will "
                    "not match until a reboot", warn))
    for k in row["kernels"]:
        if not k["nvidia_module"]:
            why = (": the GPUs are lost if it boots" if not k["running"] else
                   ": loaded now, it would not load at the next boot" if row["loaded_module"]
                   else "")
            out.append((f"warning: no NVIDIA module for kernel {k['release']} under "
                        f"/lib/modules{why} (install linux-headers-{k['release']}, then "
                        f"dkms autoinstall -k {k['release']})", warn))
    if row["reboot_pending"]:
        out.append((f"{host} runs driver module {loaded or 'of another version'} but its "
                    f"library is {library}: GPU pods fail at their next start until it "
                    "reboots (drain it first)", "red"))
    if row["unheld"]:
        out.append((f"warning: not held: {', '.join(row['unheld'])} (invoke bootstrap holds "
                    "them again)", warn))
    if row["waiting"]:
        out.append(("held back: " + ", ".join(f"{n} {v}" for n, v in row["waiting"].items())
                    + " (invoke upgrade --kernel / --driver)", "dim"))
    cdi = row.get("cdi_spec")
    if cdi and cdi["stale"]:
        out.append((f"warning: CDI spec {cdi['path']} was made for driver {cdi['driver']}, "
                    f"the library is {library}: regenerate it (systemctl restart "
                    "nvidia-cdi-refresh.service)", warn))
    lines = []
    for i, (text, style) in enumerate(out):
        first, rest = ("", "  ") if i == 0 else ("  ", "    ")
        lines += [(line, style) for line in textwrap.wrap(
            text, 80, initial_indent=first, subsequent_indent=rest,
            break_long_words=False, break_on_hyphens=False)]
    return lines
