"""`invoke accept` and `invoke release`: a GPU box proves its health and numbers on the box
itself (gpuk8s.accept.node), is judged against its model's references (gpuk8s.accept.judge),
and a failing one that is a cluster node is quarantined: cordoned, tainted
``gpuk8s.io/gpu-unhealthy=<reason>:NoSchedule``, labelled with the reason and annotated with the
whole of it. One run quarantines at most max(1, 25%) of the cluster's GPU nodes: when many
nodes fail at once the cause is more likely shared (a driver, the benchmark, the power feed)
than their GPUs, and a run should not empty the cluster. `release` lifts a quarantine only after
the node passes again."""

from __future__ import annotations

import datetime as dt
import json
from contextlib import closing
from pathlib import Path
from typing import Any

from gpuk8s.accept.judge import judge
from gpuk8s.accept.node import parse, script
from gpuk8s.errors import CommandFailed, Gpuk8sError, InventoryError
from gpuk8s.facts.kube import (
    ACCEPT_PENDING,
    CORDONED_BY,
    CORDONED_BY_ACCEPT,
    GPU_UNHEALTHY,
    GPU_UNHEALTHY_REASON,
    GPU_UNHEALTHY_SINCE,
    Cluster,
    NodeStatus,
)
from gpuk8s.facts.system import PciDevices
from gpuk8s.gather import gathered_session
from gpuk8s.ops.kube import KUBECTL
from gpuk8s.parallel import in_parallel
from gpuk8s.report import Cell, Column, Reporter
from gpuk8s.session import DEFAULT_OPENER, Opener, Session, run_step
from gpuk8s.sinks import node_arg, shell

#: the taint, and the label that carries the same reason code (selectable: kubectl get nodes
#: -l gpuk8s.io/gpu-unhealthy); the annotations (gpuk8s.facts.kube) hold the whole reason, when,
#: and whether gpuk8s cordoned the node (release uncordons only such a node)
TAINT = LABEL = GPU_UNHEALTHY
#: one run quarantines at most this share of the cluster's GPU nodes (and at least one)
CAP_SHARE = 0.25
#: seconds the node script may take
QUICK_TIMEOUT, FULL_TIMEOUT = 300, 1200


def cap(gpu_nodes: int) -> int:
    return max(1, int(gpu_nodes * CAP_SHARE))


def quarantined(node: NodeStatus | None) -> bool:
    """Tainted by accept, or labelled by gpu_health_watch (which cannot taint: its kubelet
    credentials may cordon and label their node, not taint it)."""
    return node is not None and (any(t.startswith(f"{TAINT}:") for t in node.taints)
                                 or LABEL in node.labels)


def quarantine_script(node: str, code: str, text: str, cordon: bool) -> str:
    """Cordon (when ``cordon``: the node was schedulable), taint, label and annotate ``node``;
    every value through its sink."""
    n = node_arg(node)
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    lines = ["set -e"]
    if cordon:
        lines.append(f"{KUBECTL} cordon {n}")
    lines += [
        f"{KUBECTL} taint node {n} {shell(f'{TAINT}={code}:NoSchedule')} --overwrite",
        f"{KUBECTL} label node {n} {shell(f'{LABEL}={code}')} --overwrite",
        f"{KUBECTL} annotate node {n} {shell(f'{GPU_UNHEALTHY_REASON}={text}')} "
        f"{shell(f'{GPU_UNHEALTHY_SINCE}={now}')}"
        + (f" {shell(f'{CORDONED_BY}={CORDONED_BY_ACCEPT}')}" if cordon else "") + " --overwrite",
    ]
    return "\n".join(lines) + "\n"


def admit_script(node: str) -> str:
    """A node add-node joined cordoned passed accept: uncordon it, drop the annotations."""
    n = node_arg(node)
    return (f"set -e\n{KUBECTL} annotate node {n} {shell(f'{ACCEPT_PENDING}-')} "
            f"{shell(f'{CORDONED_BY}-')} --overwrite\n{KUBECTL} uncordon {n}\n")


def release_script(node: str, uncordon: bool) -> str:
    n = node_arg(node)
    return "\n".join([
        "set -e",
        f"{KUBECTL} taint node {n} {shell(f'{TAINT}:NoSchedule-')} 2>/dev/null || true",
        f"{KUBECTL} label node {n} {shell(f'{LABEL}-')} --overwrite",
        f"{KUBECTL} annotate node {n} {shell(f'{GPU_UNHEALTHY_REASON}-')} "
        f"{shell(f'{GPU_UNHEALTHY_SINCE}-')} {shell(f'{CORDONED_BY}-')} --overwrite",
        *([f"{KUBECTL} uncordon {n}"] if uncordon else []),
    ]) + "\n"


