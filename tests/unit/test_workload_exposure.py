"""Jupyter and TensorBoard are not on the network by default (security review 2, L5): a
ClusterIP Service reached with the `kubectl port-forward` line gpuk8s prints; NodePort only
when asked for; both run as nobody without privilege escalation."""

from __future__ import annotations

from typing import Any

import pytest

from gpuk8s import workloads as w
from gpuk8s.workloads import commands


def _doc(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind)


@pytest.mark.parametrize(("name", "port"), [("jupyter", 8888), ("tensorboard", 6006)])
def test_default_is_cluster_ip_and_node_port_an_opt_in(name: str, port: int) -> None:
    svc = _doc(w.render(name, w.load_values(name)), "Service")["spec"]
    assert svc["type"] == "ClusterIP"
    assert svc["ports"] == [{"name": "http", "port": port, "targetPort": "http"}]
    opened = _doc(w.render(name, w.load_values(name, sets=["service.type=NodePort"])),
                  "Service")["spec"]
    assert opened["type"] == "NodePort" and opened["ports"][0]["nodePort"] > 30000


@pytest.mark.parametrize("name", ["jupyter", "tensorboard"])
def test_runs_as_nobody_without_privilege_escalation(name: str) -> None:
    pod = _doc(w.render(name, w.load_values(name)), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsUser": 65534, "runAsGroup": 65534,
                                      "runAsNonRoot": True}
    (c,) = pod["containers"]
    assert c["securityContext"] == {"allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}}
    assert "--allow-root" not in " ".join(c["command"])


class _Console:
    is_terminal = False


class _Reporter:
    console = _Console()

    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: str, **kwargs: Any) -> None:
        self.lines.append(str(text))


class _Session:
    def __init__(self) -> None:
        self.reporter = _Reporter()


def _printed(svc_type: str) -> str:
    spec: dict[str, Any] = {"type": svc_type, "clusterIP": "10.96.12.34",
                            "ports": [{"port": 8888, **({"nodePort": 30888}
                                                        if svc_type == "NodePort" else {})}]}
    svc = {"metadata": {"name": "jupyter", "namespace": "ml"}, "spec": spec}

    class Pod:
        host_ip = "10.0.0.12"

    class Result:
        pods = [Pod()]

    session = _Session()
    commands._print_service(session, svc, Result(), "t0ken", False)  # type: ignore[arg-type]
    return "\n".join(session.reporter.lines)


def test_cluster_ip_prints_a_port_forward_line_and_a_local_url() -> None:
    text = _printed("ClusterIP")
    assert "kubectl -n ml port-forward service/jupyter 8888:8888" in text
    assert "http://127.0.0.1:8888/?token=<redacted>" in text
    assert "10.0.0.12" not in text and "t0ken" not in text


def test_node_port_still_prints_the_node_url() -> None:
    text = _printed("NodePort")
    assert "http://10.0.0.12:30888/?token=<redacted>" in text
    assert "port-forward" not in text
