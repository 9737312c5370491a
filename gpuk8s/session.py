"""A run's session: the inventory, the hosts in scope, one open transport per host, their
facts, the values phases hand each other, the reporter and the run folder."""

from __future__ import annotations

import collections
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpuk8s.errors import (
    ConnectError,
    Gpuk8sError,
    InventoryError,
    PhaseFailed,
)
from gpuk8s.executor import HostResult, HostRunner
from gpuk8s.facts import HostFacts
from gpuk8s.inventory import Host, Inventory, load_inventory
from gpuk8s.inventory.check import cluster_problems
from gpuk8s.inventory.model import BASTION
from gpuk8s.ops import Op
from gpuk8s.playbook import (
    package_cache_host,
)
from gpuk8s.report import Reporter, RunLog, untrusted
from gpuk8s.roles import HostContext
from gpuk8s.transport import ConnectSpec, Redactor, Transport, open_all, open_transport


@dataclass
class Session:
    """The state of one run: connections, facts and the values phases hand each other."""

    inventory: Inventory
    scope: list[str]
    reporter: Reporter
    redact: Redactor
    runlog: RunLog
    opener: Callable[[ConnectSpec, Redactor], Any] = open_transport
    transports: dict[str, Transport] = field(default_factory=dict)
    facts: dict[str, HostFacts] = field(default_factory=dict)
    cluster: dict[str, Any] = field(default_factory=dict)
    totals: dict[str, dict[str, Any]] = field(default_factory=dict)
    unreachable: dict[str, ConnectError] = field(default_factory=dict)
    #: hosts left out of the rest of the run (unreachable, lost, failed) -> the cause
    failed: dict[str, Gpuk8sError] = field(default_factory=dict)
    #: the control plane that speaks for the cluster when it is not the first (read-only
    #: commands with the first one unreachable)
    lead: str | None = None

    def host_totals(self, host: str) -> dict[str, Any]:
        """The final table's record of ``host`` (changed, ok, failed, time), made on first use."""
        return self.totals.setdefault(host, {"changed": 0, "ok": 0, "failed": 0, "time": 0.0})

    def close(self) -> None:
        try:
            for transport in self.transports.values():
                transport.close()
        finally:
            self.runlog.close()

    @property
    def first_cp(self) -> str:
        return self.lead or self.inventory.control_planes[0].name

    def host(self, name: str) -> Host:
        return self.inventory.hosts[name]

    def runner(self, name: str) -> HostRunner:
        """The executor for one host of this run: its transport, log, redaction and events."""
        return HostRunner(name, self.transports[name], self.redact,
                          self.runlog.host_logger(name), self.reporter.event,
                          float(self.host(name).vars["reboot_timeout"]),
                          record=self.runlog.add_step)

    def run(self, host: str, op: Op) -> str:
        """Run one op now on ``host`` through the executor; its output (CommandFailed when it
        fails). The script runs as ``sh`` runs a script (``set +e``: its exit code is its last
        command's), not under the ``set -e`` of a role's ops."""
        plain = replace(op, commands=("set +e", *op.commands))
        return self.runner(host).run_now([plain])[0][1]


def connect_spec(host: Host, env: Mapping[str, str] | None = None) -> ConnectSpec:
    """Connection settings of an inventory host."""
    password = host.become_password.reveal() if host.become_password else None
    return ConnectSpec(
        name=host.name, address=host.address, port=host.port, user=host.user,
        key_files=host.identity_files or ((host.private_key_file,) if host.private_key_file
                                          else ()),
        become=bool(host.become), become_password=password,
        local=host.connection == "local", proxy_jump=host.proxy_jump,
        proxy_command=host.proxy_command, known_hosts_files=tuple(host.known_hosts_files),
        ssh_config_file=host.ssh_config_file,
        host_key_policy=host.strict_host_key_checking or "yes")


def role_vars(host: Host) -> Mapping[str, Any]:
    """What roles read of a host: its merged variables, plus the login user (``ansible_user``,
    which gets the admin kubeconfig on a control plane)."""
    return collections.ChainMap({"ansible_user": host.user}, dict(host.vars))


