"""Reprovision one worker or control plane, add or remove one, reset the whole cluster."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from gpuk8s.accept.command import accept_added
from gpuk8s.backups import before_change
from gpuk8s.day2.control_planes import remove_control_plane
from gpuk8s.day2.steps import (
    CLEANUP,
    ask_confirmation,
    check_one_host,
    node_name,
    run_step,
)
from gpuk8s.drain import drain
from gpuk8s.errors import Gpuk8sError, PhaseFailed
from gpuk8s.executor import HostResult
from gpuk8s.facts import HostFacts
from gpuk8s.facts.kernel import LockPackages
from gpuk8s.facts.kube import Cluster
from gpuk8s.facts.system import Packages
from gpuk8s.gather import gathered_session
from gpuk8s.ops.apt import Apt, purge_script
from gpuk8s.ops.kube import KUBE_PACKAGES, KUBECTL
from gpuk8s.parallel import in_parallel
from gpuk8s.report import Reporter
from gpuk8s.runner import bootstrap, converge
from gpuk8s.session import DEFAULT_OPENER, Opener, Session, open_session
from gpuk8s.sinks import node_arg


# -- reprovision ------------------------------------------------------------------------------
def reprovision(inventory: str | Path, host: str, *, reinstall_driver: bool = False,
                full: bool = False, drain_timeout: int = 300, yes: bool = False,
                sets: Sequence[str] = (), reporter: Reporter | None = None,
                confirm: Callable[[str], bool] | None = None,
                opener: Opener = DEFAULT_OPENER, backup: bool = True) -> dict[str, Any]:
    """Drain, delete, reset and rejoin one worker; only it and the control plane are contacted.
    A control plane (not the first) leaves the cluster and etcd as remove-node does, then joins
    again as add-node does; only the control planes are contacted.

    Args:
        inventory: the inventory the cluster was bootstrapped with.
        host: the worker to reprovision.
        reinstall_driver: purge the NVIDIA driver packages so they are installed again.
        full: purge the whole node stack (Kubernetes packages, containerd, NVIDIA).
        drain_timeout: seconds for `kubectl drain`.
        yes: do not ask.
        sets: ``key=value`` overrides.
        reporter: output.
        confirm: asks the user (tests).
        opener: transports (tests).
    """
    if check_one_host(inventory, host):  # a control plane: leave etcd, then join again
        if reinstall_driver or full:
            raise Gpuk8sError("--reinstall-driver and --full are for workers; a control plane "
                              "is reprovisioned by leaving the cluster and joining again")
        removed = remove_control_plane(inventory, host, drain_timeout=drain_timeout, yes=yes,
                                       reporter=reporter, confirm=confirm, opener=opener,
                                       backup=backup)
        # the backup before the removal covers the join too
        result = bootstrap(inventory, limit=host, yes=True, sets=sets, reporter=reporter,
                           opener=opener,
                           backup="the one before the removal covers the join" if backup
                           else False)
        return {**result, "removed": removed}
    session = gathered_session(inventory, host, "reprovision", sets=sets, reporter=reporter,
                               opener=opener)
    with closing(session):
        rep = session.reporter
        node = node_name(session, host)
        steps = [f"drain {node} and delete its Node object", f"kubeadm reset on {host} and "
                 "clean CNI config, kubelet state and cni/flannel links (iptables untouched)"]
        purge: list[str] = []
        host_facts = session.facts[host]
        if reinstall_driver or full:
            installed = session.facts[host].get(Packages(*_driver_names(session, host))) or {}
            # and the rest of the driver's set by name: gpu_node_lock holds it, and a held
            # package is not one --autoremove takes
            locked = session.facts[host].get(LockPackages())
            purge += sorted(set(installed) | set(locked.driver if locked else ()))
        if full:  # what the roles install, by their own package lists
            purge += [*KUBE_PACKAGES, *_role_packages("container_runtime", host_facts),
                      *_role_packages("nvidia_container_toolkit", host_facts)]
        if purge:
            steps.append(f"purge {' '.join(purge)}")
        steps.append("bootstrap it again: node stack, join with a fresh token, GPU checks")
        rep.phase(f"reprovision {host}")
        for step in steps:
            rep.print(f"  + {step}")
        ask_confirmation(f"reprovision {host}? [y/N] ", yes, confirm)
        started = time.monotonic()
        cluster = session.facts[session.first_cp][Cluster()]
        if node in cluster.nodes:
            drain(session, node, drain_timeout)
            run_step(session, session.first_cp, f"{KUBECTL} delete node {node_arg(node)}",
                     f"delete node {node}")
        run_step(session, host, CLEANUP, "kubeadm reset and cleanup")
        if purge:
            run_step(session, host, purge_script(purge, Apt.for_host(session.host(host).vars)),
                     "purge packages", timeout=1800)
        rep.print(f"  {host} reset; bootstrapping it again")
        result = converge(session, yes=True, backup=backup)
        result["wall_time"] = time.monotonic() - started
        return result


def _role_packages(role: str, facts: HostFacts) -> list[str]:
    """The packages a role installs that this host has (its PACKAGES, as the probe saw them)."""
    from gpuk8s.roles import load_role

    return sorted(facts.get(Packages(*load_role(role).packages())) or {})



def _driver_names(session: Session, host: str) -> list[str]:
    """The driver packages the nvidia_driver role asks about (the same fact request, so the
    probe already answered it); their dependencies go with --autoremove."""
    from gpuk8s.roles import NvidiaDriverExports, exports

    return exports(NvidiaDriverExports).driver_package_names(session.host(host).vars)


# -- add / remove -----------------------------------------------------------------------------
def add_node(inventory: str | Path, host: str, **kwargs: Any) -> dict[str, Any]:
    """Give a new box the full node stack (GPU roles included) and join it; the other
    workers are not contacted. Same as ``bootstrap --limit HOST``, except that a GPU worker
    joins cordoned and takes work only once ``accept --quick`` passes on it (accept_on_add:
    true, the default); a failing one stays cordoned and is quarantined."""
    check_one_host(inventory, host)
    result = bootstrap(inventory, limit=host, join_cordoned=True, **kwargs)
    if not kwargs.get("check"):
        accepted = accept_added(inventory, host, reporter=kwargs.get("reporter"),
                                opener=kwargs.get("opener", DEFAULT_OPENER))
        if accepted is not None:
            result["accept"] = {k: accepted[k] for k in ("verdict", "reasons", "action")}
    return result


def remove_node(inventory: str | Path, host: str, *, drain_timeout: int = 300,
                yes: bool = False, reporter: Reporter | None = None,
                confirm: Callable[[str], bool] | None = None,
                opener: Opener = DEFAULT_OPENER, backup: bool = True) -> dict[str, Any]:
    """Drain and delete a worker's Node object, then reset the box. A dead box (unreachable)
    only loses its Node object, with a note. A control plane leaves etcd too (see
    gpuk8s.day2.control_planes), only if etcd keeps its quorum."""
    if check_one_host(inventory, host):
        return remove_control_plane(inventory, host, drain_timeout=drain_timeout, yes=yes,
                                    reporter=reporter, confirm=confirm, opener=opener,
                                    backup=backup)
    session = gathered_session(inventory, host, "remove-node", reporter=reporter, opener=opener,
                               allow_unreachable=True)
    with closing(session):
        rep = session.reporter
        dead = host in session.unreachable
        node = node_name(session, host)
        rep.phase(f"remove {host} (node {node})")
        if dead:
            rep.print(f"  ! {host} is unreachable ({session.unreachable[host]}): only its Node "
                      "object is removed; reset the box by hand (kubeadm reset -f) before "
                      "reusing it", style="magenta")
        rep.print(f"  + {'delete' if dead else 'drain and delete'} node {node}")
        if not dead:
            rep.print(f"  + kubeadm reset on {host} and clean up")
        ask_confirmation(f"remove {host}? [y/N] ", yes, confirm)
        cluster = session.facts[session.first_cp][Cluster()]
        if node in cluster.nodes:
            if not dead:
                drain(session, node, drain_timeout)
            run_step(session, session.first_cp, f"{KUBECTL} delete node {node_arg(node)}",
                     f"delete node {node}")
        else:
            rep.print(f"  = node {node} is not in the cluster")
        if not dead:
            run_step(session, host, CLEANUP, "kubeadm reset and cleanup")
        session.runlog.write_report(removed=host, dead=dead)
        rep.print(f"removed {host}; remove it from the inventory (or mark it absent: true) so "
                  "the next bootstrap does not add it back")
        return {"removed": host, "dead": dead}


# -- reset ------------------------------------------------------------------------------------
def reset(inventory: str | Path, *, yes: bool = False, reporter: Reporter | None = None,
          confirm: Callable[[str], bool] | None = None,
          opener: Opener = DEFAULT_OPENER, backup: bool = True) -> dict[str, Any]:
    """The whole cluster back to its pre-bootstrap state (packages and drivers stay), behind
    a typed confirmation (the control plane's name) or --yes; a backup first (``backup``)."""
    session = open_session(inventory, limit=None, sets=(), command="reset",
                               reporter=reporter, opener=opener, allow_unreachable=True)
    with closing(session):
        rep = session.reporter
        cp = session.first_cp
        rep.phase("reset: kubeadm reset and cleanup on every node")
        for host in session.scope:
            rep.print(f"  - {host}")
        for host, err in session.unreachable.items():
            rep.print(f"  ! {host} unreachable, skipped: {err}", style="magenta")
        ask_confirmation(f"this destroys the cluster; type the control plane's name ({cp}) to "
                         "go on: ", yes, confirm, expected=cp)
        before_change(session, "the reset", backup)
        cps = [h.name for h in session.inventory.control_planes if h.name in session.scope]
        workers = [h for h in session.scope if h not in cps]
        results = in_parallel(workers, lambda h: run_step(session, h, CLEANUP, "reset"))
        failed = {h: HostResult(h, error=e if isinstance(e, Gpuk8sError) else
                                Gpuk8sError(f"{h}: {e!r}"))
                  for h, e in results.items() if isinstance(e, Exception)}
        # control planes one at a time, the first last: each kubeadm reset takes its etcd
        # member out of a cluster that still has a quorum
        for host in [h for h in cps if h != cp] + [cp]:
            try:
                run_step(session, host, CLEANUP, "reset")
            except Gpuk8sError as exc:
                failed[host] = HostResult(host, error=exc)
        artifacts = Path(session.inventory.path).resolve().parent / "artifacts" / "admin.conf"
        artifacts.unlink(missing_ok=True)
        session.runlog.write_report(reset=sorted(session.scope))
        if failed:
            raise PhaseFailed("reset", failed)
        rep.print(f"reset {len(session.scope)} node(s); `invoke bootstrap` builds the cluster "
                  "again")
        return {"reset": session.scope, "unreachable": sorted(session.unreachable)}
