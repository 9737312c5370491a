"""Cordon, drain and uncordon a Kubernetes node, through the session's first control plane:
the day-2 upgrades and reprovisioning use them, and so does a bootstrap phase that must empty
a node before it changes it (MIG layouts)."""

from __future__ import annotations

import re

from gpuk8s.errors import CommandFailed, Gpuk8sError
from gpuk8s.ops import Op
from gpuk8s.ops.kube import KUBECTL
from gpuk8s.session import Session
from gpuk8s.sinks import node_arg


def drain(session: Session, node: str, timeout: int, knob: str = "--drain-timeout") -> None:
    """Cordon and drain ``node``; on failure say which pods block (PodDisruptionBudgets...)
    and which setting (``knob``) gives the drain more time."""
    cp = session.first_cp
    session.reporter.print(f"  [{cp}] drain {node} (timeout {timeout}s)")
    script = (f"{KUBECTL} drain {node_arg(node)} --ignore-daemonsets --delete-emptydir-data "
              f"--timeout={timeout}s")
    try:
        session.run(cp, Op(f"drain {node}", (script,), f"+ drain {node}", timeout=timeout + 60))
    except CommandFailed as exc:
        blocking = sorted(set(re.findall(r'evicting pods?/"?([\w.-]+)"?(?: -n "?([\w.-]+))?',
                                         exc.stderr_tail)))
        names = ", ".join(f"{ns or 'default'}/{pod}" for pod, ns in blocking)
        raise Gpuk8sError(
            f"{node}: drain did not finish in {timeout}s"
            + (f"; blocked by {names}" if names else "") + f"\n{exc.stderr_tail}\n"
            f"  fix: relax the PodDisruptionBudget or move the pods, raise {knob}, "
            "or uncordon the node to give up") from None


def uncordon(session: Session, node: str) -> None:
    """Make ``node`` schedulable again."""
    session.reporter.print(f"  [{session.first_cp}] uncordon {node}")
    session.run(session.first_cp, Op(f"uncordon {node}", (f"{KUBECTL} uncordon {node_arg(node)}",),
                                      f"+ uncordon {node}"))