def _gpu_hosts(session: Session, host: str | None) -> list[str]:
    hosts = [h for h in session.scope
             if h in session.facts and any(d.is_gpu for d in session.facts[h][PciDevices()])]
    if host is not None and host not in hosts:
        raise InventoryError(f"{host} has no NVIDIA GPU on its PCI bus: nothing to accept",
                             path=str(session.inventory.path),
                             fix="name a GPU node (invoke facts shows each host's GPUs)")
    return hosts


def measure(session: Session, hosts: list[str], quick: bool) -> dict[str, dict[str, Any]]:
    """Run the node script on every host at once; each host's judged result."""
    text = script(quick)
    timeout = QUICK_TIMEOUT if quick else FULL_TIMEOUT

    def one(h: str) -> dict[str, Any]:
        out = run_step(session, h, text, "accept: GPU health and benchmark", timeout=timeout)
        reading = parse(out)
        pci = sum(1 for d in session.facts[h][PciDevices()] if d.is_gpu)
        return {**judge(reading, expected_gpus=pci), "reading": reading.as_json()}

    results: dict[str, dict[str, Any]] = {}
    done = in_parallel(hosts, one)
    for h in hosts:  # inventory order (the cap quarantines the first failing nodes of it)
        res = done[h]
        if isinstance(res, Exception):
            why = res.stderr_tail.strip() if isinstance(res, CommandFailed) else str(res)
            results[h] = {"verdict": "fail", "reasons": ["benchmark"], "gpus": [],
                          "node_checks": [], "reason_text": f"the accept script failed: {why}"}
        else:
            results[h] = res
    return results


def _nodes(session: Session) -> dict[str, NodeStatus]:
    return dict(session.facts[session.first_cp][Cluster()].nodes)


def _gpu_node_count(nodes: dict[str, NodeStatus], also: list[str]) -> int:
    gpu = {n for n, s in nodes.items() if s.gpu_allocatable is not None or s.nvidia
           or quarantined(s) or s.labels.get("nvidia.com/gpu.present") == "true"}
    return len(gpu | {n for n in also if n in nodes})


def apply_verdicts(session: Session, results: dict[str, dict[str, Any]], *,
                   quarantine: bool = True) -> None:
    """Quarantine the failing cluster nodes (at most the cap, in inventory order); record on
    each result what was done (``action``)."""
    nodes = _nodes(session)
    names = {h: str(session.cluster["nodes"][h]["name"]) for h in results}
    limit = cap(_gpu_node_count(nodes, list(names.values())))
    taken = 0
    for h, res in results.items():
        node = nodes.get(names[h])
        res["node"] = names[h]
        pending = node is not None and node.accept_pending and not quarantined(node)
        if res["verdict"] != "fail":
            if pending and quarantine:
                run_step(session, session.first_cp, admit_script(names[h]),
                         f"admit {names[h]}")
                res["action"] = "admitted: accepted after add-node, uncordoned"
            else:
                res["action"] = ("still quarantined: it passes now, `invoke release --host "
                                 f"{h}` lifts it") if quarantined(node) else "none"
            continue
        code = res["reasons"][0] if res["reasons"] else "benchmark"
        if node is None:
            res["action"] = "not a cluster node yet: nothing to quarantine"
        elif not quarantine:
            res["action"] = "reported only (--no-quarantine)"
        elif not quarantined(node) and taken >= limit:
            res["action"] = (f"NOT quarantined: this run already quarantined {taken} of its "
                             f"limit of {limit} (max(1, 25%) of the cluster's GPU nodes); "
                             "when this many nodes fail at once, look for a shared cause")
        else:
            again = quarantined(node)
            steps = quarantine_script(names[h], code, res["reason_text"],
                                      cordon=not node.unschedulable)
            if pending:  # joined cordoned by add-node: now quarantined, release admits it
                steps += f"{KUBECTL} annotate node {node_arg(names[h])} " \
                         f"{shell(f'{ACCEPT_PENDING}-')} --overwrite\n"
            run_step(session, session.first_cp, steps, f"quarantine {names[h]} ({code})")
            if not again:
                taken += 1
            res["action"] = ("quarantine updated" if again else "quarantined") + \
                f": cordoned, tainted {TAINT}={code}:NoSchedule"


#: the accept table
COLUMNS = (Column("host"), Column("verdict"), Column("gpus", justify="right"),
           Column("slowest bf16", justify="right"), Column("reasons"), Column("action"))


def _slowest(res: dict[str, Any]) -> str:
    values = [c for g in res.get("gpus", []) for c in g["checks"]
              if c["check"] == "matmul_bf16" and "value" in c]
    if not values:
        return "-"
    c = min(values, key=lambda c: c["value"])
    return f"{c['value']:g} {c['unit']}"


