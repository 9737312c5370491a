"""Day-2 on a bootstrapped lab, over real SSH: status, reprovision (only the target and the
control plane see an SSH session), driver upgrade one node at a time (and a failed one that
stops), a dead node, removing and adding nodes, reset and bootstrap again.

The tests run in order and share one cluster, starting from the "bootstrapped" snapshot."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s import api, day2
from gpuk8s.accept.command import release
from gpuk8s.errors import Gpuk8sError, PhaseFailed
from gpuk8s.report import Reporter
from tests.lab.cli import gpu_fault
from tests.lab.lab import Lab
from tests.lab.product.runs import (
    BOX,
    bootstrapped_is_current,
    call,
    derived_inventory,
    invoke_at,
    restore_fresh,
    snapshot_bootstrapped,
)
from tests.lab.product.test_bootstrap import GATE_VARS, GATES, NODES, kubectl_cp, wait_cluster_ready

pytestmark = pytest.mark.lab


def quiet() -> Reporter:
    return Reporter(io.StringIO())


def rows(inv: Path) -> dict[str, dict[str, Any]]:
    return {r["host"]: r for r in day2.status(inv, as_json=True, reporter=quiet())}


def node_clock(lab: Lab, name: str) -> float:
    """The lab's clock (the nodes share the host's), with sub-second precision."""
    rc, out, _ = lab.ssh(name, "date +%s.%N")
    assert rc == 0
    return float(out)


def ssh_sessions_since(lab: Lab, name: str, since: float, until: float) -> list[str]:
    """sshd's "Accepted ..." lines logged on a node between two instants (the session that
    reads the journal comes after ``until`` and is not counted)."""
    rc, out, err = lab.ssh(name, f"journalctl -u ssh --no-pager -o short-unix "
                           f"--since @{int(since) - 1}")
    assert rc == 0, err
    accepted = []
    for line in out.splitlines():
        stamp, _, rest = line.partition(" ")
        if "Accepted " in rest and since <= float(stamp) <= until:
            accepted.append(rest)
    return accepted


def restore_bootstrapped(lab: Lab) -> Lab:
    """The lab as test_bootstrap leaves it (its "bootstrapped" snapshot), booted and Ready;
    a module run alone bootstraps once and takes the snapshot itself."""
    if not bootstrapped_is_current(lab):  # none yet, or an older gpuk8s made it
        # from fresh nodes: a lab left up by an earlier session may hold a cluster already
        restore_fresh(lab)
        api.bootstrap(lab.inventory_path, sets=[GATES], yes=True, reporter=quiet())
        snapshot_bootstrapped(lab)
    lab.restore("bootstrapped")
    wait_cluster_ready(lab)
    return lab


@pytest.fixture(scope="module")
def cluster(lab: Lab) -> Lab:
    return restore_bootstrapped(lab)


@pytest.fixture(scope="module")
def inv(cluster: Lab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lab inventory with the feature gates the cluster was bootstrapped with."""
    return derived_inventory(cluster, tmp_path_factory.mktemp("day2"), feature_gates=GATE_VARS)


def test_status_shows_the_bootstrapped_cluster(inv: Path) -> None:
    status = rows(inv)
    assert sorted(status) == sorted(NODES)
    assert all(r["state"] == "Ready" for r in status.values()), status
    assert status["gpu-01"]["gpus"] == 2 and status["gpu-01"]["allocatable_gpu"] == 2
    assert status["gpu-02"]["gpu_model"] == "NVIDIA H200"
    assert status["gpu-02"]["allocatable_gpu"] == 1
    assert status["cpu-01"]["allocatable_gpu"] is None
    assert status["gpu-01"]["driver"].startswith("580.")
    assert status["gpu-01"]["cuda"].startswith("13.0")
    assert all(r["drift"] == 0 for r in status.values()), {h: r["drift"] for h, r in
                                                            status.items()}


def invoke_status(inv: Path, *args: str, tty: bool) -> str:
    rc, out = invoke_at(80, "status", "--inventory", str(inv), *args, tty=tty)
    assert rc == 0, out
    return out


