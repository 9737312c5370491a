"""The lab's people on the bootstrapped lab (issue 35, first half): users and groups from the
inventory become namespaces with GPU quotas, default requests and the edit role there only;
`invoke user-kubeconfig` makes a user's credentials with kubeadm on the control plane; the
REAL kubectl on the lab host, with those credentials, is allowed and refused exactly that;
a GPU pod past the user's quota gets the API server's real "exceeded quota" refusal; a user
removed from the inventory keeps their namespace until `bootstrap --prune`.

What is emulated (tests/lab/standins/k8s/README.md): the API server, which here plays RBAC
with the bootstrap ClusterRoles edit and view, LimitRanger and ResourceQuota admission (quota.py);
kubeadm's `kubeconfig user`. What is real: kubectl, the SSH runs, the cluster CA's openssl."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from gpuk8s import api, day2
from gpuk8s.report import Reporter
from tests.lab import registry
from tests.lab.lab import Lab
from tests.lab.product.runs import derived_inventory
from tests.lab.product.test_bootstrap import GATE_VARS, kubectl_cp
from tests.lab.product.test_day2 import restore_bootstrapped
from tests.lab.repos import real_kubectl

pytestmark = pytest.mark.lab

USERS = {"alice": {"gpu_quota": 2, "groups": ["vision"], "admin": True},
         "bob": {"gpu_quota": 1}}
GROUPS = {"vision": {"gpu_quota": 1, "pods": 10}}


@pytest.fixture(scope="module")
def cluster(lab: Lab) -> Lab:
    registry.push_busybox()
    return restore_bootstrapped(lab)


def inventory(lab: Lab, tmp: Path, users: dict[str, object] = USERS) -> Path:
    return derived_inventory(lab, tmp, feature_gates=GATE_VARS, lab_users=users,
                             lab_groups=GROUPS)


@pytest.fixture(scope="module")
def inv(cluster: Lab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = inventory(cluster, tmp_path_factory.mktemp("tenancy"))
    out = io.StringIO()
    started = time.monotonic()
    api.bootstrap(path, yes=True, reporter=Reporter(out))
    print(f"\nbootstrap with 2 users and 1 group on the bootstrapped lab: "
          f"{time.monotonic() - started:.1f} s")
    return path


def as_user(conf: Path, *args: str, stdin: str | None = None
            ) -> subprocess.CompletedProcess[str]:
    """The REAL kubectl on the lab host with a user's kubeconfig."""
    return subprocess.run([str(real_kubectl()), "--kubeconfig", str(conf), *args],
                          capture_output=True, text=True, input=stdin, timeout=60,
                          env={**os.environ, "HOME": str(conf.parent)}, check=False)


def test_each_user_and_group_has_its_namespace_quota_and_binding(inv: Path,
                                                                 cluster: Lab) -> None:
    quotas = json.loads(kubectl_cp(cluster, "get resourcequota -A -o json"))["items"]
    hard = {q["metadata"]["namespace"]: q["spec"]["hard"] for q in quotas
            if q["metadata"]["name"] == "gpuk8s-quota"}
    assert hard == {"alice": {"requests.nvidia.com/gpu": "2"},
                    "bob": {"requests.nvidia.com/gpu": "1"},
                    "vision": {"requests.nvidia.com/gpu": "1", "pods": "10"}}
    bindings = json.loads(kubectl_cp(cluster, "get rolebinding -A -o json"))["items"]
    subjects = {b["metadata"]["namespace"]: sorted(s["name"] for s in b["subjects"])
                for b in bindings if b["metadata"]["name"] == "gpuk8s-edit"}
    assert subjects == {"alice": ["alice"], "bob": ["bob"], "vision": ["alice"]}
    ns = json.loads(kubectl_cp(cluster, "get namespace alice -o json"))
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    # a second run changes nothing in the tenancy phase
    out = io.StringIO()
    api.plan(inv, reporter=Reporter(out))
    lines = [line for line in out.getvalue().splitlines() if "tenancy |" in line]
    print("\n".join(lines))
    assert len(lines) == 3 and not any("+ " in line for line in lines), lines


