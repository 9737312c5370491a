"""invoke restore's refusals (a backup of another cluster, of a newer Kubernetes, without a
version) and the script that swaps etcd's data, read as the shell reads it."""

from __future__ import annotations

import subprocess

import pytest

from gpuk8s import cli
from gpuk8s.day2.restore import refusals, still_serving, swap_script

CA = "ab" * 32
MANIFEST = {"kubernetes_version": "v1.36.2", "ca_sha256": CA}


def test_a_backup_of_this_cluster_and_release_is_accepted() -> None:
    assert refusals(MANIFEST, "1.36", {"cp-01": CA, "gpu-01": CA}) == []
    assert refusals(MANIFEST, "1.36.2", {}) == []      # a wiped cluster trusts no CA yet
    assert refusals(MANIFEST, "1.37", {"gpu-01": CA}) == []


@pytest.mark.parametrize("ours", ["1.35", "1.36.1", "v1.35.9"])
def test_a_backup_of_a_newer_kubernetes_is_refused(ours: str) -> None:
    [why] = refusals(MANIFEST, ours, {"gpu-01": CA})
    assert why.startswith("the backup was taken on Kubernetes v1.36.2, newer than the "
                          f"{ours} this inventory installs"), why
    assert "restore an older backup" in why


def test_a_backup_of_another_cluster_names_the_nodes_that_trust_another_ca() -> None:
    [why] = refusals(MANIFEST, "1.36", {"cp-01": CA, "gpu-01": "cd" * 32, "gpu-02": "cd" * 32})
    assert "is not the CA gpu-01, gpu-02 trust(s) (cdcdcdcdcdcdcdcd...)" in why, why
    assert "another cluster's backup" in why


def test_a_backup_without_a_version_and_of_another_cluster_says_both() -> None:
    why = refusals({"ca_sha256": CA}, "1.36", {"gpu-01": "cd" * 32})
    assert len(why) == 2 and "names no Kubernetes version" in why[0]


def test_the_swap_script_parses_and_keeps_the_old_data() -> None:
    script = swap_script("/var/lib/etcd")
    assert subprocess.run(["sh", "-n"], input=script, text=True).returncode == 0
    # an etcd image without etcdutl (before 3.6.6) is named before anything changes
    assert script.index('etcdutl version') < script.index("snapshot restore")
    assert "etcdutl snapshot restore /var/lib/etcd/gpuk8s-restore.db --data-dir " \
        "/var/lib/etcd/gpuk8s-restored" in script
    # the old member is moved aside, never removed; the manifests go back on any exit
    assert 'mv /var/lib/etcd/member "$before"' in script and "rm -rf /var/lib/etcd/member" \
        not in script
    assert script.index("trap back EXIT") < script.index('mv "$f" "$d"/')


def test_restore_without_from_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["restore", "-i", "x"]) == 2
    assert "--from DIR" in capsys.readouterr().err


def test_a_lost_first_control_plane_is_not_rebuilt_over_live_members() -> None:
    assert still_serving("cp-01", {}) == ""
    assert still_serving("cp-01", {"cp-02": False, "cp-03": None}) == ""  # quorum lost
    why = still_serving("cp-01", {"cp-02": True, "cp-03": False})
    assert why.startswith("cp-01 is lost, but the etcd members of cp-02 are healthy"), why
    assert "list cp-02 first under control_plane" in why