def test_invoke_status_reads_at_80_columns_on_a_terminal_and_in_a_pipe(inv: Path) -> None:
    """Issue 30: status wrapped 12 columns into a grid of three-letter cells at 80 columns
    and in a pipe. The default view fits 80 columns with every cell whole; a pipe gets
    plain aligned text (no box drawing). (-o wide's columns: tests/unit/test_tables.py.)"""
    started = time.monotonic()
    piped = invoke_status(inv, tty=False)
    lines = piped.splitlines()
    assert not BOX.search(piped), piped
    assert max(len(x) for x in lines) <= 80, piped
    head = lines.index(next(x for x in lines if x.startswith("HOST ")))
    assert lines[head].split() == ["HOST", "ROLE", "STATE", "GPUS", "OFFERED", "PLAN"]
    table = {x.split()[0]: x.split() for x in lines[head + 1:head + 1 + len(NODES)]}
    assert sorted(table) == sorted(NODES), piped
    assert table["cp-01"] == ["cp-01", "control-plane", "Ready", "0", "-", "in", "sync"]
    assert table["gpu-01"] == ["gpu-01", "worker", "Ready", "2", "2", "in", "sync"]
    assert table["gpu-02"] == ["gpu-02", "worker", "Ready", "1", "1", "in", "sync"]
    assert table["cpu-01"] == ["cpu-01", "worker", "Ready", "0", "-", "in", "sync"]

    on_tty = invoke_status(inv, tty=True)
    tty_lines = [x for x in on_tty.splitlines() if x.strip()]
    assert max(len(x) for x in tty_lines) <= 80, on_tty
    for host in NODES:  # each host's row, whole, with its cells whole
        row = next(x for x in tty_lines if re.search(rf"\b{host}\b", x))
        assert "Ready" in row and "in sync" in row, on_tty

    print(f"{piped}\n{on_tty}\ntwo invoke status runs: {time.monotonic() - started:.1f}s")


def test_reprovision_touches_only_the_target_and_the_control_plane(cluster: Lab,
                                                                   inv: Path) -> None:
    start = node_clock(cluster, "cp-01")
    result, text = call(day2.reprovision, inv, "gpu-02", reinstall_driver=True, yes=True)
    end = node_clock(cluster, "cp-01")
    assert result["changed"] > 0
    assert "purge" in text and "nvidia-open-580" in text
    for bystander in ("gpu-01", "cpu-01"):
        assert ssh_sessions_since(cluster, bystander, start, end) == [], \
            f"{bystander} saw an SSH session during the reprovision of gpu-02"
    assert ssh_sessions_since(cluster, "gpu-02", start, end)
    status = rows(inv)
    assert status["gpu-02"]["state"] == "Ready" and status["gpu-02"]["allocatable_gpu"] == 1
    assert not status["gpu-02"]["cordoned"]


def test_upgrade_driver_one_node_at_a_time(cluster: Lab, inv: Path) -> None:
    before = {n: cluster.boot_id(n) for n in ("gpu-01", "gpu-02")}
    result, text = call(day2.upgrade, inv, driver="580.105.08", serial=1, yes=True)
    assert result["upgraded"] == ["gpu-01", "gpu-02"]
    assert text.index("drain gpu-01") < text.index("upgraded gpu-01") < \
        text.index("drain gpu-02")
    for name in ("gpu-01", "gpu-02"):
        rc, out, _ = cluster.ssh(name, "nvidia-smi --query-gpu=driver_version "
                                 "--format=csv,noheader")
        assert rc == 0 and set(out.split()) == {"580.105.08"}
        assert cluster.boot_id(name) != before[name], f"{name} was not rebooted"
    status = rows(inv)
    assert status["gpu-01"]["allocatable_gpu"] == 2 and not status["gpu-01"]["cordoned"]


def test_failed_upgrade_stops_at_the_first_node(cluster: Lab, inv: Path) -> None:
    with pytest.raises(Gpuk8sError) as err:
        call(day2.upgrade, inv, driver="580.999.99", yes=True)
    text = str(err.value)
    assert "upgrade stopped at gpu-01" in text and "untouched: gpu-02" in text
    assert 'no nvidia-open-580 version matching' in text
    rc, out, _ = cluster.ssh("gpu-02", "nvidia-smi --query-gpu=driver_version "
                             "--format=csv,noheader")
    assert rc == 0 and set(out.split()) == {"580.105.08"}
    nodes = json.loads(kubectl_cp(cluster, "get nodes -o json"))["items"]
    cordoned = [n["metadata"]["name"] for n in nodes if n["spec"].get("unschedulable")]
    assert cordoned == ["gpu-01"]
    kubectl_cp(cluster, "uncordon gpu-01")


def test_dead_node_is_reported_and_absent_skips_it(cluster: Lab, inv: Path,
                                                   tmp_path: Path) -> None:
    cluster._stop_nodes(["cpu-01"])
    with pytest.raises(PhaseFailed, match="cpu-01"):
        call(api.bootstrap, inv, yes=True)
    assert rows(inv)["cpu-01"]["state"] == "unreachable"
    data = yaml.safe_load(inv.read_text())
    data["all"]["children"]["workers"]["hosts"]["cpu-01"]["absent"] = True
    absent = tmp_path / "inventory.yaml"
    absent.write_text(yaml.safe_dump(data, sort_keys=False))
    result, text = call(api.bootstrap, absent, yes=True)
    assert "skipping cpu-01: absent: true" in text and "cpu-01" not in result["totals"]
    assert result["changed"] == 0


