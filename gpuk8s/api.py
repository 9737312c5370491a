"""The entry points tasks.py and the CLI call: bootstrap, plan, facts.

Each run: load and validate the inventory (no host contacted), connect to every host once, gather
facts with one probe per host, preflight, then per phase plan -> show -> apply -> barrier, probing
again only the hosts a phase changed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from gpuk8s.errors import ConnectError
from gpuk8s.facts import HostFacts
from gpuk8s.facts.gather import gather
from gpuk8s.facts.system import PciDevices, System
from gpuk8s.report import Reporter
from gpuk8s.runner import converge, fail_budget
from gpuk8s.session import open_session
from gpuk8s.transport import ConnectSpec, Redactor, open_transport


def bootstrap(inventory: str | Path, *, limit: str | None = None, check: bool = False,
              diff: bool = False, yes: bool = False, sets: Sequence[str] = (),
              reporter: Reporter | None = None, confirm: Callable[[str], bool] | None = None,
              opener: Callable[[ConnectSpec, Redactor], Any] = open_transport,
              ask_become_pass: bool = False, max_fail: int | str = 0,
              quiet: bool = False) -> dict[str, Any]:
    """Bring every host in the inventory (or ``limit``) to a Ready GPU cluster node.

    Args:
        inventory: path of the inventory (YAML or INI).
        limit: Ansible-style host pattern; the first control plane is always contacted.
        check: plan only: print what would change and change nothing (``invoke plan``).
        diff: show file diffs in the plan.
        yes: apply without asking.
        sets: ``key=value`` overrides, highest precedence.
        reporter: where output goes (a default one prints to stdout).
        confirm: asks the user; None with yes=False and a TTY prompts on stdin.
        opener: opens one host's transport (tests pass fakes).
        ask_become_pass: prompt for the sudo password of hosts that have none.
        max_fail: how many hosts (count, or "25%" of the run's hosts) may fail, unreachable
            at the start or lost on the way, while the others go on; those hosts are left
            out of later phases and the run still ends in an error naming them. 0: any
            failed host stops the run at the end of its phase.
        quiet: no plan listing and no progress while applying; problems, failures and the
            final table still print.

    Returns:
        A summary dict: changes planned/applied per host, wall time, run folder.
    """
    command = "plan" if check else "bootstrap"
    fail_budget(max_fail, 0)  # a bad --max-fail fails before any host is contacted
    session = open_session(inventory, limit=limit, sets=sets, command=command,
                           reporter=reporter or (Reporter(quiet=True) if quiet else None),
                           opener=opener,
                           password_prompt=_prompt() if ask_become_pass else None,
                           allow_unreachable=str(max_fail).strip() not in ("0", "0%"))
    with closing(session):
        return converge(session, check=check, diff=diff, yes=yes, confirm=confirm,
                        max_fail=max_fail)


def report(run: str | Path | None = None) -> Path:
    """Write a finished run's page, RUN_DIR/report.html (default: the latest run folder), and
    print its path; needs no inventory and makes no run folder of its own."""
    from gpuk8s import htmlreport

    return htmlreport.report(run)


def _prompt() -> Callable[[str], str]:
    import getpass

    return getpass.getpass


def plan(inventory: str | Path, **kwargs: Any) -> dict[str, Any]:
    """Show what bootstrap would change; change nothing on any host."""
    return bootstrap(inventory, check=True, **kwargs)


def facts(inventory: str | Path, *, limit: str | None = None, sets: Sequence[str] = (),
          reporter: Reporter | None = None, ask_become_pass: bool = False,
          as_json: bool = False) -> dict[str, Any]:
    """Gather every fact of every host (one probe per host); print a summary per host, or
    everything as JSON."""
    session = open_session(inventory, limit=limit, sets=sets, command="facts",
                           reporter=reporter,
                           password_prompt=_prompt() if ask_become_pass else None)
    with closing(session):
        gather(session, [h for h in session.scope if h in session.transports])
        data = {h: session.facts[h].as_json() for h in session.scope}
        if as_json:
            text = json.dumps(data, indent=2, default=_jsonable)
            session.reporter.console.print(session.redact(text), markup=False,
                                           highlight=False)
        else:
            for host in session.scope:
                session.reporter.print(f"\n{host}")
                for key, value in summary(session.facts[host]).items():
                    session.reporter.print(f"  {key:<18} {value}")
        # file contents among the facts (an apt proxy URL with its password) go redacted
        session.runlog.write_report(facts=json.loads(session.redact(
            json.dumps(data, default=_jsonable))))
        return data


def summary(facts: HostFacts) -> dict[str, str]:
    """What a lab admin wants to know about a box, from its facts, one line each."""
    from gpuk8s.facts.kube import Containerd
    from gpuk8s.facts.nvidia import CudaToolkits, GpuTopology, Nvidia
    from gpuk8s.facts.system import OsRelease

    os_ = facts[OsRelease()]
    sysinfo = facts[System()]
    pci = [d for d in facts[PciDevices()] if d.is_gpu]
    nv = facts[Nvidia()]
    out = {"os": os_.get("PRETTY_NAME", "?"),
           "kernel": f"{sysinfo.kernel} ({sysinfo.arch})",
           "cpus / memory": f"{sysinfo.cpus} / {sysinfo.memory_mb} MiB",
           "cgroup": "v2" if sysinfo.cgroup == "cgroup2fs" else f"v1 ({sysinfo.cgroup})",
           "secure boot": sysinfo.secure_boot,
           "init": sysinfo.init if sysinfo.systemd else f"{sysinfo.init} (not systemd)",
           "virt": (sysinfo.virt if sysinfo.virt_source == "systemd-detect-virt" else
                    f"{sysinfo.virt} (guessed: no systemd-detect-virt)")
           + (f"; from {sysinfo.virt_evidence}" if sysinfo.virt_evidence else
              ", hypervisor CPU flag" if sysinfo.hypervisor else ""),
           "time synced": sysinfo.time_synced,
           "listening": "unknown (no ss, no /proc/net/tcp)" if sysinfo.listening is None else
           " ".join(map(str, sysinfo.listening)) or "nothing",
           "kernel headers": "installed" if sysinfo.headers else
           "unknown (apt's lists are older than its sources)"
           if sysinfo.headers_candidate == "unknown" else
           f"not installed, apt has {sysinfo.headers_candidate}" if sysinfo.headers_candidate
           else "not installed, and no package source has them",
           "kernel modules": "loadable" if sysinfo.modprobe and sysinfo.modules_dir else
           "built-in or loaded only (" + ("no modprobe" if not sysinfo.modprobe else
                                          f"no /lib/modules/{sysinfo.kernel}") + ")",
           "pci gpus": ", ".join(f"{d.address} {d.model} [10de:{d.device[2:]}]" for d in pci)
           or "none"}
    switches = [d for d in facts[PciDevices()] if d.is_nvswitch]
    if switches:
        out["nvswitches"] = str(len(switches))
    if nv.smi_present:
        out["driver"] = (f"{nv.loaded_version} ({nv.module or 'module'} kernel module), "
                         f"CUDA {nv.cuda_version or '?'}") if nv.exit_code == 0 else \
            f"not usable: {nv.error.splitlines()[0] if nv.error else nv.exit_code}"
        for gpu in nv.gpus:
            out[f"gpu {gpu.index}"] = (f"{gpu.name}, {gpu.memory_mib} MiB, compute "
                                       f"{gpu.compute_cap}, MIG {gpu.mig_mode}, persistence "
                                       f"{gpu.persistence_mode}, {gpu.bus_id}")
    else:
        out["driver"] = "none (no nvidia-smi)"
    topo = facts.get(GpuTopology())
    if topo is not None and topo.nvlinks:
        out["nvlink"] = ", ".join(f"GPU{i}: {n} links" for i, n in sorted(topo.nvlinks.items()))
    if topo is not None and len(topo.matrix) > 1:
        out["topology"] = "; ".join(f"{a}-{b} {kind}" for a, row in topo.matrix.items()
                                    for b, kind in row.items() if a < b)
    toolkits = facts.get(CudaToolkits()) or {}
    out["cuda toolkit"] = ", ".join(sorted(toolkits.values())) or "none"
    out["containerd"] = facts[Containerd()].version or "not installed"
    return out


def _jsonable(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(value)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


__all__ = ["ConnectError", "bootstrap", "facts", "plan", "report"]