def context(session: Session, host: str, role: str) -> HostContext:
    h = session.host(host)
    return HostContext(host, role, role_vars(h), session.facts[host], session.cluster,
                       h.groups)


def _runs_dir() -> Path:
    return Path(os.environ.get("GPUK8S_RUNS_DIR", "runs"))


def open_session(inventory: str | Path, *, limit: str | None, sets: Sequence[str],
                 command: str, reporter: Reporter | None, redact: Redactor | None = None,
                 opener: Callable[[ConnectSpec, Redactor], Any] = open_transport,
                 password_prompt: Callable[[str], str] | None = None,
                 allow_unreachable: bool = False, any_control_plane: bool = False) -> Session:
    """Load the inventory, then connect to the hosts in scope plus the first control plane.

    An unreachable host fails the run, unless ``allow_unreachable``: then it leaves the scope
    and is listed in ``session.unreachable``. The first control plane must always answer,
    unless ``any_control_plane`` (read-only commands): then the first one that answers speaks
    for the cluster."""
    inv = load_inventory(inventory, overrides=list(sets))
    if not inv.control_planes:
        raise InventoryError("no control plane in the inventory", path=str(inv.path),
                             fix="add a host under children: control_plane: hosts:")
    for problem in cluster_problems(inv):
        raise problem
    redact = redact or Redactor()
    reporter = reporter or Reporter(redact=redact)
    reporter.redact = redact
    for warning in inv.warnings:  # other playbooks' variables, ignored: said once per file
        reporter.print(f"warning: {untrusted(warning)}")
    # the cluster is control_plane + workers: other hosts of a shared inventory (Slurm login
    # nodes, storage, bastions) are never contacted
    members = [h for h in inv.select(limit) if h.is_control_plane or h.is_worker]
    selected = [h.name for h in members if not h.absent]
    for h in inv.select(limit):
        if h.absent:
            reporter.print(f"skipping {h.name}: absent: true in the inventory", style="dim")
        elif h not in members and BASTION in h.groups:
            reporter.print(f"skipping {h.name}: the bastion (the jump host of the others; not "
                           "a cluster member)", style="dim")
        elif h not in members:
            reporter.print(f"skipping {h.name}: in neither control_plane nor workers (not a "
                           "cluster member; never contacted)", style="dim")
    needy = [h for h in inv.needs_become_password() if h in selected]
    if needy and password_prompt is not None:  # --ask-become-pass
        inv = inv.with_become_password(password_prompt(f"sudo password for {', '.join(needy)}: "),
                                       needy)
    # otherwise hosts without a password try passwordless sudo (sudo -n); a refusal is one
    # clear ConnectError naming the host and where a password can be given
    session = Session(inv, selected, reporter, redact, RunLog(_runs_dir(), command, redact),
                      opener)
    cache = package_cache_host(inv)  # the nodes' apt needs it, whatever --limit says
    contact = list(dict.fromkeys([*selected, session.first_cp, *([cache] if cache else [])]))
    specs = [connect_spec(inv.hosts[h]) for h in contact]
    for spec in specs:
        redact.add(spec.become_password)
    if opener is open_transport:  # say on the terminal what connecting waits for
        opener = functools.partial(open_transport, notify=reporter.print)
    transports, errors = open_all(specs, redact, opener)
    session.transports = transports
    session.runlog.watch(lambda: {h: t.counters for h, t in session.transports.items()})
    session.runlog.mark("connect")
    if any_control_plane and session.first_cp in errors:
        live = [h.name for h in inv.control_planes if h.name in transports]
        session.lead = live[0] if live else None
    if errors and (not allow_unreachable or session.first_cp in errors):
        for t in transports.values():
            t.close()
        session.runlog.close()
        raise PhaseFailed("connect", {h: HostResult(h, error=e) for h, e in errors.items()})
    session.unreachable = dict(errors)
    session.scope = [h for h in session.scope if h not in errors]
    return session


def run_step(session: Session, host: str, script: str, what: str, *,
             timeout: float = 600) -> str:
    """Run one script on a host through the executor (logged and redacted like a phase's
    ops); its output; CommandFailed naming ``what`` on a non-zero exit."""
    return session.run(host, Op(what, (script,), f"+ {what}", timeout=timeout))
