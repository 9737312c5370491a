"""The playbook runner: preflight, then for each phase of gpuk8s.playbook: its hosts, fresh
facts where a host changed, the plan (+ / = / !), apply with the executor, the barrier and
the phase's hand-offs; hosts that fail are left out within --max-fail."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuk8s.cluster_values import cluster_values, mark_joined, use_lock
from gpuk8s.drain import drain, pause_gpu_clients, resume_gpu_clients, uncordon, wait_ready
from gpuk8s.errors import (
    ConnectError,
    Gpuk8sError,
    HostsFailed,
    PhaseFailed,
    PreflightError,
)
from gpuk8s.executor import HostResult, RoleWork, run_phase
from gpuk8s.facts.kube import Cluster
from gpuk8s.facts.system import PENDING_HANDLERS, PendingHandlers, System, handler_marker
from gpuk8s.gather import cluster_summary, gather
from gpuk8s.handoffs import fetch_admin_conf, mint_join, upload_certs
from gpuk8s.ops import Op, change, q
from gpuk8s.playbook import (
    PHASES,
    PREFLIGHT,
    Phase,
    package_cache_host,
)
from gpuk8s.report import Reporter
from gpuk8s.roles import PreflightExports, exports, load_role
from gpuk8s.session import DEFAULT_OPENER, Opener, Session, context, open_session


def preflight(session: Session, *, show: bool = True) -> None:
    """Run every host's checks and the cross-host ones; raise PreflightError on any error
    (``show``: print the warnings and problems first; status only reads them)."""
    errors: dict[str, list[tuple[str, str, str]]] = {}
    warnings: dict[str, list[tuple[str, str, str]]] = {}
    role = exports(PreflightExports)
    mark_joined(session)
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
    if show:
        session.reporter.warnings(warnings)
    if any(errors.values()):
        if show:
            session.reporter.problems("preflight problems", errors)
        raise PreflightError({h: p for h, p in errors.items() if p})


def phase_hosts(session: Session, phase: Phase) -> list[str]:
    if phase.hosts == "all":
        return list(session.scope)
    if phase.hosts == "first_control_plane":
        return [session.first_cp]
    if phase.hosts == "package_cache":
        cache = package_cache_host(session.inventory)
        return [cache] if cache in session.transports else []
    cps = {h.name for h in session.inventory.control_planes}
    if phase.hosts == "other_control_planes":
        return [h for h in session.scope if h in cps and h != session.first_cp]
    return [h for h in session.scope if h not in cps]


def plan_phase(session: Session, phase: Phase, hosts: Sequence[str]
               ) -> dict[str, list[RoleWork]]:
    work: dict[str, list[RoleWork]] = {}
    for host in hosts:
        items = []
        pending = session.facts[host].get(PendingHandlers()) or frozenset()
        for name in phase.roles:
            role = load_role(name)
            ctx = context(session, host, name)
            ops = role.plan(ctx)
            handlers = {k: fn(ctx) for k, fn in role.handlers().items()}
            items.append(_persist_notifies(name, ops, handlers, pending,
                                           role.replanned_handlers()))
        work[host] = items
    return work


def _ops(work: Mapping[str, Sequence[RoleWork]]) -> dict[str, list[Op]]:
    return {h: [op for rw in items for op in rw.ops] for h, items in work.items()}


def _persist_notifies(role: str, ops: Sequence[Op], handlers: Mapping[str, Op],
                      pending: frozenset[str], replanned: frozenset[str] = frozenset()
                      ) -> RoleWork:
    """A notification that survives an interrupted run: an op that notifies a handler first
    leaves the handler's marker on the host (PENDING_HANDLERS), and the handler removes it
    once it has run; a marker found at plan time (the run that made the change was killed
    before its handler, or the change failed half-way) notifies the handler again, so it
    runs where handlers run: after the role's ops and in the role's handler order (after a
    reboot the same run asks for). Left out: reboot handlers and those the role names in
    ``replanned`` (the driver role plans its reboot and its check from the loaded module)."""
    def marker(name: str) -> str:
        return q(f"{PENDING_HANDLERS}/{handler_marker(role, name)}")

    def kept(name: str) -> bool:
        return name in handlers and not handlers[name].reboot and name not in replanned

    marked = []
    for op in ops:
        names = [n for n in op.notify if kept(n)]
        if op.commands and names:
            touch = (f"mkdir -p {q(PENDING_HANDLERS)} && touch "
                     + " ".join(marker(n) for n in names))
            op = replace(op, commands=(touch, *op.commands))
        marked.append(op)
    # the handler's own commands in a subshell of their own: one that ends with `exit 0`
    # (restart_containerd's wait does) must not skip the marker's removal
    runnable = {n: replace(h, commands=("(\n" + "\n".join(h.commands) + "\n)",
                                        f"rm -f {marker(n)}")) if h.commands else h
                for n, h in handlers.items()}
    for name, handler in runnable.items():
        if kept(name) and handler_marker(role, name) in pending and handler.commands:
            marked.append(change(f"{role} | pending handler",
                                 f"+ {handler.reason.removeprefix('+ ')} (an interrupted run "
                                 "made the change and did not get to this)",
                                 "true", notify=(name,)))
    return RoleWork(role, tuple(marked), runnable)


def apply_phase(session: Session, phase: Phase, work: Mapping[str, Sequence[RoleWork]]
                ) -> dict[str, HostResult]:
    """Apply a phase's work: every host at once, or ``phase.serial`` changing hosts at a time
    (hosts with nothing to change go first, together), stopping after a batch that failed."""
    changing = [h for h, items in work.items() if any(op.changes for rw in items
                                                      for op in rw.ops)]
    batches = [list(work)]
    if phase.serial:
        quiet = [h for h in work if h not in changing]
        batches = ([quiet] if quiet else []) + [changing[i:i + phase.serial]
                                                for i in range(0, len(changing), phase.serial)]
    results: dict[str, HostResult] = {}
    for n, batch in enumerate(batches):
        emptied = _empty(session, phase, [h for h in batch if h in changing])
        session.reporter.start([h for h in batch if h in changing])
        try:
            results.update(run_phase({h: work[h] for h in batch},
                                     {h: session.runner(h) for h in batch}))
        finally:
            session.reporter.stop()
        for host, (node, cordoned_before) in emptied.items():
            if phase.pause_gpu_clients:
                resume_gpu_clients(session, node)
            if phase.wait_ready and not results[host].error:
                try:
                    wait_ready(session, node,
                               int(session.cluster["nodes"][host].get("allocatable_gpus", 0)),
                               int(session.host(host).vars[phase.drain_timeout_var]),
                               knob=phase.drain_timeout_var)
                except Gpuk8sError as exc:
                    results[host].error = exc
            if not results[host].error and not cordoned_before:
                uncordon(session, node)
        if any(results[h].error for h in batch) and n + 1 < len(batches):
            left = [h for b in batches[n + 1:] for h in b]
            session.reporter.print(f"{phase.name}: stopped after a failed batch; not started "
                                   f"on {', '.join(left)}", style="red")
            break
    return results


def _empty(session: Session, phase: Phase, hosts: Sequence[str]) -> dict[str, tuple[str, bool]]:
    """Drain the joined nodes among ``hosts`` when the phase asks for it, and take the GPU
    DaemonSets off them when it asks for that too; host -> (node name, whether an admin had
    cordoned it before the run: such a node is not uncordoned after)."""
    if not phase.drain_timeout_var:
        return {}
    cluster = session.facts[session.first_cp].get(Cluster())
    emptied = {}
    for host in hosts:
        node = str(session.cluster["nodes"][host]["name"])
        status = cluster.nodes.get(node) if cluster is not None else None
        if status is None:
            continue  # not in the cluster yet: nothing runs there
        timeout = int(session.host(host).vars[phase.drain_timeout_var])
        drain(session, node, timeout, knob=phase.drain_timeout_var)
        emptied[host] = (node, status.unschedulable)
        if phase.pause_gpu_clients:
            pause_gpu_clients(session, node, timeout, knob=phase.drain_timeout_var)
    return emptied


def _tally(session: Session, results: Mapping[str, HostResult]) -> None:
    for host, res in results.items():
        t = session.host_totals(host)
        t["changed"] += res.changed
        t["ok"] += res.ok
        t["failed"] += res.failed + (1 if res.error and not res.failed else 0)
        t["time"] += res.elapsed


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
        totals = session.host_totals(host)
        totals["failed"] = max(1, totals["failed"])
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


def bootstrap(inventory: str | Path, *, limit: str | None = None, check: bool = False,
              diff: bool = False, yes: bool = False, sets: Sequence[str] = (),
              reporter: Reporter | None = None, confirm: Callable[[str], bool] | None = None,
              opener: Opener = DEFAULT_OPENER,
              ask_become_pass: bool = False, max_fail: int | str = 0,
              quiet: bool = False, backup: bool | str = True,
              through: str | None = None, join_cordoned: bool = False) -> dict[str, Any]:
    """Bring every host in the inventory (or ``limit``) to a Ready GPU cluster node: open a
    session and converge it (gpuk8s.api.bootstrap; day2's add-node and reprovision too).

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
        backup: before the first change to a control plane of a running cluster, take a
            backup (gpuk8s.day2.backup); False says that none was taken (--no-backup), a
            string says why (a command that runs bootstrap and took one itself).
        through: the last phase to run (restore stops after "control-plane": the cluster's
            objects come from its snapshot); None runs them all.
        join_cordoned: a GPU worker that joins in this run cordons itself at once, for
            add-node's accept (accept_on_add).

    Returns:
        A summary dict: changes planned/applied per host, wall time, run folder.
    """
    command = "plan" if check else "bootstrap"
    fail_budget(max_fail, 0)  # a bad --max-fail fails before any host is contacted
    session = open_session(inventory, limit=limit, sets=sets, command=command,
                           reporter=reporter or (Reporter(quiet=True) if quiet else None),
                           opener=opener,
                           password_prompt=become_prompt(ask_become_pass),
                           allow_unreachable=str(max_fail).strip() not in ("0", "0%"))
    with closing(session):
        if join_cordoned:
            session.cluster["join_cordoned"] = True
        return converge(session, check=check, diff=diff, yes=yes, confirm=confirm,
                        max_fail=max_fail, backup=backup, through=through)


def become_prompt(ask: bool) -> Callable[[str], str] | None:
    """What asks for the sudo password with --ask-become-pass (getpass), else None."""
    if not ask:
        return None
    import getpass

    return getpass.getpass


def converge(session: Session, *, check: bool = False, diff: bool = False, yes: bool = True,
             confirm: Callable[[str], bool] | None = None,
             max_fail: int | str = 0, backup: bool | str = True,
             through: str | None = None, phases: Sequence[Phase] = PHASES) -> dict[str, Any]:
    """Gather, preflight, then plan/apply every phase on an open session (see bootstrap);
    ``phases``: another playbook (gpuk8s.playbook.UPGRADE_PHASES)."""
    from gpuk8s.backups import before_change

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
        use_lock(session)
        blocked: PreflightError | None = None
        try:
            preflight(session)
        except PreflightError as exc:
            unplannable = exports(PreflightExports).unplannable
            if not check or any(p[0] in unplannable for ps in exc.problems.values() for p in ps):
                raise  # a host that cannot be named, or has no systemd, has no plan either
            blocked = exc  # plan anyway: show what a fixed host would get
        planned_total = 0
        if not check and not yes:
            planned_total = _preview(session, diff, phases)
            question = f"apply {planned_total} change(s)? (later phases may add more) [y/N] "
            if planned_total and not confirmed(question, confirm):
                rep.print("nothing changed")
                return {"changed": 0, "aborted": True}
        dirty: set[str] = set()   # hosts changed since their facts were gathered
        cluster_moved = False     # anything changed since the first control plane's probe
        applied_total = 0
        backed_up = False        # the backup before the first control-plane change
        names = [p.name for p in phases]
        if through is not None and through not in names:
            raise ValueError(f"no phase {through!r} (phases: {', '.join(names)})")
        for phase in phases[:names.index(through) + 1] if through else phases:
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
            phase_began = time.monotonic()
            if "join_token" in phase.needs and not check:
                work = plan_phase(session, phase, hosts)
                if any(op.changes for items in work.values() for rw in items for op in rw.ops):
                    mint_join(session)
                    if "certificate_key" in phase.needs:
                        upload_certs(session)
            work = plan_phase(session, phase, hosts)
            changes = sum(op.changes for items in work.values() for rw in items
                          for op in rw.ops)
            warned = any(op.warning for items in work.values() for rw in items for op in rw.ops)
            # a phase with nothing to change still shows its warnings (a user's namespace kept)
            if work and (check or changes or diff or warned):
                rep.phase(f"{phase.name}: {phase.title}")
                n = rep.plan(_ops(work), show_all=check, diff=diff)
                planned_total += n if check else 0
            if check:
                session.runlog.add_phase(phase.name, {}, time.monotonic() - phase_began,
                                         _ops(work))
                continue
            if not changes:
                session.runlog.add_phase(phase.name, {h: HostResult(h) for h in work},
                                         time.monotonic() - phase_began, _ops(work))
                _tally(session, {h: _ok_result(h, work[h]) for h in work})
                continue
            changing = [h for h, items in work.items()
                        if any(op.changes for rw in items for op in rw.ops)]
            cps = [h for h in changing if session.host(h).is_control_plane]
            if cps and not backed_up:
                before_change(session, f"the {phase.name} phase changes {', '.join(cps)}",
                              backup)
                backed_up = True
            rep.begin_phase(phase.name, changing)
            results = apply_phase(session, phase, work)
            session.runlog.add_phase(phase.name, results, time.monotonic() - phase_began)
            _tally(session, results)
            applied_total += sum(r.changed for r in results.values())
            errors = {h: r.error for h, r in results.items() if r.error}
            if errors:
                _leave_out(session, phase.name, errors, budget, results)
            changed_hosts = {h for h, r in results.items() if r.changed}
            dirty |= changed_hosts
            cluster_moved = cluster_moved or bool(changed_hosts)
            if "admin_conf" in phase.provides:
                path = fetch_admin_conf(session)
                if path:
                    rep.print(f"admin kubeconfig: {path} (0600)")
        cluster = {} if check else cluster_summary(session, fresh=applied_total > 0)
        elapsed = time.monotonic() - started
        failed = {h: session.redact(str(e)) for h, e in session.failed.items()}
        report = session.runlog.write_report(wall_time=round(elapsed, 3), check=check,
                                             failed_hosts=_failed_rows(session),
                                             cluster=cluster)
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


def _ok_result(host: str, items: Sequence[RoleWork]) -> HostResult:
    from gpuk8s.executor import OpResult

    res = HostResult(host)
    res.results = [OpResult(host, op, "warning" if op.warning else "ok")
                   for rw in items for op in rw.ops]
    return res


def _preview(session: Session, diff: bool, phases: Sequence[Phase] = PHASES) -> int:
    """Print the plan of every phase on current facts; return the number of changes."""
    total = 0
    for phase in phases:
        work = plan_phase(session, phase, phase_hosts(session, phase))
        ops = _ops(work)
        n = sum(op.changes for v in ops.values() for op in v)
        if n:
            session.reporter.phase(f"{phase.name}: {phase.title}")
            session.reporter.plan(ops, show_all=False, diff=diff)
        total += n
    return total


def confirmed(question: str, confirm: Callable[[str], bool] | None = None,
              expected: str | None = None) -> bool:
    """The one confirmation prompt (bootstrap's and every day-2 command's): ``confirm``'s
    answer (tests), else a line typed on the terminal: ``expected`` exactly where given (reset
    makes you type the control plane's name), else y or yes in any case. Without a terminal
    on stdin nobody can answer: refused, with the way round (--yes)."""
    if confirm is not None:
        return confirm(question)
    if not sys.stdin.isatty():
        raise Gpuk8sError("refusing to change hosts without confirmation: stdin is not a "
                          "terminal; pass --yes")
    answer = input(question).strip()
    return answer == expected if expected else answer.lower() in ("y", "yes")
