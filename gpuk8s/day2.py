"""Day-2 commands from the same inventory as bootstrap: reprovision, add/remove a node, reset,
status, upgrade and kubeconfig. Each contacts only the hosts it names plus the first control
plane, previews what it will do, and writes the same run folder and report as bootstrap."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from gpuk8s import api
from gpuk8s.errors import CommandFailed, Gpuk8sError, InventoryError, PhaseFailed
from gpuk8s.executor import HostResult
from gpuk8s.facts.kube import Cluster, Containerd
from gpuk8s.facts.nvidia import CudaToolkits, Nvidia
from gpuk8s.facts.system import Packages, PciDevices
from gpuk8s.ops.kube import KUBE_PACKAGES, KUBEADM_RESET, KUBECTL
from gpuk8s.playbook import PHASES
from gpuk8s.report import Reporter
from gpuk8s.sinks import node_arg
from gpuk8s.transport import ConnectSpec, Redactor, open_transport

Opener = Callable[[ConnectSpec, Redactor], Any]

#: what `kubeadm reset` leaves behind (its own notes say so), minus firewall rules: flushing
#: iptables on a box reached over SSH can cut the session, so rules are left to the next CNI.
#: Users' kubeconfigs are found without following symlinks (find -P): a user's ~/.kube that
#: points elsewhere never makes root delete a file outside /home/<user>/.kube/
CLEANUP = f"""\
if command -v kubeadm >/dev/null 2>&1; then
  {KUBEADM_RESET}
fi
rm -rf /etc/cni/net.d/* /var/lib/cni /etc/kubernetes/gpuk8s /root/.kube/config
find /home -mindepth 3 -maxdepth 3 -path '/home/*/.kube/config' -type f -delete
for link in cni0 flannel.1 vxlan.calico tunl0; do
  if ip link show "$link" >/dev/null 2>&1; then ip link delete "$link"; fi
done
if systemctl is-active --quiet containerd; then systemctl restart containerd; fi
"""


def _run(session: api.Session, host: str, script: str, what: str, *,
         timeout: float = 600) -> str:
    """Run one script on a host; log it; raise CommandFailed on a non-zero exit."""
    log = session.runlog.host_logger(host)
    log(f"--> {what}")
    result = session.transports[host].run("exec 2>&1\n" + script, timeout=timeout)
    text = session.redact(result.stdout)
    if text.strip():
        log(text.rstrip())
    if result.exit_code != 0:
        raise CommandFailed(host, what, "", result.exit_code,
                            "\n".join(text.rstrip().splitlines()[-15:]))
    return result.stdout


def _node_name(session: api.Session, host: str) -> str:
    """The Kubernetes node name of an inventory host: its hostname when reachable, else the
    node whose InternalIP is the host's address, else the inventory name."""
    facts = session.facts.get(host)
    if facts is not None:
        return str(session.cluster["nodes"][host]["name"])
    cluster = session.facts[session.first_cp][Cluster()]
    address = session.host(host).address
    raw = _run(session, session.first_cp, f"{KUBECTL} get nodes -o json", "list nodes")
    for item in json.loads(raw).get("items", []):
        for addr in item.get("status", {}).get("addresses", []):
            if addr.get("address") == address:
                return str(item["metadata"]["name"])
    return host if host in cluster.nodes else host.lower()


def _drain(session: api.Session, node: str, timeout: int) -> None:
    """Cordon and drain; on failure say which pods block (PodDisruptionBudgets...)."""
    cp = session.first_cp
    session.reporter.print(f"  [{cp}] drain {node} (timeout {timeout}s)")
    try:
        _run(session, cp, f"{KUBECTL} drain {node_arg(node)} --ignore-daemonsets "
             f"--delete-emptydir-data --timeout={timeout}s", f"drain {node}",
             timeout=timeout + 60)
    except CommandFailed as exc:
        blocking = sorted(set(re.findall(r'evicting pods?/"?([\w.-]+)"?(?: -n "?([\w.-]+))?',
                                         exc.stderr_tail)))
        names = ", ".join(f"{ns or 'default'}/{pod}" for pod, ns in blocking)
        raise Gpuk8sError(
            f"{node}: drain did not finish in {timeout}s"
            + (f"; blocked by {names}" if names else "") + f"\n{exc.stderr_tail}\n"
            "  fix: relax the PodDisruptionBudget or move the pods, raise --drain-timeout, "
            "or uncordon the node to give up") from None