def print_results(rep: Reporter, results: dict[str, dict[str, Any]]) -> None:
    style = {"pass": "green", "warn": "yellow", "fail": "red"}
    cells: list[list[Cell]] = []
    for h, r in results.items():
        cells.append([h, rep.cell(r["verdict"], style.get(r["verdict"], "")),
                      str(len(r.get("gpus", []))), _slowest(r),
                      ", ".join(r.get("reasons", [])) or "-", r.get("action", "-")])
    rep.table("GPU acceptance", COLUMNS, cells)
    for h, r in results.items():
        for g in r.get("gpus", []):
            for c in g["checks"]:
                if c["verdict"] in ("fail", "warn"):
                    rep.print(f"  {h} GPU {g['index']} {c['verdict']}: {c['detail']}",
                              style=style[c["verdict"]])
        for c in r.get("node_checks", []):
            if c["verdict"] in ("fail", "warn"):
                rep.print(f"  {h} {c['verdict']}: {c['detail']}", style=style[c["verdict"]])


def accept(inventory: str | Path, *, host: str | None = None, quick: bool = False,
           as_json: bool = False, quarantine: bool = True, reporter: Reporter | None = None,
           opener: Opener = DEFAULT_OPENER) -> dict[str, dict[str, Any]]:
    """Accept every GPU node (or ``host``): health, then the benchmark; quarantine the ones
    that fail (within the cap). Returns each host's result."""
    session = gathered_session(inventory, host, "accept", reporter=reporter,
                               opener=opener)
    with closing(session):
        hosts = _gpu_hosts(session, host)
        if not hosts:
            raise Gpuk8sError("no GPU node in the inventory: nothing to accept")
        rep = session.reporter
        rep.phase(f"accept{' --quick' if quick else ''}: {', '.join(hosts)}")
        results = measure(session, hosts, quick)
        apply_verdicts(session, results, quarantine=quarantine)
        session.runlog.write_report(accept=results, quick=quick)
        if as_json:
            rep.console.print(json.dumps(results, indent=2), markup=False, highlight=False)
        else:
            print_results(rep, results)
        return results


def accept_added(inventory: str | Path, host: str, *, reporter: Reporter | None = None,
                 opener: Opener = DEFAULT_OPENER) -> dict[str, Any] | None:
    """After add-node: accept --quick on ``host`` if it joined cordoned for it (a GPU worker
    with accept_on_add), then admit or quarantine it. None when there was nothing to accept."""
    session = gathered_session(inventory, host, "add-node-accept", reporter=reporter,
                               opener=opener)
    with closing(session):
        if host not in _gpu_hosts(session, None):
            return None
        name = str(session.cluster["nodes"][host]["name"])
        node = _nodes(session).get(name)
        if node is None or not node.accept_pending or quarantined(node):
            return None
        session.reporter.phase(f"accept --quick: {host} joined cordoned (accept_on_add)")
        results = measure(session, [host], quick=True)
        apply_verdicts(session, results)
        session.runlog.write_report(accept=results, quick=True)
        print_results(session.reporter, results)
        return results[host]


def release(inventory: str | Path, *, host: str, quick: bool = False,
            reporter: Reporter | None = None,
            opener: Opener = DEFAULT_OPENER) -> dict[str, Any]:
    """Lift ``host``'s quarantine after it passes accept again (a warning passes)."""
    session = gathered_session(inventory, host, "release", reporter=reporter,
                               opener=opener)
    with closing(session):
        rep = session.reporter
        _gpu_hosts(session, host)
        name = str(session.cluster["nodes"][host]["name"])
        node = _nodes(session).get(name)
        if not quarantined(node):
            rep.print(f"{host} (node {name}) is not quarantined: nothing to release")
            return {"host": host, "released": False}
        assert node is not None
        rep.phase(f"release {host}: accept{' --quick' if quick else ''} first")
        res = measure(session, [host], quick)[host]
        res["node"] = name
        if res["verdict"] == "fail":
            res["action"] = "still quarantined"
            session.runlog.write_report(accept={host: res}, released=False)
            print_results(rep, {host: res})
            raise Gpuk8sError(f"{host} still fails accept ({', '.join(res['reasons'])}): it "
                              f"stays quarantined\n  {res['reason_text']}")
        uncordon = node.cordoned_by_accept
        run_step(session, session.first_cp, release_script(name, uncordon),
                 f"release {name}")
        res["action"] = "released" + (" and uncordoned" if uncordon else
                                      " (left cordoned: accept did not cordon it)")
        session.runlog.write_report(accept={host: res}, released=True)
        print_results(rep, {host: res})
        return {"host": host, "released": True, "result": res}
