"""The entry points tasks.py and the CLI call: bootstrap, plan, facts.

Each run: load and validate the inventory (no host contacted), connect to every host once, gather
facts with one probe per host, preflight, then per phase plan -> show -> apply -> barrier, probing
again only the hosts a phase changed.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import secrets
import stat
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuk8s.errors import (
    ConnectError,
    ConnectionLost,
    Gpuk8sError,
    HostsFailed,
    InventoryError,
    PhaseFailed,
    PreflightError,
)
from gpuk8s.executor import HostResult, HostRunner, RoleWork, run_phase
from gpuk8s.executor import parallel as in_parallel
from gpuk8s.facts import Fact, HostFacts
from gpuk8s.facts.kube import ADMIN_CONF
from gpuk8s.facts.probe import build_probe, parse_probe
from gpuk8s.facts.system import Files, PciDevices, System
from gpuk8s.inventory import Host, Inventory, load_inventory
from gpuk8s.ops import Op, q
from gpuk8s.playbook import (
    ALL_ROLES,
    PHASES,
    PREFLIGHT,
    Phase,
    package_cache_host,
    package_cache_url,
)
from gpuk8s.report import Reporter, RunLog
from gpuk8s.roles import HostContext, load_role
from gpuk8s.transport import ConnectSpec, Redactor, Transport, open_all, open_transport

_JOIN_RE = re.compile(r"kubeadm join (\S+) --token (\S+)\s+--discovery-token-ca-cert-hash (\S+)")


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

    def close(self) -> None:
        for transport in self.transports.values():
            transport.close()

    @property
    def first_cp(self) -> str:
        return self.inventory.control_planes[0].name

    def host(self, name: str) -> Host:
        return self.inventory.hosts[name]


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


# -- facts ------------------------------------------------------------------------------------
def role_vars(host: Host) -> Mapping[str, Any]:
    """What roles read of a host: its merged variables, plus the login user (``ansible_user``,
    which gets the admin kubeconfig on a control plane)."""
    return collections.ChainMap({"ansible_user": host.user}, dict(host.vars))


def fact_requests(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    """Every fact any role needs on a host with these vars, each once."""
    seen: dict[Fact[Any], None] = {}
    for role in ALL_ROLES:
        for fact in load_role(role).facts(vars):
            seen.setdefault(fact, None)
    return list(seen)


def gather(session: Session, hosts: Sequence[str]) -> None:
    """One probe per host, all hosts in parallel; raise PhaseFailed if any probe fails."""

    def one(name: str) -> HostFacts:
        requests = fact_requests(role_vars(session.host(name)))
        script, marker = build_probe(requests)
        result = session.transports[name].run(script, timeout=120)
        return parse_probe(name, result.stdout, requests, marker)

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


def context(session: Session, host: str, role: str) -> HostContext:
    h = session.host(host)
    return HostContext(host, role, role_vars(h), session.facts[host], session.cluster,
                       h.groups)


# -- cluster-wide values -----------------------------------------------------------------------
def cluster_values(session: Session) -> None:
    """Node names, addresses and GPU counts of the hosts in this run; the API endpoint."""
    cp = session.host(session.first_cp)
    endpoint = cp.vars["control_plane_endpoint"] or f"{cp.address}:6443"
    nodes = {}
    for name in session.facts:
        facts = session.facts[name]
        gpus = [d for d in facts[PciDevices()] if d.is_gpu]
        nodes[name] = {"name": facts[System()].hostname.lower(),
                       "address": session.host(name).address, "gpus": len(gpus),
                       "model": gpus[0].model if gpus else ""}
    session.cluster.update(endpoint=endpoint, advertise_address=cp.address,
                           node_name=nodes.get(cp.name, {}).get("name", cp.name), nodes=nodes,
                           package_cache_url=package_cache_url(session.inventory))


def _file_exists(facts: HostFacts, path: str) -> bool:
    """Whether any Files fact gathered for the host saw ``path`` (whichever role asked)."""
    for fact, value in facts.items():
        if isinstance(fact, Files) and path in value:
            return bool(value[path].exists)
    return False


def preflight(session: Session) -> None:
    """Run every host's checks and the cross-host ones; raise PreflightError on any error."""
    errors: dict[str, list[tuple[str, str, str]]] = {}
    warnings: dict[str, list[tuple[str, str, str]]] = {}
    role = load_role(PREFLIGHT).module
    for name in session.scope:
        session.cluster.setdefault("joined", {})[name] = _file_exists(
            session.facts[name], "/etc/kubernetes/kubelet.conf")
    for name in session.scope:
        errs, warns = role.check(context(session, name, PREFLIGHT))
        errors[name], warnings[name] = list(errs), list(warns)
    for attr, label in (("hostname", "hostname"), ("product_uuid", "product_uuid"),
                        ("machine_id", "machine-id")):
        seen: dict[str, str] = {}
        for name in session.facts:
            value = getattr(session.facts[name][System()], attr)
            if not value:
                continue
            if value in seen and name in session.scope:
                errors.setdefault(name, []).append((
                    f"unique_{attr}", f"{label} {value!r} is the same as on {seen[value]}",
                    f"give every node its own {label} (cloned VM images often share it)"))
            seen.setdefault(value, name)
    session.reporter.warnings(warnings)
    if any(errors.values()):
        session.reporter.problems("preflight problems", errors)
        raise PreflightError({h: p for h, p in errors.items() if p})


