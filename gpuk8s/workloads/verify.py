"""invoke verify: per GPU node, nvidia-smi -L in the CUDA base image, then TensorFlow's GPU list,
each in a Job pinned to the node and given all its GPUs; both must show as many GPUs as the node
has on its PCI bus. It covers what the inventory turned on: time-sliced nodes must offer GPUs x
replicas, MIG nodes their MIG instances (the pod gets all of them and sees every GPU through
them), with gpu_allocation: dra the Jobs ask through ResourceClaims and the NVIDIA DRA driver must
publish every GPU in ResourceSlices, and with gpu_monitoring Prometheus must hold a
DCGM_FI_DEV_GPU_UTIL series for every GPU."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.text import Text

from gpuk8s.day2.gpuusage import query_command
from gpuk8s.facts.dra import parse_dra
from gpuk8s.facts.kube import parse_nodes
from gpuk8s.gpusharing import MIG_LABEL, REPLICAS_LABEL
from gpuk8s.report import Cell, Column, Reporter
from gpuk8s.sinks import shell
from gpuk8s.transport import ConnectSpec, Redactor, open_transport
from gpuk8s.workloads.cluster import Remote, _json, open_control_plane, wait
from gpuk8s.workloads.commands import _delete_script, _namespace_doc
from gpuk8s.workloads.rendering import LABEL, render
from gpuk8s.workloads.values import WorkloadError, load_values

_TF_GPU = re.compile(r"PhysicalDevice\(name='/physical_device:GPU:(\d+)'")
_SMI_GPU = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9a-f-]+)\)", re.M)


@dataclass
class NodeCheck:
    node: str
    expected: int
    allocatable: int | None
    smi: list[str] = field(default_factory=list)
    tf: int | None = None
    problem: str = ""
    with_tf: bool = True   # verify's `tensorflow` value: the TensorFlow stage runs
    #: time-slicing slots per GPU (the node's nvidia.com/gpu.replicas label, set by gpuk8s)
    replicas: int = 1
    #: the node's MIG layout (its nvidia.com/mig.config label) and the MIG instances it offers
    mig: str = ""
    mig_offered: int = 0
    #: gpu_allocation dra: the GPUs its ResourceSlices list (None: not checked)
    slices: int | None = None
    #: gpu_monitoring: the GPUs Prometheus has DCGM samples of (None: not checked)
    dcgm: int | None = None
    #: pods that hold the node's GPUs ("namespace/pod" -> how many), left to them
    held: dict[str, int] = field(default_factory=dict)
    #: the GPUs the verify pods asked for: those free (None: all of them, nothing held)
    checked: int | None = None

    @property
    def skipped(self) -> bool:
        """Every GPU is held by other pods: nothing to run a verify pod on."""
        return self.checked == 0 and not self.problem

    @property
    def ok(self) -> bool:
        if self.skipped:
            return True
        want = self.expected if self.checked is None else self.checked
        if self.mig and self.checked is not None:
            # a MIG node's held instances: the pod sees the GPUs of those left, at least one
            smi_ok = len(self.smi) >= 1
        else:
            smi_ok = len(self.smi) == want
        counts = smi_ok and (self.tf == want if self.with_tf and not self.mig else True)
        if self.slices is not None and not self.mig:
            offered = self.slices == self.expected
        elif self.mig:
            offered = self.mig_offered > 0
        else:
            offered = self.allocatable == self.expected * self.replicas
        monitored = self.dcgm is None or self.dcgm == self.expected
        return not self.problem and counts and offered and monitored

    @property
    def offered_text(self) -> str:
        if self.slices is not None:
            return f"{self.slices} in ResourceSlices (DRA)"
        if self.mig:
            return f"{self.mig_offered} MIG ({self.mig})"
        if self.allocatable is None:
            return "-"
        return str(self.allocatable) + (f" ({self.expected} x {self.replicas} time-sliced)"
                                        if self.replicas > 1 else "")


def gpu_nodes(nodes_json: Mapping[str, Any]) -> list[dict[str, Any]]:
    """GPU nodes (labelled by gpuk8s from the PCI bus, or advertising nvidia.com/gpu), with
    the limits a verify pod takes to get all of the node's GPUs."""
    out = []
    for name, node in sorted(parse_nodes(dict(nodes_json)).items()):
        count = node.labels.get("nvidia.com/gpu.count")
        present = node.labels.get("nvidia.com/gpu.present") == "true"
        if not present and not node.gpu_allocatable:
            continue
        replicas = node.labels.get(REPLICAS_LABEL, "1")
        slots = int(replicas) if replicas.isdigit() and int(replicas) > 0 else 1
        expected = int(count) if count and count.isdigit() else \
            (node.gpu_allocatable or 0) // slots
        mig = node.labels.get(MIG_LABEL, "")
        mig_resources = {k: v for k, v in node.nvidia.items()
                         if k.startswith("nvidia.com/mig-") and v > 0}
        limits: dict[str, int] = dict(mig_resources) if mig else {"nvidia.com/gpu": expected}
        if mig and node.gpu_allocatable:
            limits["nvidia.com/gpu"] = node.gpu_allocatable   # GPUs left whole
        out.append({"name": name, "gpus": expected, "allocatable": node.gpu_allocatable,
                    "replicas": slots, "mig": mig, "limits": limits,
                    "mig_offered": sum(mig_resources.values())})
    return out


