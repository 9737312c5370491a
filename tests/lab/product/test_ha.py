"""A highly available control plane on the lab (issue 17): three control planes with stacked
etcd behind each node's own HAProxy, bootstrapped from a plain inventory.

The default lab has four nodes; this module makes three of them control planes (cp-01, cpu-01
and gpu-02, whose GPU is not offered: a tainted control plane takes no pods) and gpu-01 the
worker. etcd is the REAL etcd 3.5 (one member per control plane, started by the kubelet
stand-in from the etcd.yaml kubeadm writes) and etcdctl the real client; HAProxy is Debian's.
Nodes are powered off as a box losing power would be (no clean leave), then on again.

Quorum lost for good (two members' data removed) is brought back with `invoke restore`, and
`renew-certs` rolls the three control planes with the API answering through HAProxy.

The tests run in order on one bootstrap (at Kubernetes 1.35, upgraded to the next minor, 1.36.2,
last) from the "fresh" snapshot; every node is powered on again before the module ends (the
next module restores its own snapshot).
"""

from __future__ import annotations

import io
import itertools
import json
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s import day2
from gpuk8s.report import Reporter
from tests.lab import repos
from tests.lab.lab import Lab
from tests.lab.paths import node_ip
from tests.lab.product.runs import bootstrap_inline, restore_fresh, ssh_ok

pytestmark = pytest.mark.lab

CONTROL_PLANES = ("cp-01", "cpu-01", "gpu-02")
WORKER = "gpu-01"
ADDRESS = {n: node_ip(i) for i, n in enumerate(("cp-01", "gpu-01", "gpu-02", "cpu-01"), 1)}
OLD, NEW = "1.35", "1.36.2"
ADMIN = "kubectl --kubeconfig /etc/kubernetes/admin.conf --request-timeout=10s"
ETCDCTL = ("/usr/lib/gpuk8s-lab/etcd/etcdctl --endpoints https://127.0.0.1:2379 "
           "--cacert /etc/kubernetes/pki/etcd/ca.crt "
           "--cert /etc/kubernetes/pki/etcd/healthcheck-client.crt "
           "--key /etc/kubernetes/pki/etcd/healthcheck-client.key --command-timeout=5s")