# -- phases ------------------------------------------------------------------------------------
def phase_hosts(session: Session, phase: Phase) -> list[str]:
    if phase.hosts == "all":
        return list(session.scope)
    if phase.hosts == "first_control_plane":
        return [session.first_cp]
    if phase.hosts == "package_cache":
        cache = package_cache_host(session.inventory)
        return [cache] if cache in session.transports else []
    return [h for h in session.scope if h != session.first_cp]


def plan_phase(session: Session, phase: Phase, hosts: Sequence[str]
               ) -> dict[str, list[RoleWork]]:
    work: dict[str, list[RoleWork]] = {}
    for host in hosts:
        items = []
        for name in phase.roles:
            role = load_role(name)
            ctx = context(session, host, name)
            ops = role.plan(ctx)
            handlers = {k: fn(ctx) for k, fn in role.handlers().items()}
            items.append(RoleWork(name, tuple(ops), handlers))
        work[host] = items
    return work


def _ops(work: Mapping[str, Sequence[RoleWork]]) -> dict[str, list[Op]]:
    return {h: [op for rw in items for op in rw.ops] for h, items in work.items()}


def mint_join(session: Session) -> None:
    """A fresh short-lived token on the first control plane, kept in memory only."""
    cp = session.first_cp
    ttl = session.host(cp).vars["join_token_ttl"]
    result = session.transports[cp].run(
        f"kubeadm token create --ttl {q(str(ttl))} --print-join-command 2>&1", timeout=120)
    match = _JOIN_RE.search(result.stdout)
    if result.exit_code != 0 or not match:
        raise PhaseFailed("join", {cp: HostResult(cp, error=Gpuk8sError(
            f"{cp}: kubeadm token create failed (exit {result.exit_code}): "
            + session.redact(result.stdout.strip()[-500:])))})
    session.redact.add(match.group(2), match.group(2).split(".")[-1])
    session.cluster["join"] = {"endpoint": match.group(1), "token": match.group(2),
                               "ca_hash": match.group(3)}


#: what a kubeadm admin.conf user may hold: client certificate and key, inline. Anything
#: else (an exec or auth-provider plugin, a token file, paths) would be run or read on the
#: admin machine by the operator's next kubectl, on the control plane's say-so.
_KUBECONFIG_USER_KEYS = {"client-certificate-data", "client-key-data"}
_KUBECONFIG_CLUSTER_KEYS = {"server", "certificate-authority-data", "tls-server-name"}