def _pod_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """The nvidia.com/* devices a pod holds, as the scheduler counts them: the sum over its
    containers, or its largest init container if that is more (an extended resource's request
    is its limit when only the limit is given)."""
    def need(c: Mapping[str, Any]) -> dict[str, int]:
        res = c.get("resources") or {}
        both = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {k: int(str(v)) for k, v in both.items()
                if k.startswith("nvidia.com/") and str(v).isdigit() and int(str(v)) > 0}
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    for c in spec.get("containers") or []:
        for k, v in need(c).items():
            total[k] = total.get(k, 0) + v
    for c in spec.get("initContainers") or []:
        for k, v in need(c).items():
            total[k] = max(total.get(k, 0), v)
    return total


def gpu_holders(pods_json: Mapping[str, Any]) -> dict[str, dict[str, dict[str, int]]]:
    """node -> "namespace/pod" -> {resource: count}: the pods bound to a node that hold its
    GPUs (or MIG devices, or time-sliced shares) and have not ended; verify's own pods are
    left out (verify removes them first)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for pod in pods_json.get("items") or []:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") or \
                (meta.get("labels") or {}).get(LABEL) == "verify" or not spec.get("nodeName"):
            continue
        held = _pod_requests(pod)
        if held:
            out.setdefault(spec["nodeName"], {})[
                f"{meta.get('namespace', '')}/{meta.get('name', '')}"] = held
    return out


def leave_held(node: dict[str, Any], allocatable: Mapping[str, int],
               holders: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """Ask the node's verify pods only for what is free (allocatable minus what ``holders``
    hold): ``node["limits"]`` shrunk in place (resources with nothing free dropped). Returns
    "namespace/pod" -> the devices it holds."""
    used: dict[str, int] = {}
    for held in holders.values():
        for k, v in held.items():
            used[k] = used.get(k, 0) + v
    limits = {}
    for k, want in node["limits"].items():
        free = max(0, int(allocatable.get(k, want)) - used.get(k, 0))
        if min(want, free) > 0:
            limits[k] = min(want, free)
    node["limits"] = limits
    return {pod: sum(held.values()) for pod, held in sorted(holders.items())}


def scheduler_words(message: str) -> str:
    """The scheduler's FailedScheduling message without its preemption half (which repeats
    the node counts): one sentence of why no node fits."""
    return message.split(" preemption:")[0].strip().rstrip(".")


def verify(inventory: str | Path, *, reporter: Reporter | None = None,
           values_files: Sequence[str] = (), sets: Sequence[str] = (),
           pending_grace: float = 20,
           opener: Callable[[ConnectSpec, Redactor], Any] = open_transport
           ) -> dict[str, Any]:
    """Per GPU node: nvidia-smi -L in the CUDA base image, then TensorFlow's GPU list; both must
    show as many GPUs as the node has on its PCI bus. One table; WorkloadError on a mismatch."""
    session = open_control_plane(inventory, "verify", reporter, opener=opener)
    cluster_vars = session.host(session.first_cp).vars
    dra = cluster_vars.get("gpu_allocation") == "dra"
    values = load_values("verify", values_files,
                         [*(["gpuAllocation=dra"] if dra else []), *sets])
    rep, remote = session.reporter, Remote(session)
    ns = values["namespace"]
    started = time.monotonic()
    try:
        rep.phase(f"verify GPU nodes (namespace {ns}, through {session.first_cp})")
        rc, out = remote.probe({"nodes": "$k get nodes -o json"})["nodes"]
        if rc != 0:
            raise WorkloadError(f"cannot list nodes: {out.strip()[-300:]}")
        nodes = gpu_nodes(_json(out, "nodes"))
        if not nodes:
            raise WorkloadError("no GPU nodes in the cluster (no node is labelled "
                                "nvidia.com/gpu.present=true or offers nvidia.com/gpu)")
        with_tf = bool(values["tensorflow"])
        checks = {n["name"]: NodeCheck(n["name"], n["gpus"], n["allocatable"],
                                       replicas=n.get("replicas", 1), with_tf=with_tf,
                                       mig=n["mig"], mig_offered=n["mig_offered"])
                  for n in nodes}
        _leave_held_gpus(remote, nodes, checks, _json(out, "nodes"))
        if dra:
            _slices(remote, checks)
        if cluster_vars.get("gpu_monitoring"):
            _dcgm(remote, checks)
        _run_stages(remote, values, nodes, checks, pending_grace)
        for n in nodes:
            if n["gpus"] == 0:
                checks[n["name"]].problem = "labelled as a GPU node but its GPU count is 0"
        _print(rep, checks.values(), with_tf)
        summary = {"nodes": {c.node: {"expected": c.expected, "allocatable": c.allocatable,
                                      "nvidia_smi": len(c.smi), "models": c.smi,
                                      "tensorflow": c.tf, "mig": c.mig,
                                      "mig_offered": c.mig_offered, "slices": c.slices,
                                      "dcgm": c.dcgm, "ok": c.ok, "held": c.held,
                                      "checked": c.checked, "skipped": c.skipped,
                                      "problem": c.problem} for c in checks.values()},
                   "run_dir": str(session.runlog.path)}
        session.runlog.write_report(verify=summary["nodes"],
                                    wall_time=round(time.monotonic() - started, 3))
        bad = [c.node for c in checks.values() if not c.ok]
        if bad:
            raise WorkloadError(f"verify failed on {', '.join(bad)}")
        skipped = [c.node for c in checks.values() if c.skipped]
        rep.print(f"verify: {len(checks) - len(skipped)} GPU node(s) ok"
                  + (f", not checked (every GPU held): {', '.join(skipped)}" if skipped else "")
                  + f" ({time.monotonic() - started:.1f}s)", style="green")
        return summary
    finally:
        for t in session.transports.values():
            t.close()


def _leave_held_gpus(remote: Remote, nodes: list[dict[str, Any]],
                     checks: Mapping[str, NodeCheck], nodes_json: Mapping[str, Any]) -> None:
    """GPUs that running pods hold are theirs: each node's verify pods ask for the rest (a Job
    asking for every GPU of a node where a Jupyter server holds one stays Pending)."""
    rc, out = remote.probe({"pods": "$k get pods -A --field-selector "
                                    "status.phase!=Succeeded,status.phase!=Failed -o json"}
                           )["pods"]
    if rc != 0:
        raise WorkloadError(f"cannot list pods: {out.strip()[-300:]}")
    holders = gpu_holders(_json(out, "pods"))
    allocatable = {str((n.get("metadata") or {}).get("name", "")):
                   {k: int(v) for k, v in ((n.get("status") or {}).get("allocatable") or {})
                    .items() if k.startswith("nvidia.com/") and str(v).isdigit()}
                   for n in nodes_json.get("items") or []}
    for n in nodes:
        held = holders.get(n["name"])
        if not held:
            continue
        check = checks[n["name"]]
        check.held = leave_held(n, allocatable.get(n["name"], {}), held)
        check.checked = n["limits"].get("nvidia.com/gpu", 0) if not n["mig"] else \
            sum(n["limits"].values())


def _slices(remote: Remote, checks: Mapping[str, NodeCheck]) -> None:
    """gpu_allocation dra: the whole GPUs NVIDIA's DRA driver published per node."""
    rc, out = remote.probe({"slices": "$k get resourceslices -o json"})["slices"]
    if rc != 0:
        raise WorkloadError(f"cannot list ResourceSlices: {out.strip()[-300:]}")
    devices = parse_dra({}, _json(out, "resourceslices")).devices
    for name, check in checks.items():
        found = devices.get(name, {})
        check.slices = found.get("gpu", 0)
        if check.mig:
            check.mig_offered = found.get("mig", 0)
            check.problem = check.problem or (
                f"MIG ({check.mig}) with gpu_allocation dra: the driver publishes "
                f"{check.mig_offered} MIG device(s); verify does not claim MIG devices through "
                "DRA yet")