def test_remove_dead_node_deletes_only_its_node_object(cluster: Lab, inv: Path) -> None:
    result, text = call(day2.remove_node, inv, "cpu-01", yes=True)
    assert result == {"removed": "cpu-01", "dead": True}
    assert "only its Node object is removed" in text
    names = [n["metadata"]["name"] for n in
             json.loads(kubectl_cp(cluster, "get nodes -o json"))["items"]]
    assert "cpu-01" not in names and len(names) == 3


def test_add_a_fifth_gpu_node(cluster: Lab, inv: Path) -> None:
    new = cluster.add_node("gpu-03", "1xA100")
    data = yaml.safe_load(inv.read_text())
    data["all"]["children"]["workers"]["hosts"]["cpu-01"]["absent"] = True
    data["all"]["children"]["workers"]["hosts"]["gpu-03"] = {"ansible_host": new.ip,
                                                             "gpu_required": True}
    inv.write_text(yaml.safe_dump(data, sort_keys=False))
    start = node_clock(cluster, "cp-01")
    result, text = call(day2.add_node, inv, "gpu-03", yes=True)
    end = node_clock(cluster, "cp-01")
    assert result["changed"] > 10 and "nvidia-open-580" in text  # GPU roles included
    for bystander in ("gpu-01", "gpu-02"):
        assert ssh_sessions_since(cluster, bystander, start, end) == []
    # accept_on_add: it joined cordoned, passed accept --quick, and was uncordoned
    assert "then cordoned until accept --quick passes" in text
    assert result["accept"]["verdict"] in ("pass", "warn")
    assert result["accept"]["action"].startswith("admitted")
    status = rows(inv)
    assert status["gpu-03"]["state"] == "Ready"
    assert status["gpu-03"]["allocatable_gpu"] == 1
    assert status["gpu-03"]["gpu_model"] == "NVIDIA A100-SXM4-80GB"
    assert not json.loads(kubectl_cp(cluster, "get node gpu-03 -o json"))["spec"].get(
        "unschedulable")


def test_remove_live_node(cluster: Lab, inv: Path) -> None:
    result, _ = call(day2.remove_node, inv, "gpu-03", yes=True)
    assert result == {"removed": "gpu-03", "dead": False}
    rc, out, _ = cluster.ssh("gpu-03", "ls /etc/kubernetes; ls /etc/cni/net.d | wc -l")
    assert rc == 0 and "kubelet.conf" not in out and out.split()[-1] == "0"


def test_an_interrupted_join_is_reset_then_joined(cluster: Lab, inv: Path) -> None:
    """What `kubeadm join` leaves when it is killed before kubelet.conf (the cluster's CA, the
    bootstrap kubeconfig): its next preflight refuses them, so gpuk8s resets first."""
    _, ca, _ = cluster.ssh("cp-01", "cat /etc/kubernetes/pki/ca.crt")
    rc, _, err = cluster.ssh("gpu-03", "mkdir -p /etc/kubernetes/pki && cat > "
                             "/etc/kubernetes/pki/ca.crt && echo 'apiVersion: v1' > "
                             "/etc/kubernetes/bootstrap-kubelet.conf", input=ca)
    assert rc == 0, err
    # and the box's GPU is slow (lab.gpu-fault): it must never take work
    assert gpu_fault("gpu-03", 0, "slow") == 0
    result, text = call(day2.add_node, inv, "gpu-03", yes=True)
    assert "after kubeadm reset: an interrupted join left /etc/kubernetes/bootstrap-kubelet" \
        ".conf, /etc/kubernetes/pki/ca.crt" in text
    assert result["accept"]["verdict"] == "fail" and result["accept"]["reasons"] == ["slow"]
    node = json.loads(kubectl_cp(cluster, "get node gpu-03 -o json"))
    assert node["spec"].get("unschedulable") is True
    assert [t["key"] for t in node["spec"].get("taints", [])] == ["gpuk8s.io/gpu-unhealthy"]
    status = rows(inv)
    assert status["gpu-03"]["state"] == "Ready" and status["gpu-03"]["gpu_quarantine"] == {
        "reason": "slow", "detail": status["gpu-03"]["gpu_quarantine"]["detail"]}
    assert gpu_fault("gpu-03", None, None, clear=True) == 0
    released, _ = call(release, inv, host="gpu-03", quick=True)
    assert released["result"]["action"] == "released and uncordoned"
    result, _ = call(day2.remove_node, inv, "gpu-03", yes=True)
    assert result == {"removed": "gpu-03", "dead": False}


