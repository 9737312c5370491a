"""`gpuk8s check`: everything gpuk8s reads in an inventory, in one run, contacting no host.

Every problem in file order (file:line and fix), the loader's notes, each host with the role
gpuk8s gives it, cluster-level facts that plan/bootstrap would refuse (an even number of
control planes), and every gpuk8s variable the inventory sets, with its effective value and where it
came from.
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuk8s.errors import InventoryError
from gpuk8s.facts import HostFacts
from gpuk8s.inventory.builder import inspect_inventory
from gpuk8s.inventory.endpoint import inventory_cluster
from gpuk8s.inventory.model import BASTION, Host, Inventory
from gpuk8s.report import Reporter, untrusted
from gpuk8s.roles import HostContext, load_role
from gpuk8s.variables import load_variable_specs

_USERINFO = re.compile(r"(//)[^/@\s]+@")


def _shown(value: Any) -> str:
    """A value as check prints it: credentials in URLs masked, control characters escaped."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return untrusted(_USERINFO.sub(r"\1***@", text))


def role(host: Host) -> str:
    if host.absent:
        return "absent (absent: true; skipped)"
    if host.is_control_plane:
        return "control plane" + (" (schedulable)" if host.schedulable else "")
    if host.is_worker:
        return "worker"
    if BASTION in host.groups:
        return "skipped: the bastion, the jump host of the others (never a cluster member)"
    return "skipped: in neither control_plane nor workers (never contacted)"


def cluster_problems(inv: Inventory) -> list[InventoryError]:
    """What plan and bootstrap refuse about the inventory as a whole: an even number of control
    planes (etcd quorum), and an endpoint mode the control planes cannot have."""
    out = []
    cps = inv.control_planes
    if len(cps) % 2 == 0 and cps:
        n = len(cps)
        out.append(InventoryError(
            f"{n} control planes ({', '.join(h.name for h in cps)}): every control plane runs "
            f"an etcd member, and etcd accepts writes only while a majority ({n // 2 + 1} of "
            f"{n}) is up, so {n} control planes survive as many failures as {n - 1} do "
            f"({(n - 1) // 2}) while adding one more machine that can fail",
            path=str(inv.path), fix=_odd_fix(inv, n)))
    if cps:
        first = cps[0].vars
        mode, endpoint = first.get("control_plane_endpoint_mode"), \
            first.get("control_plane_endpoint")
        if mode == "external" and not endpoint:
            out.append(InventoryError(
                "control_plane_endpoint_mode is external but control_plane_endpoint is empty",
                path=str(inv.path), fix='name the load balancer you run in front of the API '
                'servers: control_plane_endpoint: "k8s-api.lab:6443"'))
        if mode == "local_lb" and endpoint:
            out.append(InventoryError(
                f"control_plane_endpoint is {endpoint!r} but control_plane_endpoint_mode is "
                "local_lb, whose endpoint is each node's own load balancer (127.0.0.1:6443)",
                path=str(inv.path), fix="remove control_plane_endpoint, or set "
                "control_plane_endpoint_mode: external to use your load balancer"))
    return out


def preflight_problems(inv: Inventory, *, skip_broken: bool = False
                       ) -> tuple[list[InventoryError], list[str]]:
    """(errors, warnings) of preflight's rules that need only the inventory
    (roles/preflight INVENTORY_RULES, preflight_ignore applied), for every host preflight
    checks: the cluster's members, absent ones left out. Plan and bootstrap stop at the same
    errors after gathering facts; here no host is contacted. ``skip_broken``: the inventory
    has problems already, so a host whose variables a rule cannot read is passed over."""
    if not inv.control_planes:
        return [], []
    role = load_role("preflight").module
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


def _odd_fix(inv: Inventory, n: int) -> str:
    fix = f"use an odd number of control planes: {n - 1} or {n + 1} (the others can be workers)"
    etcd = inv.etcd_group
    if len(etcd) % 2 and set(etcd) != {h.name for h in inv.control_planes}:
        fix += (f". This inventory's etcd group ({', '.join(etcd)}) is where kubespray runs "
                "etcd apart from its control planes; gpuk8s runs one etcd member on each "
                f"control plane (kubeadm's stacked etcd): list {', '.join(etcd)} under "
                "control_plane to keep that etcd cluster's size")
    return fix


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
            hosts[host.name] = role(host)
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