def _dcgm(remote: Remote, checks: Mapping[str, NodeCheck]) -> None:
    """gpu_monitoring: the GPUs of each node Prometheus has DCGM_FI_DEV_GPU_UTIL samples of."""
    rc, out = remote.probe({"dcgm": "$k " + query_command(
        "count by (node) (DCGM_FI_DEV_GPU_UTIL)")})["dcgm"]
    seen: dict[str, int] = {}
    if rc == 0:
        try:
            for item in json.loads(out)["data"]["result"]:
                seen[str(item["metric"].get("node", ""))] = int(float(item["value"][1]))
        except (ValueError, KeyError, TypeError, IndexError):
            rc = 1
    for name, check in checks.items():
        check.dcgm = seen.get(name, 0)
        if rc != 0:
            check.problem = check.problem or "Prometheus did not answer (gpu_monitoring)"


def _run_stages(remote: Remote, values: Mapping[str, Any], nodes: list[dict[str, Any]],
                checks: Mapping[str, NodeCheck], pending_grace: float) -> None:
    ns = values["namespace"]
    selector = f"{LABEL}=verify"
    res = remote.run(_delete_script(ns, selector, "jobs", 120), timeout=180)
    if not res.ok:
        raise WorkloadError("cannot remove the previous verify Jobs: " + res.stdout[-300:])
    for stage in ("smi", "tf") if values["tensorflow"] else ("smi",):
        # CUDA sees one MIG device per process: TensorFlow on a MIG node would count one GPU
        todo = [n for n in nodes if n["gpus"] > 0 and not checks[n["name"]].problem
                and not checks[n["name"]].skipped and not (stage == "tf" and n["mig"])]
        if not todo:
            continue
        docs = render("verify", values, gpu_nodes=todo, stage=stage)
        remote.apply([_namespace_doc(ns), *docs])
        result = wait(remote, ns, f"{selector},gpuk8s.io/verify-stage={stage}",
                      float(values["timeout"]), pending_grace)
        pods = {p.labels.get("gpuk8s.io/verify-node", ""): p for p in result.pods}
        logs = remote.probe({p.name: f"$k logs {shell(p.name)} -n {shell(ns)}"
                             for p in result.pods if p.phase in ("Succeeded", "Failed")})
        for n in todo:
            check, pod = checks[n["name"]], pods.get(n["name"])
            what = "nvidia-smi" if stage == "smi" else "TensorFlow"
            if pod is None:
                check.problem = f"{what}: no pod ({'; '.join(result.problems)})"
                continue
            if pod.node and pod.node != n["name"]:
                check.problem = f"{what} pod ran on {pod.node}"
            text = logs.get(pod.name, (1, ""))[1]
            if pod.phase != "Succeeded" and pod.detail.startswith("FailedScheduling: "):
                check.problem = (f"{what}: the scheduler cannot place its pod: "
                                 + scheduler_words(pod.detail.split(": ", 1)[1]))
            elif pod.phase != "Succeeded":
                check.problem = f"{what}: pod {pod.phase}: " + (
                    pod.detail or text.strip().splitlines()[-1:][0] if text.strip() or
                    pod.detail else pod.phase)
            elif stage == "smi":
                check.smi = [f"{m.group(2)}" for m in _SMI_GPU.finditer(text)]
            else:
                check.tf = len(set(_TF_GPU.findall(text)))


