"""gpuk8s against the booted lab over real SSH: plan changes nothing, bootstrap (as a sudo user
with a password) makes a Ready GPU cluster, a second run (as root by key) changes nothing.

The tests of this module run in order and share the lab; the last one snapshots the
bootstrapped lab as "bootstrapped" for later modules.
"""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import api
from gpuk8s.playbook import PHASES
from gpuk8s.report import Reporter
from tests.lab.lab import Lab
from tests.lab.repos import real_kubectl
from tests.lab.runs import restore_fresh

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
GATES = "feature_gates={InPlacePodVerticalScaling: true, UserNamespacesSupport: true}"
NODES = ("cp-01", "gpu-01", "gpu-02", "cpu-01")
#: what a node's state is, for "plan changes nothing": packages and every file under /etc
STATE_CMD = ("dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\\n' | sha256sum; "
             "find /etc -xdev -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum; "
             "find /etc -xdev | sort | sha256sum")


def run_api(fn: Any, *args: Any, **kwargs: Any) -> tuple[dict[str, Any], str]:
    out = io.StringIO()
    result = fn(*args, reporter=Reporter(out), **kwargs)
    text = out.getvalue()
    sys.stdout.write(text)
    return result, text


def node_state(lab: Lab) -> dict[str, str]:
    state = {}
    for name in NODES:
        rc, out, err = lab.ssh(name, STATE_CMD)
        assert rc == 0, err
        state[name] = out
    return state


def kubectl_cp(lab: Lab, args: str) -> str:
    rc, out, err = lab.ssh("cp-01", f"kubectl --kubeconfig /etc/kubernetes/admin.conf {args}")
    assert rc == 0, f"kubectl {args}: {err}"
    return out


@pytest.fixture(scope="module")
def fresh(lab: Lab) -> Lab:
    """The default lab, fresh; snapshotted once as "fresh" so later modules can go back."""
    return restore_fresh(lab)


def test_plan_on_fresh_nodes_lists_changes_and_changes_nothing(fresh: Lab) -> None:
    before = node_state(fresh)
    result, text = run_api(api.plan, fresh.inventory_path, sets=[GATES], diff=True)
    assert result["planned"] > 20
    for name in NODES:
        assert f"{name}: " in text, f"no plan shown for {name}"
    assert "+ kubeadm init" in text and "+ kubeadm join" in text
    assert "nvidia-open-580" in text  # GPU nodes plan the driver
    assert node_state(fresh) == before, "invoke plan changed a node"


def test_bootstrap_as_sudo_user_with_password(fresh: Lab, monkeypatch: pytest.MonkeyPatch,
                                              ) -> None:
    password = fresh.labadmin_password
    monkeypatch.setenv("GPUK8S_BECOME_PASSWORD", password)
    result, text = run_api(api.bootstrap, fresh.become_inventory_path, sets=[GATES], yes=True)
    assert result["changed"] > 20
    assert all(t["failed"] == 0 for t in result["totals"].values())
    run_dir = Path(result["run_dir"])
    written = "".join(p.read_text() for p in run_dir.iterdir())
    assert password not in text and password not in written
    report = json.loads((run_dir / "report.json").read_text())
    assert [p["phase"] for p in report["phases"]] == [phase.name for phase in PHASES]
    assert stat.S_IMODE((run_dir / "report.json").stat().st_mode) == 0o600
    # the join token minted for this run never reaches the output or the run folder
    tokens = kubectl_cp(fresh, "get secrets -n kube-system -o json")
    for item in json.loads(tokens)["items"]:
        if item["metadata"]["name"].startswith("bootstrap-token-"):
            import base64

            secret = base64.b64decode(item["data"]["token-secret"]).decode()
            assert secret not in text and secret not in written