def _session(inventory: str | Path, limit: str | None, command: str, *,
             sets: Sequence[str] = (), reporter: Reporter | None = None,
             opener: Opener = open_transport, allow_unreachable: bool = False) -> api.Session:
    session = api.open_session(inventory, limit=limit, sets=sets, command=command,
                               reporter=reporter, opener=opener,
                               allow_unreachable=allow_unreachable)
    api.gather(session, list(session.transports))
    api.cluster_values(session)
    return session


def _one_host(inventory: str | Path, host: str) -> None:
    from gpuk8s.inventory import load_inventory

    inv = load_inventory(inventory)
    if host not in inv.hosts:
        raise InventoryError(f"unknown host {host!r}", path=str(inv.path),
                             fix=f"known hosts: {', '.join(inv.hosts)}")
    if inv.hosts[host].is_control_plane:
        raise InventoryError(f"{host} is the control plane; this command works on workers",
                             path=str(inv.path), fix="use `invoke reset` for the whole cluster")


def _confirm(question: str, yes: bool, confirm: Callable[[str], bool] | None,
             expected: str | None = None) -> None:
    if yes:
        return
    if confirm is not None:
        ok = confirm(question)
    else:
        import sys

        if not sys.stdin.isatty():
            raise Gpuk8sError("refusing without confirmation: stdin is not a terminal; "
                              "pass --yes")
        answer = input(question).strip()
        ok = answer == expected if expected else answer.lower() in ("y", "yes")
    if not ok:
        raise Gpuk8sError("aborted: nothing was changed")