@pytest.fixture(scope="module")
def inventory(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lab's inventory with three hosts under control_plane and nothing else changed."""
    inv = yaml.safe_load(lab.inventory_path.read_text())
    groups = inv["all"]["children"]
    hosts = {**groups["control_plane"]["hosts"], **groups["workers"]["hosts"]}
    groups["control_plane"]["hosts"] = {h: hosts[h] for h in CONTROL_PLANES}
    groups["workers"]["hosts"] = {WORKER: hosts[WORKER]}
    inv["all"]["vars"]["kubernetes_version"] = OLD  # upgraded to the next minor at the end
    path = tmp_path_factory.mktemp("ha") / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def cluster(lab: Lab, inventory: Path) -> Iterator[Lab]:
    restore_fresh(lab)
    t0 = time.monotonic()
    result, text = bootstrap_inline(inventory)
    print(f"\nHA bootstrap (3 control planes + 1 worker): {time.monotonic() - t0:.1f}s")
    assert all(t["failed"] == 0 for t in result["totals"].values()), text
    assert "control-plane-join: control planes: kubeadm join --control-plane" in text
    yield lab
    lab.power_on(*ADDRESS)  # whatever a failed test left off


def members(lab: Lab, node: str) -> list[dict[str, Any]]:
    out = ssh_ok(lab, node, f"{ETCDCTL} member list -w json")
    listed: list[dict[str, Any]] = json.loads(out)["members"]
    return listed


def healthy_endpoints(lab: Lab, node: str) -> dict[str, bool]:
    _, out, _ = lab.ssh(node, f"{ETCDCTL} endpoint health --cluster -w json", timeout=60)
    try:
        return {e["endpoint"]: bool(e["health"]) for e in json.loads(out)}
    except ValueError:
        return {}


def wait_for(what: str, cond: Any, timeout: float = 90.0) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"{what}: not within {timeout:.0f}s"
        time.sleep(1)
    return time.monotonic() - t0


def test_three_started_members_one_per_control_plane(cluster: Lab) -> None:
    listed = members(cluster, "cp-01")
    assert sorted(m["name"] for m in listed) == sorted(CONTROL_PLANES)
    assert not any(m.get("isLearner") for m in listed)
    assert sorted(u for m in listed for u in m["peerURLs"]) == sorted(
        f"https://{ADDRESS[n]}:2380" for n in CONTROL_PLANES)
    table = ssh_ok(cluster, "gpu-02", f"{ETCDCTL} member list -w table")
    assert table.count("│ started │") == 3, table  # etcdctl's table, box-drawn
    assert healthy_endpoints(cluster, "cpu-01") == {
        f"https://{ADDRESS[n]}:2379": True for n in CONTROL_PLANES}


def test_every_node_reaches_the_api_through_its_own_haproxy(cluster: Lab) -> None:
    for node in (*CONTROL_PLANES, WORKER):
        listen = ssh_ok(cluster, node, "ss -Hltnp 'sport = :6443'")
        assert "127.0.0.1:6443" in listen and "haproxy" in listen, (node, listen)
        server = ssh_ok(cluster, node, "grep -h 'server:' /etc/kubernetes/kubelet.conf").split()
        # the first control plane's kubelet talks to its own API server (kubeadm's local
        # mode); every other node's to the endpoint
        wanted = {"https://127.0.0.1:6443"} | (
            {f"https://{ADDRESS[node]}:6443"} if node == "cp-01" else set())
        assert server[-1] in wanted, (node, server)
    for node in CONTROL_PLANES:
        listen = ssh_ok(cluster, node, "ss -Hltn 'sport = :6443'")
        assert f"{ADDRESS[node]}:6443" in listen, (node, listen)  # the API server itself
        conf = ssh_ok(cluster, node, "grep -h 'server:' /etc/kubernetes/admin.conf")
        assert conf.split()[-1] == "https://127.0.0.1:6443", (node, conf)
    nodes = json.loads(ssh_ok(cluster, WORKER, "kubectl --kubeconfig "
                              "/etc/kubernetes/kubelet.conf get nodes -o json"))["items"]
    roles = {n["metadata"]["name"]: "node-role.kubernetes.io/control-plane" in
             n["metadata"]["labels"] for n in nodes}
    assert roles == {"cp-01": True, "cpu-01": True, "gpu-02": True, "gpu-01": False}


def test_a_second_run_changes_nothing(cluster: Lab, inventory: Path) -> None:
    result, text = bootstrap_inline(inventory)
    assert result["changed"] == 0, text
    print(f"second run: {result['wall_time']:.2f}s")


def test_status_shows_every_member_and_api_server(cluster: Lab, inventory: Path) -> None:
    out = io.StringIO()
    rows = day2.status(inventory, reporter=Reporter(out))
    by_host = {r["host"]: r for r in rows}
    for node in CONTROL_PLANES:
        assert by_host[node]["control_plane"] == "etcd ok, API ok", by_host[node]
        assert sorted(by_host[node]["etcd_members"]) == sorted(CONTROL_PLANES)
    assert "control_plane" not in by_host[WORKER]
    assert "etcd: 3 of 3 members healthy (a majority is 2): the cluster accepts writes" \
        in out.getvalue()


JOB = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "ha-probe"},
       "spec": {"backoffLimit": 0, "template": {"spec": {
           "restartPolicy": "Never",
           "containers": [{"name": "probe", "image": "registry.k8s.io/pause:3.10.1"}]}}}}


