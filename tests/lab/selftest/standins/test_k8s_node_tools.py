"""The node's small tools and the stand-ins' packaging: crictl, cluster-info, a node going
NotReady, the kubelet's log trimming, the table writer, and every stand-in module in every
package that ships the stand-ins."""

from __future__ import annotations

import re
from pathlib import Path

from k8s.tables import tabwriter

from tests.lab.selftest.standins.k8s_helpers import CTR_OK, K8S, NEEDS_OPENSSL, Cluster, Node

pytestmark = NEEDS_OPENSSL


class TestOutputHelpers:
    def test_table_padding(self) -> None:
        out = tabwriter([["NAME", "STATUS", "ROLES", "AGE", "VERSION"],
                     ["gpu-01", "Ready", "<none>", "2m", "v1.36.2"],
                     ["cp-01", "Ready", "control-plane", "10m", "v1.36.2"]])
        assert out.splitlines()[1] == "gpu-01   Ready    <none>          2m    v1.36.2"


class TestNodeLifecycleAndTools:
    def test_node_not_ready_when_kubelet_stops_posting(self, cluster: Cluster) -> None:
        cluster.add_node("gpu-01")
        node = cluster.client.get("/api/v1/nodes/gpu-01")
        node["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T00:00:00Z"
        cluster.client.request("PUT", "/api/v1/nodes/gpu-01/status", node)
        cluster.wait(lambda: "NotReady" in cluster.kubectl("get", "node", "gpu-01").stdout)
        n = cluster.client.get("/api/v1/nodes/gpu-01")
        ready = n["status"]["conditions"][0]
        assert (ready["status"], ready["message"]) == ("Unknown",
                                                       "Kubelet stopped posting node status.")
        assert {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"} in \
            n["spec"]["taints"]

    def test_cluster_info(self, cluster: Cluster) -> None:
        r = cluster.kubectl("cluster-info")
        assert r.stdout.splitlines()[0] == \
            f"Kubernetes control plane is running at {cluster.server}"

    def test_crictl(self, node: Node) -> None:
        """`crictl ps -a`, the command gpuk8s names when a control plane does not come back,
        and `ps`/`exec` of the backup's etcd snapshot; crictl's other commands are not
        played."""
        r = node.run("crictl", "--runtime-endpoint", "unix:///run/containerd/containerd.sock",
                     "ps", "-a")
        # /run/containerd is not where the fake socket lives: crictl fails like the real one
        assert r.returncode == 1
        assert 'level=fatal msg="validate service connection: validate CRI v1 runtime API for ' \
            'endpoint \\"unix:///run/containerd/containerd.sock\\"' in r.stderr
        ep = "unix:///var/run/containerd/containerd.sock"
        r = node.run("crictl", "-r", ep, "ps", "-a")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split("\n")[0].split() == ["CONTAINER", "IMAGE", "CREATED", "STATE",
                                                   "NAME", "ATTEMPT", "POD", "ID", "POD",
                                                   "NAMESPACE"]
        # no etcd static pod runs here: the backup's lookup finds none, an exec is refused
        r = node.run("crictl", "-r", ep, "ps", "--state", "running", "--label",
                     "io.kubernetes.container.name=etcd", "-q")
        assert r.returncode == 0 and r.stdout == "", r.stderr
        r = node.run("crictl", "-r", ep, "exec", "0123abc", "etcdctl", "version")
        assert r.returncode == 1
        assert 'execing command in container 0123abc: rpc error: code = NotFound' in r.stderr
        for cmd in ("info", "version", "pods", "images"):
            r = node.run("crictl", "-r", ep, cmd)
            assert r.returncode == 1 and f"No help topic for '{cmd}'" in r.stderr
        node.set(ctr=CTR_OK.replace("io.containerd.grpc.v1                     cri"
                                    "                      -              ok\n", ""))
        r = node.run("crictl", "-r", ep, "ps", "-a")
        assert r.returncode == 1 and "unknown service runtime.v1.RuntimeService" in r.stderr


def test_every_standin_module_is_in_every_package_that_ships_the_standins() -> None:
    """A module left out of a package definition breaks every node at the first import."""
    modules = {p.name for p in K8S.glob("*.py")}
    pkgs = Path(__file__).resolve().parents[2] / "packages" / "k8s"
    for d in sorted(pkgs.glob("*.yaml")):
        text = d.read_text()
        if "standins/k8s/__init__.py" not in text:
            continue
        shipped = set(re.findall(r"standins/k8s/(\w+\.py)", text))
        assert shipped == modules, (d.name, modules ^ shipped)


def test_kubelet_trims_logs_as_kubectl_asks() -> None:
    from k8s.kubelet import _trim_log

    log = "one\ntwo\nthree\n"
    assert _trim_log(log, {"tailLines": ["2"]}) == "two\nthree\n"
    assert _trim_log(log, {"tailLines": ["0"]}) == ""
    assert _trim_log(log, {"tailLines": ["-1"]}) == log  # kubectl's default: everything
    assert _trim_log(log, {"limitBytes": ["5"]}) == "one\nt"
    assert _trim_log(log, {}) == log
