"""The entry points tasks.py and the CLI call: bootstrap, plan, facts, check, report.

Each run: load and validate the inventory (no host contacted), connect to every host once, gather
facts with one probe per host, preflight, then per phase plan -> show -> apply -> barrier, probing
again only the hosts a phase changed. bootstrap itself is gpuk8s.runner.bootstrap (day-2's
add-node and reprovision run it too), listed here as the entry point it is.
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from gpuk8s.cluster_values import inventory_cluster
from gpuk8s.errors import ConnectError, InventoryError
from gpuk8s.facts import HostFacts
from gpuk8s.facts.nvidia import GpuTopology
from gpuk8s.facts.system import PciDevices, System
from gpuk8s.gather import gather
from gpuk8s.inventory.builder import inspect_inventory
from gpuk8s.inventory.check import cluster_problems
from gpuk8s.inventory.model import BASTION, Host, Inventory
from gpuk8s.report import Reporter, untrusted
from gpuk8s.roles import HostContext, PreflightExports, exports
from gpuk8s.runner import become_prompt, bootstrap
from gpuk8s.session import open_session
from gpuk8s.variables import load_variable_specs


def report(run: str | Path | None = None) -> Path:
    """Write a finished run's page, RUN_DIR/report.html (default: the latest run folder), and
    print its path; needs no inventory and makes no run folder of its own."""
    from gpuk8s import htmlreport

    return htmlreport.report(run)


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
                           password_prompt=become_prompt(ask_become_pass))
    with closing(session):
        # the GPU topology only `facts` shows: no plan reads it, so bootstrap and plan never
        # pay its two nvidia-smi runs
        gather(session, [h for h in session.scope if h in session.transports],
               extra=[GpuTopology()])
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
    from gpuk8s.facts.nvidia import CudaToolkits, Nvidia
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
           "not installed (not looked up: no NVIDIA device waits for a driver build)"
           if sysinfo.headers_candidate == "-" else
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


# -- check -----------------------------------------------------------------------------------
# Everything gpuk8s reads in an inventory, in one run, contacting no host: every problem in file
# order (file:line and fix), the loader's notes, each host with the role gpuk8s gives it,
# cluster-level facts that plan/bootstrap would refuse (inventory.check.cluster_problems), and
# every gpuk8s variable the inventory sets, with its effective value and where it came from.
_USERINFO = re.compile(r"(//)[^/@\s]+@")


def _shown(value: Any) -> str:
    """A value as check prints it: credentials in URLs masked, control characters escaped."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return untrusted(_USERINFO.sub(r"\1***@", text))


def host_role(host: Host) -> str:
    if host.absent:
        return "absent (absent: true; skipped)"
    if host.is_control_plane:
        return "control plane" + (" (schedulable)" if host.schedulable else "")
    if host.is_worker:
        return "worker"
    if BASTION in host.groups:
        return "skipped: the bastion, the jump host of the others (never a cluster member)"
    return "skipped: in neither control_plane nor workers (never contacted)"


def preflight_problems(inv: Inventory, *, skip_broken: bool = False
                       ) -> tuple[list[InventoryError], list[str]]:
    """(errors, warnings) of preflight's rules that need only the inventory
    (roles/preflight INVENTORY_RULES, preflight_ignore applied), for every host preflight
    checks: the cluster's members, absent ones left out. Plan and bootstrap stop at the same
    errors after gathering facts; here no host is contacted. ``skip_broken``: the inventory
    has problems already, so a host whose variables a rule cannot read is passed over."""
    if not inv.control_planes:
        return [], []
    role = exports(PreflightExports)
    cluster = inventory_cluster(inv)
    errors: list[InventoryError] = []
    warnings: list[str] = []
    for host in inv.hosts.values():
        if host.absent or not (host.is_control_plane or host.is_worker):
            continue
        vars = collections.ChainMap({"ansible_user": host.user, "ansible_host": host.address},
                                     dict(host.vars))
        ctx = HostContext(host.name, "preflight", vars, HostFacts(host.name, {}),
                          dict(cluster), host.groups)
        try:
            errs, warns = role.inventory_check(ctx)
        except (TypeError, ValueError, KeyError):
            if not skip_broken:
                raise
            continue  # a variable the loader already listed as wrong: its problem says why
        errors += [InventoryError(f"{host.name}: {message} (preflight check {check})",
                                  path=str(inv.path), fix=fix) for check, message, fix in errs]
        warnings += [f"{host.name}: {message} (preflight check {check}, in "
                     f"preflight_ignore)" for check, message, _fix in warns]
    return errors, warnings


