"""Cordon, drain and uncordon a Kubernetes node, through the session's first control plane:
the day-2 upgrades and reprovisioning use them, and so does a bootstrap phase that must empty
a node before it changes it (MIG layouts)."""

from __future__ import annotations

import re

from gpuk8s.errors import CommandFailed, Gpuk8sError
from gpuk8s.ops.kube import KUBECTL
from gpuk8s.session import Session, run_step
from gpuk8s.sinks import node_arg, shell


def drain(session: Session, node: str, timeout: int, knob: str = "--drain-timeout") -> None:
    """Cordon and drain ``node``; on failure say which pods block (PodDisruptionBudgets...)
    and which setting (``knob``) gives the drain more time."""
    cp = session.first_cp
    session.reporter.print(f"  [{cp}] drain {node} (timeout {timeout}s)")
    script = (f"{KUBECTL} drain {node_arg(node)} --ignore-daemonsets --delete-emptydir-data "
              f"--timeout={timeout}s")
    try:
        run_step(session, cp, script, f"drain {node}", timeout=timeout + 60)
    except CommandFailed as exc:
        blocking = sorted(set(re.findall(r'evicting pods?/"?([\w.-]+)"?(?: -n "?([\w.-]+))?',
                                         exc.stderr_tail)))
        names = ", ".join(f"{ns or 'default'}/{pod}" for pod, ns in blocking)
        raise Gpuk8sError(
            f"{node}: drain did not finish in {timeout}s"
            + (f"; blocked by {names}" if names else "") + f"\n{exc.stderr_tail}\n"
            f"  fix: relax the PodDisruptionBudget or move the pods, raise {knob}, "
            "or uncordon the node to give up") from None


def wait_ready(session: Session, node: str, gpus: int, timeout: int,
               knob: str = "--drain-timeout") -> None:
    """After a node's kubelet restarted: the API server answers (it may be restarting too, on
    a control plane), the node is Ready, and its ``gpus`` GPUs are allocatable again; each
    within ``timeout`` seconds (the setting ``knob`` gives more)."""
    ref = node_arg(node, "node/")
    waits = [f"end=$(( $(date +%s) + {timeout} )); until {KUBECTL} get --raw /readyz "
             ">/dev/null 2>&1; do [ $(date +%s) -lt $end ] || { echo 'the API server did not "
             f"come back within {timeout}s'; exit 1; }}; sleep 1; done",
             f"{KUBECTL} wait --for=condition=Ready {ref} --timeout={timeout}s"]
    if gpus:
        waits.append(f"{KUBECTL} wait --for=jsonpath='{{.status.allocatable.nvidia\\.com/gpu}}'"
                     f"={gpus} {ref} --timeout={timeout}s")
    try:
        run_step(session, session.first_cp, " && ".join(waits), f"verify {node}",
                 timeout=3 * timeout + 60)
    except CommandFailed as exc:
        raise Gpuk8sError(f"{node} did not come back Ready" + (f" with {gpus} GPU(s)" if gpus
                                                               else "")
                          + f" within {timeout}s: {exc.stderr_tail.strip()}\n  fix: see "
                          f"`kubectl describe node {node}` and the kubelet's journal; raise "
                          f"{knob} if it is only slow; the node stays cordoned") from None
    session.reporter.print(f"  [{session.first_cp}] {node} Ready"
                           + (f", {gpus} GPU(s) allocatable" if gpus else ""))


def uncordon(session: Session, node: str) -> None:
    """Make ``node`` schedulable again."""
    session.reporter.print(f"  [{session.first_cp}] uncordon {node}")
    run_step(session, session.first_cp, f"{KUBECTL} uncordon {node_arg(node)}",
             f"uncordon {node}")


#: the node label every GPU DaemonSet selects (device plugin, DRA kubelet plugin, DCGM
#: exporter), and the value that takes them off a node while its GPUs are repartitioned
GPU_PRESENT = "nvidia.com/gpu.present"
PAUSED = "paused-for-mig-change"
#: the label those DaemonSets' pods carry
GPU_CLIENT = "gpuk8s.io/gpu-client=true"


def pause_gpu_clients(session: Session, node: str, timeout: int,
                      knob: str = "mig_drain_timeout") -> None:
    """Take the GPU DaemonSets' pods off ``node`` and wait until none is left: the driver
    refuses a MIG mode change while a client (NVML in the device plugin, DCGM) has the GPU
    open. As NVIDIA's MIG manager does, the node's nvidia.com/gpu.present label is set to
    paused-for-mig-change; resume_gpu_clients sets it back."""
    cp = session.first_cp
    session.reporter.print(f"  [{cp}] pause the GPU DaemonSets on {node}")
    pods = (f"{KUBECTL} get pods -A -l {GPU_CLIENT} "
            f"--field-selector {shell(f'spec.nodeName={node}')} -o name")
    script = (f"{KUBECTL} label node {node_arg(node)} {GPU_PRESENT}={PAUSED} --overwrite "
              f">/dev/null\nend=$(( $(date +%s) + {int(timeout)} ))\n"
              f"while :; do left=$({pods}) || exit 1; [ -z \"$left\" ] && break\n"
              f"  if [ \"$(date +%s)\" -ge \"$end\" ]; then echo "
              f"{shell(f'still on {node} after {int(timeout)}s:')} $left >&2; exit 1; fi\n"
              "  sleep 2; done")
    try:
        run_step(session, cp, script, f"pause the GPU DaemonSets on {node}",
                 timeout=timeout + 60)
    except CommandFailed as exc:
        raise Gpuk8sError(
            f"{node}: pausing the GPU DaemonSets failed (their pods must leave within "
            f"{timeout}s)\n{exc.stderr_tail}\n"
            f"  fix: see why with kubectl describe pod, raise {knob}, or run again (the node "
            f"gets {GPU_PRESENT}=true back at the next run)") from None


def resume_gpu_clients(session: Session, node: str) -> None:
    """Bring the GPU DaemonSets back to ``node`` (after pause_gpu_clients)."""
    session.reporter.print(f"  [{session.first_cp}] resume the GPU DaemonSets on {node}")
    script = f"{KUBECTL} label node {node_arg(node)} {GPU_PRESENT}=true --overwrite"
    run_step(session, session.first_cp, script, f"resume the GPU DaemonSets on {node}")
