"""Fact gathering: every fact the roles ask for, in one probe per host, all hosts in
parallel; and the cluster's nodes as report.json keeps them (the cluster values roles read
are derived in gpuk8s/cluster_values.py). The runner's layer: it runs the probe through the
session's transports; gpuk8s.facts only says what to run (build_probe) and parses what came
back (parse_probe)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuk8s.cluster_values import cluster_values
from gpuk8s.errors import (
    ConnectError,
    ConnectionLost,
    Gpuk8sError,
    PhaseFailed,
)
from gpuk8s.executor import HostResult
from gpuk8s.facts import Fact, HostFacts
from gpuk8s.facts.probe import build_probe, parse_probe, probe_times
from gpuk8s.facts.system import PendingHandlers
from gpuk8s.parallel import in_parallel
from gpuk8s.playbook import ALL_ROLES
from gpuk8s.report import Reporter
from gpuk8s.roles import load_role
from gpuk8s.session import DEFAULT_OPENER, Opener, Session, open_session, role_vars


def fact_requests(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    """Every fact any role needs on a host with these vars, each once."""
    seen: dict[Fact[Any], None] = {}
    for role in ALL_ROLES:
        for fact in load_role(role).facts(vars):
            seen.setdefault(fact, None)
    seen.setdefault(PendingHandlers(), None)  # the runner's, for every role's handlers
    return list(seen)


def gather(session: Session, hosts: Sequence[str], extra: Sequence[Fact[Any]] = ()) -> None:
    """One probe per host, all hosts in parallel; raise PhaseFailed if any probe fails.
    ``extra``: facts beyond the roles' (what `invoke facts` shows and no plan reads)."""

    def one(name: str) -> HostFacts:
        requests = fact_requests(role_vars(session.host(name)))
        requests += [f for f in extra if f not in requests]
        script, marker = build_probe(requests)
        started = time.monotonic()
        result = session.transports[name].run(script, timeout=120)
        took = time.monotonic() - started
        session.runlog.add_probe(name, started, took,
                                 node=probe_times(result.stdout, marker, requests))
        with lock:  # the final table's time per host counts its probes too
            session.host_totals(name)["time"] += took
        return parse_probe(name, result.stdout, requests, marker)

    lock = threading.Lock()

    results = in_parallel(list(hosts), one)
    session.runlog.mark("facts")
    failed: dict[str, HostResult] = {}
    for name, value in results.items():
        if isinstance(value, HostFacts):
            session.facts[name] = value
        else:
            err: Gpuk8sError
            if isinstance(value, ConnectionLost):  # the host went away (a reboot?)
                err = ConnectError(name, f"connection lost during the fact probe: {value.cause}")
            elif isinstance(value, Gpuk8sError):
                err = value
            else:
                err = Gpuk8sError(f"{name}: fact probe failed: {value!r}")
            failed[name] = HostResult(name, error=err)
    if failed:
        raise PhaseFailed("facts", failed)


def cluster_summary(session: Session, *, fresh: bool) -> dict[str, Any]:
    """The cluster's nodes and GPUs as report.json keeps them, read through the first control
    plane: again when ``fresh`` (the run changed something since its facts), else from the
    facts already gathered. Empty when the API cannot be read."""
    from gpuk8s.facts.kube import Cluster

    cp = session.first_cp
    if cp not in session.transports or cp not in session.facts:
        return {}
    state = session.facts[cp].get(Cluster())
    if fresh or state is None:
        script, marker = build_probe([Cluster()])
        try:
            output = session.transports[cp].run(script, timeout=60).stdout
            state = parse_probe(cp, output, [Cluster()], marker)[Cluster()]
        except Gpuk8sError:
            return {}
    if state is None or not state.reachable:
        return {}
    return {"nodes": [{"name": n.name, "ready": n.ready, "version": n.kubelet_version,
                       "roles": sorted(k.rpartition("/")[2] for k in n.labels
                                       if k.startswith("node-role.kubernetes.io/")),
                       "gpus": n.gpu_allocatable or 0} for n in state.nodes.values()]}


def gathered_session(inventory: str | Path, limit: str | None, command: str, *,
                     sets: Sequence[str] = (), reporter: Reporter | None = None,
                     opener: Opener = DEFAULT_OPENER, allow_unreachable: bool = False,
                     any_control_plane: bool = False) -> Session:
    """A session on ``limit`` (None: every host) with facts gathered and cluster values set:
    what day-2 commands and `invoke accept` start from."""
    session = open_session(inventory, limit=limit, sets=sets, command=command,
                           reporter=reporter, opener=opener,
                           allow_unreachable=allow_unreachable,
                           any_control_plane=any_control_plane)
    gather(session, list(session.transports))
    cluster_values(session)
    return session