def check_admin_conf(text: str, host: str) -> None:
    """Refuse a kubeconfig from ``host`` that is not plain kubeadm admin.conf material."""
    def bad(why: str) -> Gpuk8sError:
        return Gpuk8sError(f"{host}: {ADMIN_CONF} is refused: {why}; it is not what kubeadm "
                           "writes, so it is not saved on this machine. Check the control "
                           f"plane (kubeadm init phase kubeconfig admin rewrites it)")
    try:
        conf = yaml.safe_load(text)
    except yaml.YAMLError:
        raise bad("it is not YAML") from None
    if not isinstance(conf, dict) or conf.get("kind") != "Config":
        raise bad("it is not a kubeconfig (kind: Config)")
    for entry in conf.get("users") or []:
        user = entry.get("user") if isinstance(entry, dict) else None
        extra = sorted(set(user or {}) - _KUBECONFIG_USER_KEYS) if isinstance(user, dict) \
            else ["(not a mapping)"]
        if extra:
            raise bad(f"user {entry.get('name') if isinstance(entry, dict) else entry!r} has "
                      f"{', '.join(extra)} (only client-certificate-data and client-key-data "
                      "are accepted)")
    clusters = conf.get("clusters") or []
    if not clusters:
        raise bad("it names no cluster")
    for entry in clusters:
        cluster = entry.get("cluster") if isinstance(entry, dict) else None
        if not isinstance(cluster, dict):
            raise bad("a cluster entry is not a mapping")
        extra = sorted(set(cluster) - _KUBECONFIG_CLUSTER_KEYS)
        if extra:
            raise bad(f"a cluster has {', '.join(extra)}")
        if not str(cluster.get("server", "")).startswith("https://"):
            raise bad(f"the server {cluster.get('server')!r} is not an https:// URL")


def write_private(dest: Path, data: str) -> None:
    """Write ``data`` to ``dest`` readable by this user only, atomically, never through a
    symlink, in a folder no one else can write to."""
    folder = dest.parent
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = folder.lstat()
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise Gpuk8sError(
            f"{folder} is refused for secrets: it is "
            + ("a symlink" if stat.S_ISLNK(st.st_mode) else
               f"owned by uid {st.st_uid}" if st.st_uid != os.getuid() else
               f"writable by others (mode {stat.S_IMODE(st.st_mode):o})")
            + f"; make it your own with mode 0700 (chmod 0700 {folder})")
    tmp = folder / f".{dest.name}.{secrets.token_hex(6)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(data)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def fetch_admin_conf(session: Session) -> Path | None:
    """Copy admin.conf to <inventory dir>/artifacts/admin.conf (0600) on the admin machine,
    once it is checked to be plain kubeadm material (see check_admin_conf)."""
    cp = session.first_cp
    result = session.transports[cp].run(f"cat {ADMIN_CONF}")
    if result.exit_code != 0:
        return None
    data = result.stdout
    for line in data.splitlines():
        key, _, value = line.strip().partition(":")
        if key.endswith("-data") and value.strip():
            session.redact.add(value.strip())
    check_admin_conf(data, cp)
    dest = Path(session.inventory.path).resolve().parent / "artifacts" / "admin.conf"
    write_private(dest, data)
    return dest


def apply_phase(session: Session, phase: Phase, work: Mapping[str, Sequence[RoleWork]]
                ) -> dict[str, HostResult]:
    runners = {h: HostRunner(h, session.transports[h], session.redact,
                             session.runlog.host_logger(h), session.reporter.event,
                             float(session.host(h).vars["reboot_timeout"])) for h in work}
    changing = [h for h, items in work.items() if any(op.changes for rw in items
                                                      for op in rw.ops)]
    session.reporter.start(changing)
    try:
        results = run_phase(work, runners)
    finally:
        session.reporter.stop()
    return results


