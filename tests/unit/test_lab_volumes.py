"""The lab kubelet's volume mounting (tests/lab/standins/k8s/realpods.py) against a fake node
root: an NFS persistent volume whose export does not exist fails as the real kubelet's mount
does (FailedMount's text), instead of the stand-in making the folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.lab.standins.k8s import realpods
from tests.lab.standins.k8s.client import ApiError


class FakeClient:
    def __init__(self, pv_spec: dict[str, Any]) -> None:
        self.pv_spec = pv_spec

    def get(self, path: str) -> dict[str, Any]:
        if path == "/api/v1/namespaces/ml/persistentvolumeclaims/shared":
            return {"spec": {"volumeName": "ml-shared"}, "status": {"phase": "Bound"}}
        if path == "/api/v1/persistentvolumes/ml-shared":
            return {"spec": self.pv_spec}
        raise ApiError(404, {"message": "not found"})


POD = {"metadata": {"name": "tensorboard-x", "namespace": "ml", "uid": "u-1"}, "spec": {}}
BASE = "/var/lib/kubelet/pods/u-1"
VOLUME = {"name": "shared", "persistentVolumeClaim": {"claimName": "shared"}}


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "root"
    (root / realpods.LAB_NFS_ROOT.lstrip("/")).mkdir(parents=True)
    monkeypatch.setenv("GPUK8S_LAB_ROOT", str(root))
    return root


def test_an_nfs_export_that_does_not_exist_is_the_real_mount_failure(node: Path) -> None:
    spec = {"nfs": {"server": "10.88.0.1", "path": "/srv/missing"},
            "mountOptions": ["nfsvers=4.1", "hard"]}
    resolver = realpods.Resolver(FakeClient(spec), POD)  # type: ignore[arg-type]
    with pytest.raises(realpods.VolumeError) as exc:
        resolver.volume(VOLUME, BASE)
    assert str(exc.value) == (
        'MountVolume.SetUp failed for volume "ml-shared" : mount failed: exit status 32\n'
        "Mounting command: mount\n"
        "Mounting arguments: -t nfs -o nfsvers=4.1,hard 10.88.0.1:/srv/missing "
        "/var/lib/kubelet/pods/u-1/volumes/kubernetes.io~nfs/ml-shared\n"
        "Output: mount.nfs: mounting 10.88.0.1:/srv/missing failed, reason given by server: "
        "No such file or directory\n")
    assert not (node / realpods.LAB_NFS_ROOT.lstrip("/") / "10.88.0.1").exists()
    # the export made (the lab's shared folder S/P): the next try mounts it
    (node / realpods.LAB_NFS_ROOT.lstrip("/") / "10.88.0.1/srv/missing").mkdir(parents=True)
    assert resolver.volume(VOLUME, BASE) == f"{realpods.LAB_NFS_ROOT}/10.88.0.1/srv/missing"


def test_a_host_path_volume_of_a_missing_directory_fails_its_type_check(node: Path) -> None:
    spec = {"hostPath": {"path": "/data/missing", "type": "Directory"}}
    resolver = realpods.Resolver(FakeClient(spec), POD)  # type: ignore[arg-type]
    with pytest.raises(realpods.VolumeError, match=r'^MountVolume.SetUp failed for volume '
                       r'"ml-shared" : hostPath type check failed: /data/missing is not a '
                       r"directory$"):
        resolver.volume(VOLUME, BASE)