def test_reset_then_bootstrap_again(cluster: Lab, inv: Path) -> None:
    with pytest.raises(Gpuk8sError, match="aborted"):
        day2.reset(inv, reporter=quiet(), confirm=lambda question: False)
    assert len(json.loads(kubectl_cp(cluster, "get nodes -o json"))["items"]) == 3
    result, _ = call(day2.reset, inv, confirm=lambda q: "type the control plane" in q)
    assert "cp-01" in result["reset"]
    rc, _, _ = cluster.ssh("cp-01", "ls /etc/kubernetes/admin.conf")
    assert rc != 0
    data = yaml.safe_load(inv.read_text())
    del data["all"]["children"]["workers"]["hosts"]["gpu-03"]
    inv.write_text(yaml.safe_dump(data, sort_keys=False))
    result, _ = call(api.bootstrap, inv, yes=True)
    assert result["changed"] > 0
    status = rows(inv)
    assert [h for h, r in status.items() if r["state"] == "Ready"] == \
        ["cp-01", "gpu-01", "gpu-02"]
    assert status["cpu-01"]["state"] == "absent"


def test_changing_feature_gates_rolls_through_the_cluster(cluster: Lab, inv: Path) -> None:
    """feature_gates changed on a running cluster: plan names every component and node, the
    run rewrites the static pods, then restarts one kubelet at a time; a second run is a no-op."""
    new = {"ImageVolume": True, "InPlacePodVerticalScaling": True,
           "UserNamespacesSupport": False}
    data = yaml.safe_load(inv.read_text())
    data["all"]["vars"]["feature_gates"] = new
    inv.write_text(yaml.safe_dump(data, sort_keys=False))
    nodes = sorted(h for h, r in rows(inv).items() if r["state"] != "absent")

    def report(result: dict[str, Any]) -> dict[str, Any]:
        path = Path(result["run_dir"]) / "report.json"
        return {p["phase"]: p["hosts"] for p in json.loads(path.read_text())["phases"]}

    planned, _ = call(api.plan, inv)
    phases = report(planned)
    [cp_op] = [o for o in phases["control-plane"]["cp-01"]["ops"]
               if o["id"] == "control_plane | feature gates"]
    assert cp_op["status"] == "planned"
    assert "kube-scheduler: +ImageVolume=true, UserNamespacesSupport=true -> false" in \
        cp_op["reason"]
    for name in nodes:
        [op] = phases["kubelets"][name]["ops"]
        assert op["status"] == "planned", op
        assert op["reason"] == ("+ kubelet feature gates +ImageVolume=true, "
                                "UserNamespacesSupport=true -> false; restart the kubelet")

    applied, _ = call(api.bootstrap, inv, yes=True)
    phases = report(applied)
    assert sorted(phases["kubelets"]) == nodes
    assert all(h["error"] is None for h in phases["kubelets"].values())
    # one node at a time: the phase took as long as its hosts together, not as the slowest
    ran = json.loads((Path(applied["run_dir"]) / "report.json").read_text())["phases"]
    took = next(p["elapsed"] for p in ran if p["phase"] == "kubelets")
    each = [h["elapsed"] for h in phases["kubelets"].values()]
    assert took >= 0.95 * sum(each) > 1.5 * max(each), (took, each)

    flag = "--feature-gates=ImageVolume=true,InPlacePodVerticalScaling=true," \
        "UserNamespacesSupport=false"
    for component in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        pod = json.loads(kubectl_cp(cluster, f"-n kube-system get pod {component}-cp-01 -o json"))
        assert flag in pod["spec"]["containers"][0]["command"], component
    metrics = kubectl_cp(cluster, "get --raw /metrics")
    assert 'kubernetes_feature_enabled{name="UserNamespacesSupport",stage="BETA"} 0' in metrics
    assert 'kubernetes_feature_enabled{name="ImageVolume",stage="BETA"} 1' in metrics
    for name in nodes:
        configz = json.loads(kubectl_cp(cluster, f"get --raw /api/v1/nodes/{name}/proxy/configz"))
        assert configz["kubeletconfig"]["featureGates"] == new, name
    stored = json.loads(kubectl_cp(cluster, "-n kube-system get configmap kubeadm-config "
                                   "-o json"))["data"]["ClusterConfiguration"]
    assert flag.split("=", 1)[1] in stored  # later joins and upgrades keep the gates
    assert [r["state"] for r in rows(inv).values() if r["state"] != "absent"] == \
        ["Ready"] * len(nodes)

    again, text = call(api.bootstrap, inv, yes=True)
    assert again["changed"] == 0, text