# -- reprovision ------------------------------------------------------------------------------
def reprovision(inventory: str | Path, host: str, *, reinstall_driver: bool = False,
                full: bool = False, drain_timeout: int = 300, yes: bool = False,
                sets: Sequence[str] = (), reporter: Reporter | None = None,
                confirm: Callable[[str], bool] | None = None,
                opener: Opener = open_transport) -> dict[str, Any]:
    """Drain, delete, reset and rejoin one worker; only it and the control plane are contacted.

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
    _one_host(inventory, host)
    session = _session(inventory, host, "reprovision", sets=sets, reporter=reporter,
                       opener=opener)
    with closing(session):
        rep = session.reporter
        node = _node_name(session, host)
        steps = [f"drain {node} and delete its Node object", f"kubeadm reset on {host} and "
                 "clean CNI config, kubelet state and cni/flannel links (iptables untouched)"]
        purge: list[str] = []
        if reinstall_driver or full:
            installed = session.facts[host].get(Packages(*_driver_names(session, host))) or {}
            purge += sorted(installed)
        if full:
            purge += ["kubeadm", "kubelet", "kubectl", "containerd.io",
                      "nvidia-container-toolkit", "nvidia-container-toolkit-base",
                      "libnvidia-container-tools", "libnvidia-container1"]
        if purge:
            steps.append(f"purge {' '.join(purge)}")
        steps.append("bootstrap it again: node stack, join with a fresh token, GPU checks")
        rep.phase(f"reprovision {host}")
        for step in steps:
            rep.print(f"  + {step}")
        _confirm(f"reprovision {host}? [y/N] ", yes, confirm)
        started = time.monotonic()
        cluster = session.facts[session.first_cp][Cluster()]
        if node in cluster.nodes:
            _drain(session, node, drain_timeout)
            _run(session, session.first_cp, f"{KUBECTL} delete node {node_arg(node)}",
                 f"delete node {node}")
        _run(session, host, CLEANUP, "kubeadm reset and cleanup")
        if purge:
            _run(session, host, "apt-mark unhold " + " ".join(purge) + " >/dev/null 2>&1; "
                 "DEBIAN_FRONTEND=noninteractive apt-get -q -y purge --autoremove "
                 + " ".join(purge),
                 "purge packages", timeout=1800)
        rep.print(f"  {host} reset; bootstrapping it again")
        result = api.converge(session, yes=True)
        result["wall_time"] = time.monotonic() - started
        return result


def _driver_names(session: api.Session, host: str) -> list[str]:
    """The driver packages the nvidia_driver role asks about (the same fact request, so the
    probe already answered it); their dependencies go with --autoremove."""
    from gpuk8s.roles import load_role

    module = load_role("nvidia_driver").module
    names: list[str] = module.driver_package_names(session.host(host).vars)
    return names


# -- add / remove -----------------------------------------------------------------------------
def add_node(inventory: str | Path, host: str, **kwargs: Any) -> dict[str, Any]:
    """Give a new box the full node stack (GPU roles included) and join it; the other
    workers are not contacted. Same as ``bootstrap --limit HOST``."""
    _one_host(inventory, host)
    return api.bootstrap(inventory, limit=host, **kwargs)


def remove_node(inventory: str | Path, host: str, *, drain_timeout: int = 300,
                yes: bool = False, reporter: Reporter | None = None,
                confirm: Callable[[str], bool] | None = None,
                opener: Opener = open_transport) -> dict[str, Any]:
    """Drain and delete a worker's Node object, then reset the box. A dead box (unreachable)
    only loses its Node object, with a note."""
    _one_host(inventory, host)
    session = _session(inventory, host, "remove-node", reporter=reporter, opener=opener,
                       allow_unreachable=True)
    with closing(session):
        rep = session.reporter
        dead = host in session.unreachable
        node = _node_name(session, host)
        rep.phase(f"remove {host} (node {node})")
        if dead:
            rep.print(f"  ! {host} is unreachable ({session.unreachable[host]}): only its Node "
                      "object is removed; reset the box by hand (kubeadm reset -f) before "
                      "reusing it", style="magenta")
        rep.print(f"  + {'delete' if dead else 'drain and delete'} node {node}")
        if not dead:
            rep.print(f"  + kubeadm reset on {host} and clean up")
        _confirm(f"remove {host}? [y/N] ", yes, confirm)
        cluster = session.facts[session.first_cp][Cluster()]
        if node in cluster.nodes:
            if not dead:
                _drain(session, node, drain_timeout)
            _run(session, session.first_cp, f"{KUBECTL} delete node {node_arg(node)}",
                 f"delete node {node}")
        else:
            rep.print(f"  = node {node} is not in the cluster")
        if not dead:
            _run(session, host, CLEANUP, "kubeadm reset and cleanup")
        session.runlog.write_report(removed=host, dead=dead)
        rep.print(f"removed {host}; remove it from the inventory (or mark it absent: true) so "
                  "the next bootstrap does not add it back")
        return {"removed": host, "dead": dead}


# -- reset ------------------------------------------------------------------------------------
def reset(inventory: str | Path, *, yes: bool = False, reporter: Reporter | None = None,
          confirm: Callable[[str], bool] | None = None,
          opener: Opener = open_transport) -> dict[str, Any]:
    """The whole cluster back to its pre-bootstrap state (packages and drivers stay), behind
    a typed confirmation (the control plane's name) or --yes."""
    session = api.open_session(inventory, limit=None, sets=(), command="reset",
                               reporter=reporter, opener=opener, allow_unreachable=True)
    with closing(session):
        rep = session.reporter
        cp = session.first_cp
        rep.phase("reset: kubeadm reset and cleanup on every node")
        for host in session.scope:
            rep.print(f"  - {host}")
        for host, err in session.unreachable.items():
            rep.print(f"  ! {host} unreachable, skipped: {err}", style="magenta")
        _confirm(f"this destroys the cluster; type the control plane's name ({cp}) to go on: ",
                 yes, confirm, expected=cp)
        workers = [h for h in session.scope if h != cp]
        results = api.in_parallel(workers, lambda h: _run(session, h, CLEANUP, "reset"))
        failed = {h: HostResult(h, error=e if isinstance(e, Gpuk8sError) else
                                Gpuk8sError(f"{h}: {e!r}"))
                  for h, e in results.items() if isinstance(e, Exception)}
        try:
            _run(session, cp, CLEANUP, "reset")
        except Gpuk8sError as exc:
            failed[cp] = HostResult(cp, error=exc)
        artifacts = Path(session.inventory.path).resolve().parent / "artifacts" / "admin.conf"
        artifacts.unlink(missing_ok=True)
        session.runlog.write_report(reset=sorted(session.scope))
        if failed:
            raise PhaseFailed("reset", failed)
        rep.print(f"reset {len(session.scope)} node(s); `invoke bootstrap` builds the cluster "
                  "again")
        return {"reset": session.scope, "unreachable": sorted(session.unreachable)}


# -- status -----------------------------------------------------------------------------------
def status(inventory: str | Path, *, as_json: bool = False, reporter: Reporter | None = None,
           opener: Opener = open_transport) -> list[dict[str, Any]]:
    """One row per host: role, Ready, versions, GPUs, allocatable nvidia.com/gpu and drift
    (how many changes `plan` would make). Unreachable hosts are rows too."""
    session = _session(inventory, None, "status", reporter=reporter, opener=opener,
                       allow_unreachable=True)
    with closing(session):
        cluster = session.facts[session.first_cp][Cluster()]
        drift: dict[str, int] = {}
        for phase in PHASES:
            work = api.plan_phase(session, phase, api.phase_hosts(session, phase))
            for planned_host, items in work.items():
                n = sum(op.changes for rw in items for op in rw.ops)
                drift[planned_host] = drift.get(planned_host, 0) + n
        rows = []
        for name, host in session.inventory.hosts.items():
            row: dict[str, Any] = {"host": name, "role": "control-plane"
                                   if host.is_control_plane else "worker"}
            if host.absent:
                rows.append({**row, "state": "absent"})
                continue
            if name in session.unreachable:
                rows.append({**row, "state": "unreachable",
                             "error": str(session.unreachable[name])})
                continue
            facts = session.facts[name]
            node = session.cluster["nodes"][name]
            kube = cluster.nodes.get(node["name"])
            pkgs = facts.get(Packages(*KUBE_PACKAGES)) or {}
            nv = facts[Nvidia()]
            gpus = [d for d in facts[PciDevices()] if d.is_gpu]
            rows.append({
                **row, "node": node["name"],
                "state": "Ready" if kube and kube.ready else ("NotReady" if kube else "not joined"),
                "cordoned": bool(kube and kube.unschedulable),
                "kubelet": pkgs["kubelet"].version.split("-")[0] if "kubelet" in pkgs else "",
                "containerd": facts[Containerd()].version,
                "driver": nv.loaded_version if nv.exit_code == 0 else
                ("not loaded" if nv.smi_present else ""),
                "cuda": ",".join(sorted(facts[CudaToolkits()].values())),
                "gpus": len(gpus), "gpu_model": gpus[0].model if gpus else "",
                "allocatable_gpu": kube.gpu_allocatable if kube else None,
                "drift": drift.get(name, 0),
            })
        session.runlog.write_report(status=rows)
        _print_status(session.reporter, rows, as_json)
        return rows


def _print_status(rep: Reporter, rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        rep.console.print(json.dumps(rows, indent=2), markup=False, highlight=False)
        return
    from rich.table import Table

    table = Table(title="cluster status", title_justify="left")
    cols = ("host", "role", "state", "kubelet", "containerd", "driver", "cuda", "gpus",
            "alloc gpu", "drift")
    for col in cols:
        table.add_column(col)
    for r in rows:
        gpus = f"{r['gpus']} x {r['gpu_model']}" if r.get("gpus") else ("0" if "gpus" in r
                                                                        else "")
        alloc = r.get("allocatable_gpu")
        state = r["state"] + (" (cordoned)" if r.get("cordoned") else "")
        table.add_row(rep.cell(r["host"]), rep.cell(r["role"]), rep.cell(state),
                      rep.cell(r.get("kubelet", "")), rep.cell(r.get("containerd", "")),
                      rep.cell(r.get("driver", "")), rep.cell(r.get("cuda", "")),
                      rep.cell(gpus), "" if alloc is None else str(alloc),
                      str(r.get("drift", "")))
    rep.console.print(table)


# -- upgrade ----------------------------------------------------------------------------------
def upgrade(inventory: str | Path, *, driver: str | None = None, kubernetes: str | None = None,
            limit: str | None = None, serial: int = 1, drain_timeout: int = 300,
            yes: bool = False, reporter: Reporter | None = None,
            confirm: Callable[[str], bool] | None = None,
            opener: Opener = open_transport) -> dict[str, Any]:
    """Upgrade the NVIDIA driver (``driver``) or Kubernetes to a patch release
    (``kubernetes``), ``serial`` nodes at a time; see upgrade_driver and upgrade_kubernetes."""
    if (driver is None) == (kubernetes is None):
        raise InventoryError("say what to upgrade: --driver VERSION or --kubernetes VERSION "
                             "(one of them)",
                             fix="e.g. invoke upgrade --kubernetes 1.36.2, or "
                             "invoke upgrade --driver 580.159.04")
    kwargs: dict[str, Any] = {"limit": limit, "serial": serial, "drain_timeout": drain_timeout,
                              "yes": yes, "reporter": reporter, "confirm": confirm,
                              "opener": opener}
    if kubernetes is not None:
        from gpuk8s.kubeupgrade import upgrade_kubernetes

        return upgrade_kubernetes(inventory, kubernetes, **kwargs)
    assert driver is not None
    return upgrade_driver(inventory, driver, **kwargs)


def upgrade_driver(inventory: str | Path, driver: str, *, limit: str | None = None,
                   serial: int = 1, drain_timeout: int = 300, yes: bool = False,
                   reporter: Reporter | None = None,
                   confirm: Callable[[str], bool] | None = None,
                   opener: Opener = open_transport) -> dict[str, Any]:
    """Move GPU nodes to NVIDIA driver ``driver`` (e.g. 580.159.04), ``serial`` nodes at a time:
    drain, install, reboot if needed, verify (nvidia-smi and allocatable GPUs), uncordon. Stops
    at the first node that fails and leaves the rest untouched."""
    if not re.fullmatch(r"\d{3}\.\d+(\.\d+)?(-[\w.~+]+)?", driver):
        raise InventoryError(f"--driver {driver!r} is not a driver version",
                             fix="give the full version, e.g. --driver 580.159.04")
    first = _session(inventory, limit, "upgrade", reporter=reporter, opener=opener)
    with closing(first):
        rep = first.reporter
        gpu_hosts = [h for h in first.scope if first.cluster["nodes"][h]["gpus"]]
        todo = [h for h in gpu_hosts
                if first.facts[h][Nvidia()].loaded_version != driver.split("-")[0]]
        rep.phase(f"upgrade the NVIDIA driver to {driver}, {serial} node(s) at a time")
        for h in gpu_hosts:
            now = first.facts[h][Nvidia()].loaded_version or "none"
            rep.print(f"  {'+' if h in todo else '='} {h}: {now} -> {driver}")
        if not todo:
            rep.print("nothing to upgrade")
            return {"upgraded": [], "remaining": []}
        _confirm(f"upgrade {len(todo)} node(s)? [y/N] ", yes, confirm)

    def one_batch(batch: Sequence[str]) -> Reporter:
        session = _session(inventory, ",".join(batch), "upgrade", reporter=reporter,
                           opener=opener, sets=[f"nvidia_driver_version={driver}"])
        with closing(session):
            names = [_node_name(session, h) for h in batch]
            for node in names:
                _drain(session, node, drain_timeout)
            api.converge(session, yes=True)
            for node in names:
                _run(session, session.first_cp, f"{KUBECTL} uncordon {node_arg(node)}",
                     f"uncordon {node}")
        return session.reporter

    done = run_batches(todo, chunks(todo, serial), one_batch, to=driver,
                       left="stays cordoned for inspection")
    return {"upgraded": done, "remaining": []}


def chunks(hosts: Sequence[str], serial: int) -> list[list[str]]:
    """``hosts`` in batches of ``serial`` (at least 1)."""
    step = max(1, serial)
    return [list(hosts[i:i + step]) for i in range(0, len(hosts), step)]


def run_batches(todo: Sequence[str], batches: Sequence[Sequence[str]],
                one_batch: Callable[[Sequence[str]], Reporter], *, to: str,
                left: str) -> list[str]:
    """Upgrade batch after batch (``one_batch`` returns the reporter it used). The first
    failure stops the run with one error naming what was upgraded, what was not touched, and
    the state the failed batch is ``left`` in. Returns the upgraded hosts, in order."""
    done: list[str] = []
    for batch in batches:
        try:
            rep = one_batch(batch)
        except Gpuk8sError as exc:
            remaining = [h for h in todo if h not in done and h not in batch]
            raise Gpuk8sError(
                f"upgrade stopped at {', '.join(batch)}: {exc}\n  upgraded: "
                f"{', '.join(done) or 'none'}; untouched: {', '.join(remaining) or 'none'}"
                f"; {', '.join(batch)} {left}") from None
        done += batch
        rep.print(f"  upgraded {', '.join(batch)} to {to}")
    return done


# -- kubeconfig -------------------------------------------------------------------------------
def kubeconfig(inventory: str | Path, *, reporter: Reporter | None = None,
               opener: Opener = open_transport) -> Path:
    """Fetch admin credentials to <inventory dir>/artifacts/admin.conf (0600)."""
    from gpuk8s.inventory import load_inventory

    cp = load_inventory(inventory).control_planes[0].name
    session = api.open_session(inventory, limit=cp, sets=(), command="kubeconfig",
                               reporter=reporter, opener=opener)
    with closing(session):
        path = api.fetch_admin_conf(session)
        if path is None:
            raise Gpuk8sError(f"{cp}: no /etc/kubernetes/admin.conf: the cluster is not "
                              "initialised (run invoke bootstrap)")
        session.reporter.print(f"admin kubeconfig: {path} (0600)\n"
                               f"  export KUBECONFIG={path}")
        return path


__all__ = ["add_node", "kubeconfig", "remove_node", "reprovision", "reset", "status",
           "upgrade"]