def test_user_kubeconfig_allows_edit_in_their_namespaces_only(inv: Path) -> None:
    alice = day2.user_kubeconfig(inv, "alice", reporter=Reporter(io.StringIO()))
    bob = day2.user_kubeconfig(inv, "bob", validity="1h", reporter=Reporter(io.StringIO()))
    assert alice == inv.parent / "artifacts" / "users" / "alice.conf"
    assert stat.S_IMODE(alice.stat().st_mode) == 0o600
    whoami = as_user(alice, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
    assert whoami.returncode == 0 and whoami.stdout == "alice", whoami.stderr
    asked = {("alice", "create pods -n alice"): "yes", ("alice", "create pods -n bob"): "no",
             ("alice", "get nodes"): "no", ("alice", "create pods -n vision"): "yes",
             ("alice", "delete resourcequota/gpuk8s-quota -n alice"): "no",
             ("bob", "create pods -n vision"): "no", ("bob", "create deployments -n bob"): "yes",
             ("bob", "list secrets -n kube-system"): "no"}
    confs = {"alice": alice, "bob": bob}
    got = {(who, what): as_user(confs[who], "auth", "can-i", *what.split()).stdout.strip()
           for who, what in asked}
    assert got == asked
    # the context is the user's own namespace: a bare `kubectl get pods` lists theirs
    r = as_user(bob, "get", "pods")
    assert r.returncode == 0 and "No resources found in bob namespace." in r.stderr, r.stderr
    r = as_user(bob, "get", "pods", "-n", "alice")
    assert r.returncode == 1 and 'User "bob" cannot list resource "pods"' in r.stderr


def gpu_pod(name: str, ns: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": name, "namespace": ns},
                       "spec": {"containers": [{
                           "name": "c", "image": "docker.io/library/busybox:gpuk8s-lab",
                           "command": ["sleep", "3600"],
                           "resources": {"limits": {"nvidia.com/gpu": 1}}}]}})


def test_a_gpu_past_the_users_quota_is_refused_with_the_real_text(inv: Path,
                                                                  cluster: Lab) -> None:
    bob = inv.parent / "artifacts" / "users" / "bob.conf"
    if not bob.exists():
        bob = day2.user_kubeconfig(inv, "bob", reporter=Reporter(io.StringIO()))
    first = as_user(bob, "create", "-f", "-", stdin=gpu_pod("first", "bob"))
    assert first.returncode == 0, first.stderr
    try:
        second = as_user(bob, "create", "-f", "-", stdin=gpu_pod("second", "bob"))
        assert second.returncode == 1
        assert second.stderr.strip() == (
            'Error from server (Forbidden): error when creating "STDIN": pods "second" is '
            "forbidden: exceeded quota: gpuk8s-quota, requested: requests.nvidia.com/gpu=1, "
            "used: requests.nvidia.com/gpu=1, limited: requests.nvidia.com/gpu=1"), second.stderr
        pod = json.loads(as_user(bob, "get", "pod", "first", "-o", "json").stdout)
        # the LimitRange's defaults on a container that named only its GPU
        assert pod["spec"]["containers"][0]["resources"] == {
            "limits": {"nvidia.com/gpu": "1", "memory": "8Gi"},
            "requests": {"nvidia.com/gpu": "1", "cpu": "100m", "memory": "256Mi"}}
    finally:
        as_user(bob, "delete", "pod", "first", "--wait=false")


def test_a_removed_user_is_kept_until_prune(inv: Path, cluster: Lab, tmp_path: Path) -> None:
    without_bob = inventory(cluster, tmp_path, {"alice": USERS["alice"]})
    out = io.StringIO()
    api.bootstrap(without_bob, yes=True, reporter=Reporter(out))
    assert "namespace bob kept: bob is no longer in lab_users or lab_groups" in out.getvalue()
    assert "bob" in kubectl_cp(cluster, "get namespace bob -o name")
    api.bootstrap(without_bob, sets=["tenancy_prune=true"], yes=True,
                  reporter=Reporter(io.StringIO()))
    rc, _, err = cluster.ssh("cp-01", "kubectl --kubeconfig /etc/kubernetes/admin.conf get "
                             "namespace bob")
    assert rc == 1 and 'namespaces "bob" not found' in err
    assert "alice" in kubectl_cp(cluster, "get namespace alice -o name")