def test_cluster_is_ready_with_gpus(fresh: Lab) -> None:
    nodes = json.loads(kubectl_cp(fresh, "get nodes -o json"))["items"]
    by_name = {n["metadata"]["name"]: n for n in nodes}
    assert sorted(by_name) == sorted(NODES)
    for name, node in by_name.items():
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", f"{name} not Ready: {ready}"
    gpus = {name: node["status"].get("allocatable", {}).get("nvidia.com/gpu")
            for name, node in by_name.items()}
    assert gpus == {"cp-01": None, "gpu-01": "2", "gpu-02": "1", "cpu-01": None}


def test_kubectl_from_admin_machine(fresh: Lab) -> None:
    conf = fresh.become_inventory_path.parent / "artifacts" / "admin.conf"
    assert conf.exists() and stat.S_IMODE(conf.stat().st_mode) == 0o600
    # the REAL kubectl on the lab host, as an admin would use the fetched kubeconfig
    out = subprocess.run([str(real_kubectl()), "--kubeconfig", str(conf), "get", "nodes"],
                         capture_output=True, text=True, check=False, timeout=60,
                         env={**os.environ, "HOME": str(conf.parent)})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:2] == ["NAME", "STATUS"]
    assert sorted(line.split()[0] for line in lines[1:]) == sorted(NODES)
    assert all(line.split()[1] == "Ready" for line in lines[1:])


def test_feature_gates_reach_every_kubelet_and_the_apiserver(fresh: Lab) -> None:
    for name in NODES:
        rc, out, err = fresh.ssh(name, "cat /var/lib/kubelet/config.yaml")
        assert rc == 0, err
        assert "InPlacePodVerticalScaling: true" in out, f"{name} kubelet config: {out}"
        assert "UserNamespacesSupport: true" in out
    rc, manifest, _ = fresh.ssh("cp-01", "cat /etc/kubernetes/manifests/kube-apiserver.yaml")
    assert rc == 0
    assert "--feature-gates=InPlacePodVerticalScaling=true,UserNamespacesSupport=true" in manifest
    metrics = kubectl_cp(fresh, "get --raw /metrics")
    assert 'kubernetes_feature_enabled{name="InPlacePodVerticalScaling"' in metrics


def test_second_run_as_root_changes_nothing(fresh: Lab) -> None:
    before = node_state(fresh)
    result, text = run_api(api.bootstrap, fresh.inventory_path, sets=[GATES], yes=True)
    assert result["changed"] == 0, text
    assert "no changes" in text and "wall time" in text
    print(f"\nno-op re-run wall time: {result['wall_time']:.2f}s")
    assert node_state(fresh) == before


def wait_cluster_ready(lab: Lab, timeout: int = 180) -> None:
    """After a boot: the API server answers, then every node is Ready again."""
    rc, out, err = lab.ssh("cp-01", (
        f"end=$(( $(date +%s) + {timeout} )); k='kubectl --kubeconfig "
        "/etc/kubernetes/admin.conf'; until $k get --raw /readyz >/dev/null 2>&1; do "
        "[ $(date +%s) -lt $end ] || exit 1; sleep 1; done; "
        f"$k wait --for=condition=Ready {' '.join('node/' + n for n in NODES)} "
        f"--timeout={timeout}s && "
        "for n in gpu-01:2 gpu-02:1; do $k wait --for=jsonpath='{.status.allocatable."
        "nvidia\\.com/gpu}'=${n#*:} node/${n%:*} "
        f"--timeout={timeout}s || exit 1; done"), timeout=timeout * 2)
    assert rc == 0, f"cluster not Ready after boot: {out} {err}"


def test_snapshot_bootstrapped(fresh: Lab) -> None:
    dest = fresh.snapshot("bootstrapped")
    assert (dest / "topology.yaml").exists()
    assert os.path.exists(dest / "nodes" / "cp-01")
    # the snapshot boots back into a Ready cluster with its GPUs
    wait_cluster_ready(fresh)
    nodes = json.loads(kubectl_cp(fresh, "get nodes -o json"))["items"]
    assert len(nodes) == len(NODES)
