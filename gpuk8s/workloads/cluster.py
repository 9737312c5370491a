"""Talking to the cluster through the first control plane's kubectl: run, probe, apply, and
wait for a workload's objects and pods."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuk8s.inventory import load_inventory
from gpuk8s.ops import Op, kube
from gpuk8s.ops.kube import apply_script
from gpuk8s.report import Cell, Column, Reporter
from gpuk8s.session import Session, open_session
from gpuk8s.sinks import shell
from gpuk8s.transport import CommandResult, ConnectSpec, Redactor, open_transport
from gpuk8s.workloads.rendering import dump
from gpuk8s.workloads.values import WorkloadError

#: the one kubectl (gpuk8s.ops.kube), with a bound on each request: workload commands wait
#: in their own loops, not in a hung request
KUBECTL = f"{kube.KUBECTL} --request-timeout=20s"


#: namespaced kinds a workload may create (undeploy deletes these by label)
NS_KINDS = "deployments,jobs,services,configmaps,secrets,persistentvolumeclaims"


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
                       opener: Callable[[ConnectSpec, Redactor], Any] = open_transport
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


#: container waiting reasons that do not go away by waiting: past the grace time they are
#: the workload's problem, named with the node and the runtime's message
STUCK = {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
         "CreateContainerConfigError", "CreateContainerError", "CrashLoopBackOff",
         "RunContainerError"}


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


def snapshot(remote: Remote, namespace: str, selector: str,
             unschedulable_since: dict[str, float], pending_grace: float) -> WaitResult:
    """One look at the workload's objects, pods and Warning events."""
    ns = shell(namespace)
    sel = shell(selector)
    res = remote.probe({
        "objects": f"$k get deployments,jobs,persistentvolumeclaims,services,pods -n {ns} "
                   f"-l {sel} -o json",
        "events": f"$k get events -n {ns} --field-selector type=Warning -o json"})
    rc, out = res["objects"]
    if rc != 0:
        raise WorkloadError(f"{remote.host}: kubectl get failed: {out.strip()[-300:]}")
    items = _json(out, "objects").get("items", [])
    events = _json(res["events"][1], "events").get("items", []) if res["events"][0] == 0 else []
    last_event: dict[str, dict[str, Any]] = {}
    for ev in sorted(events, key=lambda e: e.get("lastTimestamp") or ""):
        inv = ev.get("involvedObject") or {}
        if inv.get("kind") == "Pod":
            last_event[inv.get("name", "")] = ev
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
            objects[f"Deployment/{name}"] = f"{have}/{want} available"
            ready = ready and have >= want
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
            row = PodRow(name, spec.get("nodeName", ""), phase, _gpus(item),
                         host_ip=st.get("hostIP", ""), labels=dict(meta.get("labels") or {}))
            sched = _cond(item, "PodScheduled")
            ev = last_event.get(name)
            if phase == "Pending" and sched and sched.get("status") == "False":
                msg = (ev.get("message") if ev and ev.get("reason") == "FailedScheduling"
                       else sched.get("message", ""))
                row.detail = f"FailedScheduling: {msg}"
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
            elif (detail := container_detail(item)):
                row.detail = detail
                if any(k == "waiting" and s.get("reason") in STUCK
                       for _, k, s in container_states(item)):
                    first = unschedulable_since.setdefault(f"{name}/containers", now)
                    if now - first >= pending_grace:
                        problems.append(f"pod {name} on node {row.node}: {detail}")
            elif phase == "Pending" and ev:
                row.detail = f"{ev.get('reason')}: {ev.get('message')}"
            pods.append(row)
    if not objects:
        ready = False
        problems.append(f"no objects labelled {selector} in namespace {namespace}")
    return WaitResult(ready and not problems, pods, problems, objects, services)


def wait(remote: Remote, namespace: str, selector: str, timeout: float,
         pending_grace: float) -> WaitResult:
    """Poll until ready, a problem (unschedulable past the grace time, failed Job) or timeout."""
    deadline = time.monotonic() + timeout
    since: dict[str, float] = {}
    while True:
        result = snapshot(remote, namespace, selector, since, pending_grace)
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