def test_one_control_plane_down_the_cluster_still_answers(cluster: Lab, inventory: Path
                                                          ) -> None:
    cluster.power_off("cp-01")  # the first control plane: kubeadm init's, and the leader's
    t0 = time.monotonic()
    # kubectl through each node's own HAProxy, from the worker (its kubelet's credentials)
    # and from another control plane (admin)
    names = json.loads(ssh_ok(cluster, WORKER, "kubectl --kubeconfig "
                              "/etc/kubernetes/kubelet.conf --request-timeout=10s get nodes "
                              "-o json"))["items"]
    assert len(names) == 4
    ssh_ok(cluster, "cpu-01", f"{ADMIN} get nodes")
    # and from the lab host with the real kubectl, at a control plane that is up
    conf = inventory.parent / "artifacts" / "admin.conf"
    real = repos.real_kubectl()
    lab_host = subprocess.run([str(real), "--kubeconfig", str(conf), "--server",
                               f"https://{ADDRESS['cpu-01']}:6443", "--request-timeout=10s",
                               "get", "nodes", "-o", "name"],
                              capture_output=True, text=True, timeout=60)
    assert lab_host.returncode == 0, lab_host.stderr
    assert sorted(lab_host.stdout.split()) == [f"node/{n}" for n in sorted(ADDRESS)]
    print(f"answered with cp-01 down within {time.monotonic() - t0:.1f}s")
    # a Job is still scheduled: the scheduler and controllers of another control plane lead
    rc, _, err = cluster.ssh("cpu-01", f"{ADMIN} apply -f -", input=json.dumps(JOB))
    assert rc == 0, err

    def scheduled() -> bool:
        rc, out, _ = cluster.ssh("cpu-01", f"{ADMIN} get pods -l job-name=ha-probe -o json")
        return rc == 0 and any(p["spec"].get("nodeName") for p in json.loads(out)["items"])
    took = wait_for("the Job's pod scheduled with cp-01 down", scheduled, 120)
    holder = json.loads(ssh_ok(cluster, "cpu-01", f"{ADMIN} -n kube-system get lease "
                               "kube-controller-manager -o json"))["spec"]["holderIdentity"]
    assert not holder.startswith("cp-01_"), holder
    print(f"Job scheduled {took:.1f}s after asking; controller-manager leader {holder}")
    # cp-01 comes back and its etcd member rejoins with no action
    cluster.power_on("cp-01")
    took = wait_for("all 3 members healthy again", lambda: healthy_endpoints(
        cluster, "cp-01") == {f"https://{ADDRESS[n]}:2379": True for n in CONTROL_PLANES})
    print(f"cp-01's member healthy {took:.1f}s after power on")
    ssh_ok(cluster, "cpu-01", f"{ADMIN} delete job ha-probe --wait=false")


def test_two_down_no_quorum_writes_refused_and_status_says_so(cluster: Lab, inventory: Path
                                                              ) -> None:
    cluster.power_off("cp-01", "cpu-01")
    try:
        rc, out, _ = cluster.ssh("gpu-02", f"{ADMIN} create configmap ha-no-quorum "
                                   "--from-literal=a=b", timeout=120)
        assert rc != 0, out
        report = io.StringIO()
        t0 = time.monotonic()
        rows = day2.status(inventory, reporter=Reporter(report))
        took = time.monotonic() - t0
        text = report.getvalue()
        by_host = {r["host"]: r for r in rows}
        assert by_host["cp-01"]["state"] == by_host["cpu-01"]["state"] == "unreachable"
        assert by_host["gpu-02"]["etcd_healthy"] is False
        assert "etcd has NO QUORUM: 1 of 3 members are up (gpu-02) and etcd needs 2" in text
        assert "the API servers refuse writes until 1 more control plane(s) are back" in text
        assert "not healthy: cp-01 (unreachable), cpu-01 (unreachable), gpu-02 (etcd unhealthy)" \
            in text
        print(f"status with no quorum: {took:.1f}s\n{text[-600:]}")
    finally:
        cluster.power_on("cp-01", "cpu-01")
    took = wait_for("quorum back", lambda: cluster.ssh(
        "gpu-02", f"{ADMIN} create configmap ha-quorum-back --from-literal=a=b")[0] == 0)
    print(f"writes accepted again {took:.1f}s after power on")
    wait_for("all 3 members healthy again", lambda: healthy_endpoints(
        cluster, "gpu-02") == {f"https://{ADDRESS[n]}:2379": True for n in CONTROL_PLANES})


def test_remove_then_add_a_control_plane_touches_only_the_control_planes(
        cluster: Lab, inventory: Path) -> None:
    removed = day2.remove_node(inventory, "gpu-02", yes=True)
    assert removed["etcd_members"] == ["cp-01", "cpu-01"]
    assert set(removed["contacted"]) <= set(CONTROL_PLANES), removed["contacted"]
    assert sorted(m["name"] for m in members(cluster, "cpu-01")) == ["cp-01", "cpu-01"]
    _, out, _ = cluster.ssh("gpu-02", "ls /etc/kubernetes/manifests /var/lib/etcd")
    assert out.split() == ["/etc/kubernetes/manifests:", "/var/lib/etcd:"], out  # reset
    added = day2.add_node(inventory, "gpu-02", yes=True)
    assert set(added["totals"]) <= set(CONTROL_PLANES), added["totals"]
    assert sorted(m["name"] for m in members(cluster, "cp-01")) == sorted(CONTROL_PLANES)
    assert healthy_endpoints(cluster, "gpu-02") == {
        f"https://{ADDRESS[n]}:2379": True for n in CONTROL_PLANES}


