"""invoke images: every image the cluster and the workloads pull, from the very manifests and
values gpuk8s applies, at the inventory's versions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuk8s import cli
from gpuk8s import images as images_module
from gpuk8s.checks import check_image_ref
from gpuk8s.errors import Gpuk8sError
from gpuk8s.images import images, registry_of

LAB = Path(__file__).resolve().parents[2] / "inventories" / "lab.yaml"


def by_image(**kw: object) -> dict[str, list[str]]:
    return {r["image"]: r["used_by"] for r in images(LAB, **kw)}  # type: ignore[arg-type]


def test_flannel_cluster_and_workloads() -> None:
    got = by_image(sets=["kubernetes_package_version=1.36.2-1.1"])
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"):
        assert f"registry.k8s.io/{name}:v1.36.2" in got
    assert "registry.k8s.io/coredns/coredns:v1.14.2" in got
    assert "registry.k8s.io/etcd:3.6.8-0" in got
    # containerd's sandbox is the pause kubeadm expects for the minor
    assert got["registry.k8s.io/pause:3.10.2"] == ["kubeadm (control plane, every node)",
                                                   "containerd (pod sandbox)"]
    assert "ghcr.io/flannel-io/flannel:v0.28.9" in got
    assert "nvcr.io/nvidia/k8s-device-plugin:v0.20.0" in got
    assert "invoke deploy distributed-tf" in got["tensorflow/tensorflow:2.21.0-gpu"]
    assert got["nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04"] == ["invoke verify"]
    assert got["tensorflow/tensorflow:2.21.0-gpu-jupyter"] == ["invoke deploy jupyter"]


def test_calico_other_minor_and_workload_values() -> None:
    got = by_image(sets=["cni=calico", "kubernetes_version=1.35", "calico_registry=quay.io"],
                   values_files=())
    assert "quay.io/calico/node:v3.32.1" in got and not any("flannel" in i for i in got)
    assert "registry.k8s.io/kube-apiserver:v1.35.<patch>" in got
    assert "registry.k8s.io/pause:3.10.1" in got


def test_values_files_change_workload_images(tmp_path: Path) -> None:
    values = tmp_path / "v.yaml"
    values.write_text("images:\n  tensorflow: reg.lab/tf:1\n")
    got = by_image(values_files=[str(values)])
    assert "reg.lab/tf:1" in got and "tensorflow/tensorflow:2.21.0-gpu" not in got


@pytest.mark.parametrize("image, registry", [
    ("tensorflow/tensorflow:2.21.0", "docker.io"), ("busybox", "docker.io"),
    ("nvcr.io/nvidia/cuda:13", "nvcr.io"), ("10.0.0.5:5000/x:1", "10.0.0.5:5000"),
    ("localhost/x", "localhost")])
def test_registry_of(image: str, registry: str) -> None:
    assert registry_of(image) == registry


def test_cli_list_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["images", "-i", str(LAB), "-o", "list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert "ghcr.io/flannel-io/flannel:v0.28.9" in listed and len(listed) == len(set(listed))
    assert cli.main(["images", "-i", str(LAB), "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["image"] for r in rows} == set(listed)


# -- inventory text never reaches the terminal raw (review 2, L9) -------------------------------

HOSTILE = "reg/pause:3\x1b]0;owned\x07\nghcr.io/evil/extra:1"


def test_sandbox_image_is_checked_as_an_image_reference() -> None:
    with pytest.raises(Gpuk8sError) as err:
        images(LAB, sets=[f"containerd_sandbox_image={HOSTILE}"])
    text = str(err.value)
    assert "containerd_sandbox_image must be an image reference" in text
    assert 'registry.k8s.io/pause:3.10' in text and "\x1b" not in text
    for good in ("", "registry.k8s.io/pause:3.10", "10.0.0.5:5000/pause:3.10",
                 "localhost:5000/library/pause@sha256:" + "a" * 64, "pause"):
        assert check_image_ref("containerd_sandbox_image", good) is None, good
    for bad in ("Reg/Pause:3", "reg/pause:3 ", "reg/pause:3;id", "-reg/pause", "reg//pause",
                "reg/pause:", "reg/pause@sha256:abc", "$(id)/pause"):
        assert check_image_ref("containerd_sandbox_image", bad) is not None, bad
    listed = {r["image"] for r in images(LAB, sets=["containerd_sandbox_image=10.0.0.5:5000/"
                                                    "pause:3.10"])}
    assert "10.0.0.5:5000/pause:3.10" in listed


@pytest.mark.parametrize("output", ["list", "table"])
def test_every_printed_row_is_escaped_and_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], output: str) -> None:
    """Whatever reaches print_images (a rule missed, a new image source): no escape sequence
    reaches the terminal, and the list a mirroring tool reads gains no line."""
    rows = [{"image": HOSTILE, "registry": "docker.io", "used_by": ["x\x1b[2Jy"]},
            {"image": "nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04", "registry": "nvcr.io",
             "used_by": ["verify"]}]
    monkeypatch.setattr(images_module, "images", lambda *a, **kw: rows)
    images_module.print_images(LAB, output=output)
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    lines = out.splitlines()
    body = lines if output == "list" else lines[1:]
    assert len(body) == 2
    assert body[0].startswith("reg/pause:3\\x1b]0;owned\\x07\\nghcr.io/evil/extra:1")
    assert not [line for line in lines if line.startswith("ghcr.io/evil")]