def changed_variables(inv: Inventory) -> list[tuple[str, str, str, list[str]]]:
    """(name, value, origin, hosts) for every gpuk8s variable the inventory sets (or --set),
    "(the default)" after a value that equals the default."""
    specs = load_variable_specs()
    rows: dict[tuple[str, str, str], list[str]] = {}
    for host in inv.hosts.values():
        for name, spec in specs.items():
            if name not in host.vars or host.vars.origin(name).startswith(
                    ("default (", "role default (")):
                continue
            value = _shown(host.vars[name])
            if host.vars[name] == spec.default:
                value += " (the default)"
            key = (name, value, host.vars.origin(name))
            rows.setdefault(key, []).append(host.name)
    return [(n, v, o, hosts) for (n, v, o), hosts in sorted(rows.items())]


def check(inventory: str | Path, *, sets: Sequence[str] = (),
          reporter: Reporter | None = None) -> dict[str, Any]:
    """Print every problem, the notes, the hosts' roles and the variables that differ from their
    defaults; raise InventoryError (exit 1) when there is any problem."""
    rep = reporter or Reporter()
    inv, problems, notes = inspect_inventory(inventory, overrides=list(sets))
    ignored: list[str] = []
    if inv is not None:
        problems = problems + cluster_problems(inv)
        more, ignored = preflight_problems(inv, skip_broken=bool(problems))
        problems += more
    rep.print(f"inventory {untrusted(str(inventory))}")
    if problems:
        rep.print(f"\n{len(problems)} problem(s), in file order:")
        for p in problems:
            for i, line in enumerate(untrusted(p).splitlines()):
                rep.print(("  - " if i == 0 else "    ") + line)
    warnings = [*(inv.warnings if inv is not None else []), *ignored]
    if warnings:
        rep.print("\nwarnings:")
        for w in warnings:
            rep.print(f"  - {untrusted(w)}")
    if notes:
        rep.print("\nnotes:")
        for n in notes:
            rep.print(f"  - {untrusted(n)}")
    hosts: dict[str, str] = {}
    changed = []
    if inv is not None:
        rep.print("\nhosts as gpuk8s reads them:")
        width = max(len(h) for h in inv.hosts) if inv.hosts else 4
        for host in inv.hosts.values():
            hosts[host.name] = host_role(host)
            where = f"{host.user}@{host.address}:{host.port}" if host.connection == "ssh" \
                else "local"
            via = f" (through {host.proxy_jump})" if host.proxy_jump else ""
            rep.print(f"  {untrusted(host.name):<{width}}  {untrusted(where):<28} "
                      f"{hosts[host.name]}{untrusted(via)}")
        changed = changed_variables(inv)
        if changed:
            rep.print("\ngpuk8s variables the inventory sets:")
            for name, value, origin, on in changed:
                scope = "all hosts" if len(on) == len(inv.hosts) else ", ".join(on)
                rep.print(f"  {name} = {value}")
                rep.print(f"      from {untrusted(origin)}; on {untrusted(scope)}")
    result = {"problems": [str(p) for p in problems], "notes": list(notes), "hosts": hosts,
              "warnings": warnings,
              "changed": [{"name": n, "value": v, "origin": o, "hosts": on}
                          for n, v, o, on in changed]}
    if problems:
        raise InventoryError(f"{len(problems)} problem(s) in the inventory (listed above)",
                             path=str(inventory), fix="fix them, then run check again")
    rep.print("\nno problems: plan and bootstrap will accept this inventory")
    return result


def _jsonable(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(value)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


__all__ = ["ConnectError", "bootstrap", "check", "facts", "plan", "report"]