def test_removing_a_control_plane_below_quorum_is_refused(cluster: Lab, inventory: Path
                                                          ) -> None:
    cluster.power_off("cpu-01")
    try:
        with pytest.raises(Exception, match=r"removing gpu-02 would leave 1 healthy etcd "
                           r"member\(s\) of 2, and etcd needs 2"):
            day2.remove_node(inventory, "gpu-02", yes=True)
    finally:
        cluster.power_on("cpu-01")
    assert len(members(cluster, "cp-01")) == 3  # nothing was removed
    wait_for("cpu-01's member healthy again", lambda: all(
        healthy_endpoints(cluster, "cp-01").values()))


def test_restore_after_two_members_lost_their_data(cluster: Lab, inventory: Path) -> None:
    """Quorum lost for good: cpu-01 and gpu-02 lose etcd's data (their kubelets stopped, the
    member dirs removed), so cp-01's member alone refuses writes. `invoke restore` of a backup
    taken before: cp-01 restored as a one-member etcd, the other two reset and joined again as
    new members; three started members, writes work, the ConfigMap of before the backup is
    there and the one made after is not."""
    ssh_ok(cluster, "cp-01", f"{ADMIN} create configmap ha-restore-probe --from-literal=a=b")
    taken = day2.backup(inventory, reporter=Reporter(io.StringIO()))
    ssh_ok(cluster, "cp-01", f"{ADMIN} create configmap ha-made-later --from-literal=a=b")
    for node in ("cpu-01", "gpu-02"):
        ssh_ok(cluster, node, "systemctl stop kubelet; systemctl stop etcd-static-pod "
               "2>/dev/null; rm -rf /var/lib/etcd/member", timeout=120)
    rc, out, _ = cluster.ssh("cp-01", f"{ADMIN} create configmap ha-no-quorum "
                             "--from-literal=a=b", timeout=120)
    assert rc != 0, out
    report = io.StringIO()
    t0 = time.monotonic()
    result = day2.restore(inventory, taken["path"], yes=True, reporter=Reporter(report))
    took = time.monotonic() - t0
    text = report.getvalue()
    print(f"restore of 3 control planes after quorum loss: {took:.1f}s\n{text[-1500:]}")
    assert not result["rebuilt"] and all(result["nodes_ready"].values()), text
    assert "no backup of the present state: no etcd member is healthy" in text
    assert text.index("[cpu-01] kubeadm reset") < text.index("[cp-01] etcd restored")
    assert text.index("[cp-01] etcd restored") < text.index("[cpu-01] join again")
    assert "(the cluster was just restored from a backup)" in text, text
    assert sorted(m["name"] for m in members(cluster, "cp-01")) == sorted(CONTROL_PLANES)
    wait_for("all 3 members healthy", lambda: healthy_endpoints(cluster, "cp-01") == {
        f"https://{ADDRESS[n]}:2379": True for n in CONTROL_PLANES})
    ssh_ok(cluster, "gpu-02", f"{ADMIN} create configmap ha-writes-again --from-literal=a=b")
    ssh_ok(cluster, "cpu-01", f"{ADMIN} get configmap ha-restore-probe")
    ssh_ok(cluster, "cpu-01", f"! {ADMIN} get configmap ha-made-later")

#: on the worker, through its own HAProxy: its own Node object with the kubelet's client
#: certificate (an authenticated read that goes to etcd), every 0.25 s
POLLER = (f"while :; do t=$(date +%s.%N); if curl -s -o /dev/null --max-time 2 -w '%{{http_code}}' "
          "--cacert /etc/kubernetes/pki/ca.crt "
          "--cert /var/lib/kubelet/pki/kubelet-client-current.pem "
          "--key /var/lib/kubelet/pki/kubelet-client-current.pem "
          f"https://127.0.0.1:6443/api/v1/nodes/{WORKER} | grep -q 200; then echo \"$t ok\"; "
          "else echo \"$t fail\"; fi; sleep 0.25; done")