def _print(rep: Reporter, checks: Any, with_tf: bool) -> None:
    """The table, a line per node (a failed node's result is FAIL), then each failure's
    reason under it: a sentence needs a line of its own, not a table cell."""
    checks = list(checks)
    cols = [Column("node"), Column("PCI GPUs", justify="right"), Column("offered"),
            Column("nvidia-smi", justify="right"), Column("TensorFlow")]
    dcgm = any(c.dcgm is not None for c in checks)
    cols += [Column("DCGM", justify="right")] if dcgm else []
    rows: list[list[Cell]] = []
    for c in checks:  # nvidia-smi's count: the model names would take the line past 80
        tf = "skipped" if not with_tf else "skipped (MIG)" if c.mig else \
            "-" if c.tf is None else str(c.tf)
        smi = "-" if c.skipped else f"{len(c.smi)}" + (
            f" (free: {c.checked} of {c.expected})" if c.checked is not None else "")
        row: list[Cell] = [c.node, str(c.expected), c.offered_text, smi,
                           "-" if c.skipped else tf]
        row += [str(c.dcgm)] if dcgm else []
        rows.append([*row, Text("not checked", style="yellow") if c.skipped
                     else Text("ok", style="green") if c.ok else Text("FAIL", style="red")])
    rep.table("verify: GPUs per node", [*cols, Column("result")], rows)
    for c in checks:
        if not c.ok and not c.skipped:
            rep.console.print(Text.assemble("  ", rep.cell(c.node), ": ", ("FAIL", "red"), " ",
                                            rep.cell(c.problem or "counts differ")),
                              soft_wrap=True)
        if c.held:
            # a sentence per node, wrapped at the terminal's width (not a table cell)
            rep.console.print(Text.assemble("  ", rep.cell(c.node), ": ",
                                            rep.cell(held_words(c))), soft_wrap=False)


def held_words(c: NodeCheck) -> str:
    """Which pods hold a node's GPUs, for a person: "1 GPU held by ml/jupyter-abc"; every
    GPU held: "all 2 GPUs held by ml/a, ml/b: verify runs when one is free"."""
    count = sum(c.held.values())
    pods = ", ".join(c.held)
    unit = "GPU" if count == 1 else "GPUs"
    if c.mig:
        unit = "MIG device" if count == 1 else "MIG devices"
    if c.skipped:
        return (f"all {count} {unit} held by {pods}; not checked: run verify again when one "
                "is free")
    return f"{count} {unit} held by {pods}; verified the {c.checked} free"