def _tally(session: Session, results: Mapping[str, HostResult]) -> None:
    for host, res in results.items():
        t = session.totals.setdefault(host, {"changed": 0, "ok": 0, "failed": 0, "time": 0.0})
        t["changed"] += res.changed
        t["ok"] += res.ok
        t["failed"] += res.failed + (1 if res.error and not res.failed else 0)
        t["time"] += res.elapsed


# -- failed hosts --------------------------------------------------------------------------------
def fail_budget(max_fail: int | str, hosts: int) -> int:
    """How many hosts may fail before the run stops: ``--max-fail`` as a count ("1") or a
    percentage of the hosts in the run ("25%", rounded down)."""
    text = str(max_fail).strip()
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            if not 0 <= pct <= 100:
                raise ValueError(text)
            return int(hosts * pct // 100)
        count = int(text)
        if count < 0:
            raise ValueError(text)
        return count
    except ValueError:
        raise Gpuk8sError(f"--max-fail must be a count like 1 or a percentage like 25%, got "
                          f"{text!r}") from None


def _leave_out(session: Session, stage: str, errors: Mapping[str, Gpuk8sError],
               budget: int, results: Mapping[str, Any]) -> None:
    """Record failed hosts and take them out of the rest of the run; raise PhaseFailed when
    the first control plane failed or more hosts failed than ``budget`` allows."""
    for host, err in errors.items():
        session.failed[host] = err
        session.totals.setdefault(host, {"changed": 0, "ok": 0, "failed": 1, "time": 0.0})
    if session.first_cp in errors or len(session.failed) > budget:
        raise PhaseFailed(stage, results)
    for host in errors:
        session.scope = [h for h in session.scope if h != host]
        session.facts.pop(host, None)
        transport = session.transports.pop(host, None)
        if transport is not None:
            with contextlib.suppress(Exception):
                transport.close()
    session.reporter.print(
        f"{stage}: left out of the rest of the run: {', '.join(sorted(errors))} "
        f"({len(session.failed)} failed host(s), --max-fail allows {budget})", style="red")


# -- entry points ------------------------------------------------------------------------------
def _runs_dir() -> Path:
    return Path(os.environ.get("GPUK8S_RUNS_DIR", "runs"))


def open_session(inventory: str | Path, *, limit: str | None, sets: Sequence[str],
                 command: str, reporter: Reporter | None, redact: Redactor | None = None,
                 opener: Callable[[ConnectSpec, Redactor], Any] = open_transport,
                 password_prompt: Callable[[str], str] | None = None,
                 allow_unreachable: bool = False) -> Session:
    """Load the inventory, then connect to the hosts in scope plus the first control plane.

    An unreachable host fails the run, unless ``allow_unreachable``: then it leaves the scope
    and is listed in ``session.unreachable`` (the first control plane must always answer)."""
    inv = load_inventory(inventory, overrides=list(sets))
    if not inv.control_planes:
        raise InventoryError("no control plane in the inventory", path=str(inv.path),
                             fix="add a host under children: control_plane: hosts:")
    if len(inv.control_planes) > 1:
        raise InventoryError(
            f"{len(inv.control_planes)} control planes; gpuk8s supports one for now",
            path=str(inv.path), fix="keep one host under control_plane")
    redact = redact or Redactor()
    reporter = reporter or Reporter(redact=redact)
    reporter.redact = redact
    selected = [h.name for h in inv.select(limit) if not h.absent]
    skipped = [h.name for h in inv.select(limit) if h.absent]
    for name in skipped:
        reporter.print(f"skipping {name}: absent: true in the inventory", style="dim")
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
    transports, errors = open_all(specs, redact, opener)
    session.transports = transports
    session.runlog.watch(lambda: {h: t.counters for h, t in session.transports.items()})
    session.runlog.mark("connect")
    if errors and (not allow_unreachable or session.first_cp in errors):
        for t in transports.values():
            t.close()
        raise PhaseFailed("connect", {h: HostResult(h, error=e) for h, e in errors.items()})
    session.unreachable = dict(errors)
    session.scope = [h for h in session.scope if h not in errors]
    return session


def bootstrap(inventory: str | Path, *, limit: str | None = None, check: bool = False,
              diff: bool = False, yes: bool = False, sets: Sequence[str] = (),
              reporter: Reporter | None = None, confirm: Callable[[str], bool] | None = None,
              opener: Callable[[ConnectSpec, Redactor], Any] = open_transport,
              ask_become_pass: bool = False, max_fail: int | str = 0) -> dict[str, Any]:
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

    Returns:
        A summary dict: changes planned/applied per host, wall time, run folder.
    """
    command = "plan" if check else "bootstrap"
    fail_budget(max_fail, 0)  # a bad --max-fail fails before any host is contacted
    session = open_session(inventory, limit=limit, sets=sets, command=command,
                           reporter=reporter, opener=opener,
                           password_prompt=_prompt() if ask_become_pass else None,
                           allow_unreachable=str(max_fail).strip() not in ("0", "0%"))
    with closing(session):
        return converge(session, check=check, diff=diff, yes=yes, confirm=confirm,
                        max_fail=max_fail)


def converge(session: Session, *, check: bool = False, diff: bool = False, yes: bool = True,
             confirm: Callable[[str], bool] | None = None,
             max_fail: int | str = 0) -> dict[str, Any]:
    """Gather, preflight, then plan/apply every phase on an open session (see bootstrap)."""
    started = time.monotonic()
    rep = session.reporter
    budget = fail_budget(max_fail, len(session.scope) + len(session.unreachable))
    try:
        if session.unreachable:
            _leave_out(session, "connect", session.unreachable, budget,
                       {h: HostResult(h, error=e) for h, e in session.unreachable.items()})
        try:
            gather(session, list(session.transports))
        except PhaseFailed as exc:
            _leave_out(session, "facts", {h: r.error for h, r in exc.results.items()
                                          if r.error}, budget, exc.results)
        cluster_values(session)
        blocked: PreflightError | None = None
        try:
            preflight(session)
        except PreflightError as exc:
            unnamed = any(p[0] == "hostname" for ps in exc.problems.values() for p in ps)
            if not check or unnamed:
                raise  # a host that cannot be named cannot be planned for either
            blocked = exc  # plan anyway: show what a fixed host would get
        planned_total = 0
        if not check and not yes:
            planned_total = _preview(session, diff)
            if planned_total and not _confirm(confirm, planned_total):
                rep.print("nothing changed")
                return {"changed": 0, "aborted": True}
        dirty: set[str] = set()   # hosts changed since their facts were gathered
        cluster_moved = False     # anything changed since the first control plane's probe
        applied_total = 0
        for phase in PHASES:
            hosts = phase_hosts(session, phase)
            regather = dirty & set(hosts)
            if cluster_moved and session.first_cp in hosts:
                regather.add(session.first_cp)
            if regather:
                gather(session, sorted(regather))
                cluster_values(session)
                dirty -= regather
                if session.first_cp in regather:
                    cluster_moved = False
            if phase.name == "join" and not check:
                work = plan_phase(session, phase, hosts)
                if any(op.changes for items in work.values() for rw in items for op in rw.ops):
                    mint_join(session)
            work = plan_phase(session, phase, hosts)
            changes = sum(op.changes for items in work.values() for rw in items
                          for op in rw.ops)
            if work and (check or changes or diff):
                rep.phase(f"{phase.name}: {phase.title}")
                n = rep.plan(_ops(work), show_all=check, diff=diff)
                planned_total += n if check else 0
            if check:
                session.runlog.add_phase(phase.name, {}, 0.0, _ops(work))
                continue
            if not changes:
                session.runlog.add_phase(phase.name, {h: HostResult(h) for h in work}, 0.0,
                                         _ops(work))
                _tally(session, {h: _ok_result(h, work[h]) for h in work})
                continue
            t0 = time.monotonic()
            results = apply_phase(session, phase, work)
            session.runlog.add_phase(phase.name, results, time.monotonic() - t0)
            _tally(session, results)
            applied_total += sum(r.changed for r in results.values())
            errors = {h: r.error for h, r in results.items() if r.error}
            if errors:
                _leave_out(session, phase.name, errors, budget, results)
            changed_hosts = {h for h, r in results.items() if r.changed}
            dirty |= changed_hosts
            cluster_moved = cluster_moved or bool(changed_hosts)
            if phase.name == "control-plane":
                path = fetch_admin_conf(session)
                if path:
                    rep.print(f"admin kubeconfig: {path} (0600)")
        elapsed = time.monotonic() - started
        failed = {h: session.redact(str(e)) for h, e in session.failed.items()}
        report = session.runlog.write_report(wall_time=round(elapsed, 3), check=check,
                                             failed_hosts=_failed_rows(session))
        if check:
            rep.print(f"\nplan: {planned_total} change(s); nothing was changed "
                      f"({elapsed:.2f}s)")
            if blocked is not None:
                rep.print("bootstrap would stop at preflight (problems above) before "
                          "changing anything", style="red")
                raise blocked
        else:
            rep.summary(session.totals, elapsed, failed=_failed_rows(session))
            if not applied_total and not failed:
                rep.print(f"no changes: the cluster already matches the inventory "
                          f"({elapsed:.2f}s)")
        rep.print(f"run folder: {report.parent}", style="dim")
        if session.failed:
            raise HostsFailed({h: HostResult(h, error=e) for h, e in session.failed.items()},
                              {"changed": applied_total, "run_dir": str(report.parent),
                               "totals": session.totals, "failed": failed})
        return {"changed": applied_total, "planned": planned_total, "wall_time": elapsed,
                "run_dir": str(report.parent), "totals": session.totals}
    except HostsFailed:
        raise
    except Gpuk8sError as exc:
        session.runlog.write_report(error=session.redact(str(exc)),
                                    failed_hosts=_failed_rows(session))
        raise


def _failed_rows(session: Session) -> dict[str, dict[str, str]]:
    """report.json's and the final table's view of failed hosts: status and cause."""
    return {h: {"status": "unreachable" if isinstance(e, ConnectError) else "failed",
                "cause": session.redact(str(e))} for h, e in session.failed.items()}


def _prompt() -> Callable[[str], str]:
    import getpass

    return getpass.getpass


def _ok_result(host: str, items: Sequence[RoleWork]) -> HostResult:
    from gpuk8s.executor import OpResult

    res = HostResult(host)
    res.results = [OpResult(host, op, "warning" if op.warning else "ok")
                   for rw in items for op in rw.ops]
    return res


def _preview(session: Session, diff: bool) -> int:
    """Print the plan of every phase on current facts; return the number of changes."""
    total = 0
    for phase in PHASES:
        work = plan_phase(session, phase, phase_hosts(session, phase))
        ops = _ops(work)
        n = sum(op.changes for v in ops.values() for op in v)
        if n:
            session.reporter.phase(f"{phase.name}: {phase.title}")
            session.reporter.plan(ops, show_all=False, diff=diff)
        total += n
    return total


def _confirm(confirm: Callable[[str], bool] | None, changes: int) -> bool:
    question = f"apply {changes} change(s)? (later phases may add more) [y/N] "
    if confirm is not None:
        return confirm(question)
    if not sys.stdin.isatty():
        raise Gpuk8sError("refusing to change hosts without confirmation: stdin is not a "
                          "terminal; pass --yes")
    return input(question).strip().lower() in ("y", "yes")


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
        session.runlog.write_report(facts=json.loads(json.dumps(data, default=_jsonable)))
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


__all__ = ["ConnectError", "bootstrap", "facts", "plan"]