def _poll_gaps(cluster: Lab, run: Any) -> tuple[Any, int, int, float]:
    """Run ``run()`` while the worker reads the API through its HAProxy every 0.25 s; its
    result, the number of reads, failed reads and the longest gap between two answers."""
    ssh_ok(cluster, WORKER, f"nohup sh -c {shlex.quote(POLLER)} >/tmp/poll.log 2>&1 & "
           "echo $! >/tmp/poll.pid")
    try:
        result = run()
    finally:
        ssh_ok(cluster, WORKER, "kill $(cat /tmp/poll.pid)")
    samples = [line.split() for line in ssh_ok(cluster, WORKER, "cat /tmp/poll.log").splitlines()
               if line.endswith((" ok", " fail"))]
    oks = [float(t) for t, state in samples if state == "ok"]
    gaps = [b - a for a, b in itertools.pairwise(oks)]
    return (result, len(samples), sum(1 for _, state in samples if state == "fail"),
            max(gaps) if gaps else float("inf"))


def test_renew_certs_rolls_the_control_planes_with_the_api_answering(cluster: Lab,
                                                                     inventory: Path) -> None:
    """renew-certs one control plane at a time: each one's API server restarts onto its new
    certificate while the other two serve the endpoint; the worker's reads through its own
    HAProxy never wait 5 s or more for an answer."""
    serials = {n: ssh_ok(cluster, n, "openssl x509 -noout -serial -in "
                         "/etc/kubernetes/pki/apiserver.crt") for n in CONTROL_PLANES}
    t0 = time.monotonic()
    result, reads, fails, worst = _poll_gaps(cluster, lambda: day2.renew_certs(
        inventory, yes=True, reporter=Reporter(io.StringIO())))
    took = time.monotonic() - t0
    print(f"renew-certs on 3 control planes: {took:.1f}s; {reads} API reads from {WORKER}, "
          f"{fails} failed, longest gap between answers {worst:.2f}s")
    assert result["renewed"] == list(CONTROL_PLANES), result
    assert reads > 40 and worst < 5.0, (reads, worst)
    for n in CONTROL_PLANES:
        served = ssh_ok(cluster, n, f"echo | openssl s_client -connect {ADDRESS[n]}:6443 "
                        "2>/dev/null | openssl x509 -noout -serial")
        assert served != serials[n], n  # restarted onto the renewed certificate

def test_upgrade_moves_every_control_plane_with_the_api_answering_throughout(
        cluster: Lab, inventory: Path) -> None:
    # the admin names the next minor in the inventory first, then upgrades to it
    data = yaml.safe_load(inventory.read_text())
    data["all"]["vars"]["kubernetes_version"] = "1.36"
    at_136 = inventory.with_name("at-136.yaml")
    at_136.write_text(yaml.safe_dump(data, sort_keys=False))
    t0 = time.monotonic()
    result, reads, fails, worst = _poll_gaps(
        cluster, lambda: day2.upgrade(at_136, kubernetes="1.36", yes=True))
    took = time.monotonic() - t0
    assert result["upgraded"] == [*CONTROL_PLANES, WORKER], result  # control planes first
    assert result["inventory_change"] == ""
    assert reads > 40, reads
    print(f"upgrade of 4 nodes: {took:.1f}s; {reads} API reads from {WORKER}, "
          f"{fails} failed, longest gap between answers {worst:.2f}s")
    assert worst < 5.0, f"the API did not answer for {worst:.1f}s during the upgrade"
    nodes = json.loads(ssh_ok(cluster, "cp-01", f"{ADMIN} get nodes -o json"))["items"]
    assert {n["status"]["nodeInfo"]["kubeletVersion"] for n in nodes} == {f"v{NEW}"}
    for node in CONTROL_PLANES:
        image = ssh_ok(cluster, node, "grep -h 'image:' "
                       "/etc/kubernetes/manifests/kube-apiserver.yaml").split()[-1]
        assert image == f"registry.k8s.io/kube-apiserver:v{NEW}", (node, image)


def test_reset_takes_every_control_plane_and_its_member_down(cluster: Lab, inventory: Path
                                                             ) -> None:
    """Last in the module: the cluster is gone afterwards."""
    out = io.StringIO()
    result = day2.reset(inventory, yes=True, reporter=Reporter(out))
    assert sorted(result["reset"]) == sorted(ADDRESS), out.getvalue()
    for node in CONTROL_PLANES:
        left = ssh_ok(cluster, node, "ls -A /etc/kubernetes/manifests /var/lib/etcd; "
                      "ss -Hltn '( sport = :2379 or sport = :2380 )'")
        assert left.split() == ["/etc/kubernetes/manifests:", "/var/lib/etcd:"], (node, left)
