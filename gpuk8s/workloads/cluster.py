"""Talking to the cluster through the first control plane's kubectl: run, probe, apply, and
wait for a workload's objects and pods."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.text import Text

from gpuk8s.inventory import load_inventory
from gpuk8s.ops import Op, kube
from gpuk8s.ops.kube import apply_script
from gpuk8s.report import Cell, Column, Reporter
from gpuk8s.session import DEFAULT_OPENER, Opener, Session, open_session
from gpuk8s.sinks import shell
from gpuk8s.transport import CommandResult
from gpuk8s.workloads.rendering import dump
from gpuk8s.workloads.values import WorkloadError

#: the one kubectl (gpuk8s.ops.kube), with a bound on each request: workload commands wait
#: in their own loops, not in a hung request
KUBECTL = f"{kube.KUBECTL} --request-timeout=20s"


#: namespaced kinds a workload may create (undeploy deletes these by label)
NS_KINDS = "deployments,jobs,services,configmaps,secrets,serviceaccounts,persistentvolumeclaims"


# -- talking to the control plane ---------------------------------------------------------------
@dataclass
class Remote:
    """kubectl on the first control plane through the run's transport; every script and its
    output go to the run folder, redacted."""

    session: Session

    @property
    def host(self) -> str:
        return self.session.first_cp

    def run(self, script: str, timeout: float = 120, what: str = "kubectl") -> CommandResult:
        """One script on the control plane through the executor; its exit code and output."""
        # set +e: the script runs as sh runs it; its exit code is its last command's
        op = Op(f"workload | {what}", ("set +e", script), f"+ {what}", timeout=timeout)
        rc, out = self.session.runner(self.host).run_now([op], keep_going=True)[0]
        return CommandResult(rc, out)

    def probe(self, commands: Mapping[str, str], timeout: float = 120
              ) -> dict[str, tuple[int, str]]:
        """Several kubectl commands in one round trip: {key: (exit code, output)}; each is an
        op of one script (the executor's sections), run whatever the others' exit codes."""
        keys = list(commands)
        # set +e: a check's exit code is its last command's, as the check reads it
        ops = [Op(f"workload | {key}", (f'set +e\nk="{KUBECTL}"\n{commands[key]}',), f"? {key}",
                  timeout=timeout) for key in keys]
        results = self.session.runner(self.host).run_now(ops, keep_going=True)
        return {key: (rc, out.rstrip("\n")) for key, (rc, out) in zip(keys, results,
                                                                     strict=True)}

    def apply(self, docs: Sequence[Mapping[str, Any]]) -> str:
        result = self.run(apply_script(dump(docs), KUBECTL), timeout=180, what="apply")
        if not result.ok:
            raise WorkloadError(f"{self.host}: kubectl apply failed (exit {result.exit_code}):\n"
                                + self.session.redact(result.stdout.strip()[-1500:]))
        return result.stdout


def _control_plane(inventory: str | Path) -> str:
    inv = load_inventory(inventory)
    if not inv.control_planes:
        raise WorkloadError("no control plane in the inventory: workloads are deployed "
                            "through the first control plane's kubectl")
    return inv.control_planes[0].name


def open_control_plane(inventory: str | Path, command: str, reporter: Reporter | None,
                       *, all_hosts: bool = False,
                       opener: Opener = DEFAULT_OPENER
                       ) -> Session:
    """A session connected to the first control plane only (or every host, for NFS clients)."""
    limit = None if all_hosts else _control_plane(inventory)
    return open_session(inventory, limit=limit, sets=(), command=command, reporter=reporter,
                        opener=opener)


def _json(text: str, what: str) -> dict[str, Any]:
    start = text.find("{")
    try:
        data: dict[str, Any] = json.JSONDecoder().raw_decode(text[start:])[0] if start >= 0 \
            else {}
    except ValueError:
        data = {}
    if not data and text.strip():
        raise WorkloadError(f"cannot read {what} from kubectl: {text.strip()[-300:]}")
    return data


# -- waiting ------------------------------------------------------------------------------------
@dataclass
class PodRow:
    name: str
    node: str
    phase: str
    gpus: int
    detail: str = ""
    host_ip: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    #: what `kubectl get pods` shows in STATUS: a waiting reason (ContainerCreating,
    #: ImagePullBackOff...), Running, Completed, or the phase
    status: str = ""
    #: the pod's latest event, "Reason: message" (Pulling image, FailedMount, BackOff...)
    event: str = ""


@dataclass
class WaitResult:
    ready: bool
    pods: list[PodRow]
    problems: list[str]
    objects: dict[str, str]   # "Kind/name" -> its state in words
    services: list[dict[str, Any]] = field(default_factory=list)


def _gpus(pod: Mapping[str, Any]) -> int:
    total = 0
    for c in pod.get("spec", {}).get("containers") or []:
        limits = (c.get("resources") or {}).get("limits") or {}
        total += int(str(limits.get("nvidia.com/gpu", 0)))
    return total


def _cond(obj: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    for c in obj.get("status", {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return None


#: container waiting reasons that do not go away by waiting (kube.WAITING_FIXES says what to
#: do about each): past the grace time they are the workload's problem
STUCK = set(kube.WAITING_FIXES)


def container_states(pod: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(container, state kind, state) of every init container and container, in order."""
    st = pod.get("status", {})
    out = []
    for c in [*(st.get("initContainerStatuses") or []), *(st.get("containerStatuses") or [])]:
        for kind, state in (c.get("state") or {}).items():
            out.append((str(c.get("name", "")), kind, dict(state or {})))
    return out


def container_detail(pod: Mapping[str, Any]) -> str:
    """What a pod's containers are doing, in words: a stuck wait with its message, or how a
    container ended (reason and exit code, as `kubectl get pods` shows them)."""
    for name, kind, state in container_states(pod):
        if kind == "waiting" and state.get("reason") in STUCK:
            return f"{state['reason']}: {state.get('message', '')}".strip(": ")
        if kind == "terminated" and state.get("exitCode", 0) != 0:
            msg = f" ({state['message']})" if state.get("message") else ""
            return (f"container {name}: {state.get('reason', 'Error')}, exit code "
                    f"{state.get('exitCode')}{msg}")
    return ""


def pod_status(pod: Mapping[str, Any]) -> str:
    """The pod's STATUS as `kubectl get pods` shows it: the first container's waiting reason
    or termination reason while the pod is not running, else Completed or the phase."""
    phase = str(pod.get("status", {}).get("phase", "Pending"))
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return "Terminating"
    for _name, kind, state in container_states(pod):
        if kind == "waiting" and state.get("reason"):
            return str(state["reason"])
        if kind == "terminated" and phase != "Succeeded" and state.get("reason") and \
                state.get("exitCode", 0) != 0:
            return str(state["reason"])
    return "Completed" if phase == "Succeeded" else phase


def _event_time(ev: Mapping[str, Any]) -> str:
    return str(ev.get("lastTimestamp") or ev.get("eventTime") or ev.get("firstTimestamp")
               or "")


def pod_events(events: Sequence[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Events about pods, oldest first, keyed by the pod's uid and by its name (events of an
    earlier pod of the same name carry that pod's uid: :func:`events_of` leaves them out)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for ev in sorted(events, key=_event_time):
        inv = ev.get("involvedObject") or {}
        if inv.get("kind") == "Pod":
            out.setdefault(str(inv.get("name", "")), []).append(dict(ev))
    return out


def events_of(pod: Mapping[str, Any], by_name: Mapping[str, list[dict[str, Any]]]
              ) -> list[dict[str, Any]]:
    meta = pod.get("metadata", {})
    uid = meta.get("uid")
    return [e for e in by_name.get(str(meta.get("name", "")), [])
            if not uid or not (e.get("involvedObject") or {}).get("uid")
            or e["involvedObject"]["uid"] == uid]


def _words(ev: Mapping[str, Any] | None) -> str:
    """An event as "Reason: message", the message's first line only."""
    if not ev:
        return ""
    msg = str(ev.get("message") or "").strip().splitlines()
    return f"{ev.get('reason', '')}: {msg[0] if msg else ''}".strip(": ")


def snapshot(remote: Remote, namespace: str, selector: str,
             unschedulable_since: dict[str, float], pending_grace: float) -> WaitResult:
    """One look at the workload's objects, pods and their events. ``unschedulable_since``
    keeps, between looks, when each problem was first seen: a problem is final when it has
    lasted ``pending_grace`` seconds (a FailedMount at least kube.MOUNT_GRACE)."""
    ns = shell(namespace)
    sel = shell(selector)
    res = remote.probe({
        "objects": f"$k get deployments,jobs,persistentvolumeclaims,services,pods -n {ns} "
                   f"-l {sel} -o json",
        "events": f"$k get events -n {ns} -o json"})
    rc, out = res["objects"]
    if rc != 0:
        raise WorkloadError(f"{remote.host}: kubectl get failed: {out.strip()[-300:]}")
    items = _json(out, "objects").get("items", [])
    events = _json(res["events"][1], "events").get("items", []) if res["events"][0] == 0 else []
    by_pod = pod_events(events)
    objects: dict[str, str] = {}
    problems: list[str] = []
    pods: list[PodRow] = []
    services: list[dict[str, Any]] = []
    ready = True
    now = time.monotonic()
    for item in items:
        kind, meta = item.get("kind"), item.get("metadata", {})
        name, spec, st = meta.get("name", ""), item.get("spec", {}), item.get("status", {})
        if kind == "Deployment":
            want, have = int(spec.get("replicas", 1)), int(st.get("availableReplicas") or 0)
            # as `kubectl rollout status` judges it (staging/src/k8s.io/kubectl/pkg/
            # polymorphichelpers/rollout_status.go at v1.35.0): the controller has seen this
            # spec, every replica runs the new template and no old one is left; a redeploy
            # that changes the pod template is not ready on the old pods' availability
            seen = int(st.get("observedGeneration") or 0) >= int(meta.get("generation") or 0)
            updated = int(st.get("updatedReplicas") or 0)
            rolled = seen and updated >= want and int(st.get("replicas") or 0) <= updated
            objects[f"Deployment/{name}"] = f"{have}/{want} available" + (
                "" if rolled or have < want else f", {updated if seen else 0}/{want} updated")
            ready = ready and rolled and have >= want
        elif kind == "Job":
            done, failed = _cond(item, "Complete"), _cond(item, "Failed")
            if failed and failed.get("status") == "True":
                objects[f"Job/{name}"] = "failed"
                problems.append(f"Job {name} failed: {failed.get('reason', '')}: "
                                f"{failed.get('message', '')}")
            elif done and done.get("status") == "True":
                objects[f"Job/{name}"] = "complete"
            else:
                objects[f"Job/{name}"] = (f"{st.get('succeeded', 0)}/"
                                          f"{spec.get('completions', 1)} succeeded")
                ready = False
        elif kind == "PersistentVolumeClaim":
            phase = st.get("phase", "Pending")
            objects[f"PersistentVolumeClaim/{name}"] = phase
            ready = ready and phase == "Bound"
        elif kind == "Service":
            services.append(item)
        elif kind == "Pod":
            phase = st.get("phase", "Pending")
            evs = events_of(item, by_pod)
            warnings = [e for e in evs if e.get("type") == "Warning"]
            row = PodRow(name, spec.get("nodeName", ""), phase, _gpus(item),
                         host_ip=st.get("hostIP", ""), labels=dict(meta.get("labels") or {}),
                         status=pod_status(item), event=_words(evs[-1] if evs else None))
            sched = _cond(item, "PodScheduled")
            ev = warnings[-1] if warnings else None
            problem = kube.pod_problem(item, evs) if phase not in ("Succeeded", "Failed") \
                else None
            if phase == "Pending" and sched and sched.get("status") == "False":
                said = [e for e in evs if e.get("reason") == "FailedScheduling"]
                msg = said[-1].get("message") if said else sched.get("message", "")
                row.detail = f"FailedScheduling: {msg}"
                row.status = "Pending"
                first = unschedulable_since.setdefault(name, now)
                if now - first >= pending_grace:
                    problems.append(f"pod {name} is Pending: the scheduler cannot place it: "
                                    f"{msg}")
            elif phase == "Failed":
                row.detail = (f"{st.get('reason', '')}: {st.get('message', '')}".strip(": ")
                              or container_detail(item))
                owners = {o.get("kind") for o in meta.get("ownerReferences") or []}
                if "Job" not in owners:
                    problems.append(f"pod {name} failed: {row.detail}")
            elif problem is not None:
                row.detail = f"{problem.reason}: {problem.message}".strip(": ")
                # one clock per kind of trouble: a pull that fails shows ErrImagePull and
                # ImagePullBackOff in turn
                key = f"{name}/mount" if problem.grace else f"{name}/containers"
                first = unschedulable_since.setdefault(key, now)
                if now - first >= max(pending_grace, problem.grace):
                    node = row.node or "(no node)"
                    # the kubelet's text can span lines (a mount's command and output):
                    # indented under the pod's line, then the fix
                    text = "\n    ".join(row.detail.strip().splitlines())
                    problems.append(f"pod {name} on node {node}: {text}\n"
                                    f"    fix: {problem.fix}")
            elif (detail := container_detail(item)):
                row.detail = detail
            elif phase == "Pending" and ev:
                row.detail = f"{ev.get('reason')}: {ev.get('message')}"
            pods.append(row)
    if not objects:
        ready = False
        problems.append(f"no objects labelled {selector} in namespace {namespace}")
    return WaitResult(ready and not problems, pods, problems, objects, services)


def progress_line(row: PodRow) -> str:
    """One line of a pod's progress: name, node, status and its latest event."""
    where = f" on {row.node}" if row.node else ""
    return f"{row.name}{where}: {row.status or row.phase}" + (
        f" ({row.event})" if row.event else "")


def progress_printer(reporter: Reporter) -> Callable[[str], None] | None:
    """What :func:`wait` calls with each progress line: printed indented and cut to the
    terminal's width (a pipe's is 80), or nothing with --quiet."""
    if reporter.quiet:
        return None

    def show(line: str) -> None:
        text = Text("  " + reporter.safe(line), style="dim")
        text.truncate(max(20, reporter.console.width), overflow="ellipsis")
        reporter.console.print(text, soft_wrap=True)
    return show


def wait(remote: Remote, namespace: str, selector: str, timeout: float,
         pending_grace: float, progress: Callable[[str], None] | None = None) -> WaitResult:
    """Poll until ready, a problem (unschedulable past the grace time, a pod that cannot
    start: kube.pod_problem; a failed Job) or timeout. ``progress`` gets one line per pod
    each time what the pod shows changes (its status or its latest event), not per look."""
    deadline = time.monotonic() + timeout
    since: dict[str, float] = {}
    shown: dict[str, str] = {}
    while True:
        result = snapshot(remote, namespace, selector, since, pending_grace)
        if progress is not None:
            for row in sorted(result.pods, key=lambda r: r.name):
                line = progress_line(row)
                if shown.get(row.name) != line:
                    shown[row.name] = line
                    progress(line)
        if result.ready or (result.problems and "no objects" not in result.problems[0]):
            return result
        if time.monotonic() >= deadline:
            waiting = [f"{k}: {v}" for k, v in result.objects.items()]
            result.problems.append(f"not ready after {timeout:.0f}s ({'; '.join(waiting)})")
            return result
        time.sleep(2.0)


#: a workload's pods (deploy, verify): kubectl get pods' columns, the GPUs each holds and
#: what it waits for
POD_COLUMNS = (Column("pod"), Column("node"), Column("phase"), Column("gpus", justify="right"),
               Column("detail"))


def pod_table(reporter: Reporter, title: str, result: WaitResult) -> None:
    rows: list[list[Cell]] = []
    for row in sorted(result.pods, key=lambda r: r.name):
        style = {"Running": "green", "Succeeded": "green", "Failed": "red"}.get(row.phase,
                                                                               "yellow")
        rows.append([row.name, row.node or "-", reporter.cell(row.phase, style),
                     str(row.gpus), row.detail])
    reporter.table(title, POD_COLUMNS, rows)
    for key, state in result.objects.items():
        reporter.print(f"  {key}: {state}")
