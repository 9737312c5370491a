"""A hostile node and a hostile mirror, on the lab over real SSH, through the real CLI:
a worker whose hostname is a shell payload is refused by preflight, a worker whose os-release
ID is a Jinja expression is refused as an unsupported OS with nothing rendered, a repo whose
key has another fingerprint than the inventory pins is refused before apt uses it, and a
keyring swapped on a node after bootstrap is planned as a change and put back."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab.lab import Lab
from tests.lab.paths import LAB_KEY_FINGERPRINT
from tests.lab.product.runs import Bootstrap, cut_inventory, restore_fresh, ssh_ok
from tests.lab.product.test_day2 import cluster, inv  # noqa: F401 (module fixtures: bootstrapped lab)

pytestmark = pytest.mark.lab

HOSTILE_HOSTNAME = "gpu-01$(touch /tmp/gpuk8s-hostname-ran)"
K8S_KEYRING = "/etc/apt/keyrings/kubernetes-apt-keyring.gpg"
K8S_LIST = "/etc/apt/sources.list.d/kubernetes.list"
#: wide enough that rich's preflight table never wraps or shortens a cell the tests read
WIDE = {"COLUMNS": "400"}
#: the pkgs.k8s.io key, as the real upstream pins it; the lab serves its own key instead
UPSTREAM_K8S_FINGERPRINT = "DE15B14486CD377B9E876E1A234654DA9A296436"


def exists(lab: Lab, node: str, path: str) -> bool:
    rc, _, _ = lab.ssh(node, f"test -e {path}")
    return rc == 0


@pytest.fixture
def hostile_hostname(lab: Lab) -> Iterator[Lab]:
    restore_fresh(lab)
    set_name = ("python3 -c 'import socket, sys; socket.sethostname(sys.argv[1])' "
                "'{}'")
    ssh_ok(lab, "gpu-01", set_name.format(HOSTILE_HOSTNAME))
    assert ssh_ok(lab, "gpu-01", "cat /proc/sys/kernel/hostname").strip() == HOSTILE_HOSTNAME
    yield lab
    ssh_ok(lab, "gpu-01", set_name.format("gpu-01"))


def test_a_hostname_that_is_a_shell_payload_is_refused_by_preflight(
        hostile_hostname: Lab, tmp_path: Path) -> None:
    lab = hostile_hostname
    path = cut_inventory(lab, tmp_path, ("cp-01", "gpu-01"))
    for command in ("plan", "bootstrap"):
        run = Bootstrap(path, tmp_path / "runs", command=command, env=WIDE)
        assert run.finish() != 0, run.stdout[-3000:]
        out = run.stdout + run.stderr
        assert "gpu-01" in out and "hostname" in out
        assert "cannot be a Kubernetes node name" in out and "DNS-1123" in out, out[-3000:]
        assert "nothing was changed" in out
    for node in ("cp-01", "gpu-01"):
        assert not exists(lab, node, "/tmp/gpuk8s-hostname-ran")
        assert not exists(lab, node, K8S_LIST), f"{node} was changed"
    assert not Path("/tmp/gpuk8s-hostname-ran").exists()


@pytest.fixture
def hostile_os_release(lab: Lab, tmp_path: Path) -> Iterator[tuple[Lab, Path]]:
    restore_fresh(lab)
    marker = tmp_path / "rendered-on-the-admin-machine"
    payload = f"{{{{ lipsum.__globals__['os'].popen('touch {marker}').read() }}}}"
    script = shlex.quote(f's|^ID=.*|ID="{payload}"|')
    ssh_ok(lab, "cpu-01", "cp --remove-destination /usr/lib/os-release /etc/os-release && "
           f"sed -i {script} /etc/os-release")
    assert payload in ssh_ok(lab, "cpu-01", "cat /etc/os-release")
    yield lab, marker
    ssh_ok(lab, "cpu-01", "ln -sf ../usr/lib/os-release /etc/os-release")


def test_an_os_release_id_that_is_a_template_is_an_unsupported_os(
        hostile_os_release: tuple[Lab, Path], tmp_path: Path) -> None:
    lab, marker = hostile_os_release
    path = cut_inventory(lab, tmp_path, ("cp-01", "cpu-01"))
    for command in ("plan", "status", "bootstrap"):
        run = Bootstrap(path, tmp_path / "runs", command=command, env=WIDE)
        code = run.finish()
        out = run.stdout + run.stderr
        if command != "status":
            assert code != 0, out[-3000:]
            assert "cpu-01" in out and "unsupported OS: /etc/os-release ID=" in out, out[-3000:]
        assert not marker.exists(), f"{command} rendered the node's os-release"
    assert not exists(lab, "cpu-01", K8S_LIST)


def test_a_key_with_another_fingerprint_is_refused_before_apt_uses_it(lab: Lab,
                                                                       tmp_path: Path) -> None:
    restore_fresh(lab)
    path = cut_inventory(lab, tmp_path, ("cp-01", "cpu-01"),
                         kubernetes_repo_key_fingerprint=UPSTREAM_K8S_FINGERPRINT)
    run = Bootstrap(path, tmp_path / "runs")
    assert run.finish() != 0
    out = run.stdout + run.stderr
    assert f"has fingerprint {LAB_KEY_FINGERPRINT}, expected {UPSTREAM_K8S_FINGERPRINT} " \
        "(kubernetes_repo_key_fingerprint); refusing it" in out, out[-4000:]
    for node in ("cp-01", "cpu-01"):
        # neither the key nor the source reached apt
        assert not exists(lab, node, K8S_KEYRING) and not exists(lab, node, K8S_LIST), node
        # the repos pinned to the lab key were installed
        assert exists(lab, node, "/etc/apt/keyrings/docker.gpg")


def test_a_keyring_swapped_after_bootstrap_is_planned_and_put_back(
        cluster: Lab, inv: Path, tmp_path: Path) -> None:  # noqa: F811
    lab = cluster
    good = ssh_ok(lab, "cpu-01", f"sha256sum {K8S_KEYRING}").split()[0]
    # another signer's key in its place: Debian's archive key, as a local admin might drop in
    ssh_ok(lab, "cpu-01", f"cp /usr/share/keyrings/debian-archive-keyring.gpg {K8S_KEYRING}")
    plan = Bootstrap(inv, tmp_path / "runs", command="plan")
    assert plan.finish() == 0, plan.stderr[-3000:]
    assert "plan: 1 change(s)" in plan.stdout, plan.stdout[-4000:]
    assert f"not the pinned {LAB_KEY_FINGERPRINT[-16:]}: fetch it again" in plan.stdout
    run = Bootstrap(inv, tmp_path / "runs")
    assert run.finish() == 0, run.stdout[-4000:]
    assert ssh_ok(lab, "cpu-01", f"sha256sum {K8S_KEYRING}").split()[0] == good
    again = Bootstrap(inv, tmp_path / "runs", command="plan")
    assert again.finish() == 0 and "plan: 0 change(s)" in again.stdout, again.stdout[-3000:]
