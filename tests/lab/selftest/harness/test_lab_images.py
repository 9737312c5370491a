"""The lab's TensorFlow, CUDA and JupyterHub images (tests/lab/images.py): built once, then
reused from the cache; pushed to the lab registry under the upstream names the workloads pin,
each labelled as a lab image; pulled by a node's real containerd through the lab's
registry_mirrors (hosts.toml for docker.io, nvcr.io and quay.io) and run there: the real
TensorFlow 2.21.0 imports, the CUDA image says what it is, the real JupyterHub 5.5.0,
configurable-http-proxy 5.2.0 and jupyterhub-singleuser answer. What the test adds to the
node's containerd is removed again."""

from __future__ import annotations

import hashlib
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.images import workload_images
from tests.lab import images, registry
from tests.lab.lab import Lab
from tests.lab.product.test_day2 import restore_bootstrapped

pytestmark = pytest.mark.lab

NODE = "gpu-01"
TF_GPU = "docker.io/tensorflow/tensorflow:2.21.0-gpu"
CUDA = "nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04"
HUB = "quay.io/jupyterhub/k8s-hub:4.4.0"
CHP = "quay.io/jupyterhub/configurable-http-proxy:5.2.0"
NOTEBOOK = "quay.io/jupyter/tensorflow-notebook:cuda-tensorflow-2.21.0"
PULLED = {TF_GPU: "gpuk8s-lab-images-tf", CUDA: "gpuk8s-lab-images-cuda",  # ref: container
          HUB: "gpuk8s-lab-images-hub", CHP: "gpuk8s-lab-images-chp",
          NOTEBOOK: "gpuk8s-lab-images-notebook"}
CTR = "ctr -n k8s.io"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def sh(lab: Lab, cmd: str, timeout: int = 120) -> str:
    rc, out, err = lab.ssh(NODE, cmd, timeout=timeout)
    assert rc == 0, f"{NODE}: {cmd}: {out} {err}"
    return out


def fetch(path: str, accept: str = "*/*") -> tuple[bytes, str]:
    """GET from the lab registry's HTTP API: the body and its Docker-Content-Digest."""
    req = urllib.request.Request(f"{registry.URL}{path}", headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read(), resp.headers.get("Docker-Content-Digest", "")


def manifest(ref: str) -> tuple[dict[str, Any], str]:
    repo, tag = images.registry_path(ref)
    body, digest = fetch(f"/v2/{repo}/manifests/{tag}", MANIFEST)
    return json.loads(body), digest


def image_config(ref: str) -> dict[str, Any]:
    repo, _ = images.registry_path(ref)
    body, _ = fetch(f"/v2/{repo}/blobs/{manifest(ref)[0]['config']['digest']}")
    return json.loads(body)


def chain_ids(diff_ids: list[str]) -> list[str]:
    """The image's snapshot keys in containerd (OCI chain ids of its layers)."""
    out = [diff_ids[0]]
    for diff_id in diff_ids[1:]:
        out.append("sha256:" + hashlib.sha256(f"{out[-1]} {diff_id}".encode()).hexdigest())
    return out


def node_list(lab: Lab, what: str) -> set[str]:
    """First column of ``ctr -n k8s.io <what>`` (names or keys, header dropped)."""
    return {line.split()[0] for line in sh(lab, f"{CTR} {what}").splitlines()[1:] if line}


@pytest.fixture(scope="module")
def pushed(lab: Lab) -> dict[str, str]:
    return images.ensure_images()


@pytest.fixture(scope="module")
def node(lab: Lab, pushed: dict[str, str]) -> Iterator[Lab]:
    """gpu-01 with containerd and the lab registry as mirror of docker.io and nvcr.io: the lab
    as it is when it has them (restoring reboots every node), else the bootstrapped snapshot.
    Afterwards the images the tests pulled are removed (forget)."""
    ready = " && ".join(["systemctl is-active -q containerd", *(
        f"grep -qF '[host.\"{registry.URL}\"]' /etc/containerd/certs.d/{host}/hosts.toml"
        for host in ("docker.io", "nvcr.io", "quay.io"))])
    if lab.ssh(NODE, ready)[0] != 0:
        restore_bootstrapped(lab)
    before = node_list(lab, "images ls")
    yield lab
    for container in PULLED.values():  # left by a run cut short (--rm removes it otherwise)
        lab.ssh(NODE, f"{CTR} tasks rm -f {container}; {CTR} containers rm {container}")
    forget(lab, [ref for ref in PULLED if ref not in before])


def forget(lab: Lab, refs: list[str]) -> None:
    """Remove the images ``refs`` and the CRI's ``sha256:<config>`` names of them; check that
    their content and native snapshots went with them."""
    names = {*refs, *(manifest(ref)[0]["config"]["digest"] for ref in refs)}
    left = names & node_list(lab, "images ls")
    if left:
        sh(lab, f"{CTR} images rm --sync {' '.join(sorted(left))}")
    diff_ids = [image_config(ref)["rootfs"]["diff_ids"] for ref in refs]
    snapshots = {key for ids in diff_ids for key in chain_ids(ids)}
    assert not snapshots & node_list(lab, "snapshots --snapshotter native ls")
    assert not {d for ids in diff_ids for d in ids} & node_list(lab, "content ls")


def pull(lab: Lab, ref: str) -> None:
    """Pull through the node's mirror config, unpacked for the native snapshotter (overlayfs
    does not work inside the nspawn nodes). --local: ctr's own pull, as containerd's transfer
    service unpacks for the default snapshotter only."""
    log = Path(registry._paths()["log"])
    seen = log.stat().st_size
    sh(lab, f"{CTR} images pull --local --snapshotter native "
            f"--hosts-dir /etc/containerd/certs.d {ref}", timeout=600)
    # the mirror was asked under the image's path (Docker Hub and nvcr.io are unreachable)
    repo, tag = images.registry_path(ref)
    host = ref.split("/", 1)[0]
    with log.open() as f:
        f.seek(seen)
        assert f"/v2/{repo}/manifests/{tag}?ns={host} " in f.read()


def test_the_workloads_pull_only_lab_images() -> None:
    pinned = {images.qualify(ref) for ref, _ in workload_images()}
    assert pinned <= {image.ref for image in images.IMAGES}


def test_every_image_is_labelled_in_the_registry(pushed: dict[str, str]) -> None:
    assert set(pushed) == {image.ref for image in images.IMAGES}
    for image in images.IMAGES:
        body, digest = manifest(image.ref)
        assert digest == pushed[image.ref]
        text = body["annotations"][images.DESCRIPTION]
        assert text.startswith(registry.LAB_NOTE), text
        assert [x["mediaType"] for x in body["layers"]] == \
            [registry.LAYER_TAR] * len(images.chain(image.top))
        config = image_config(image.ref)["config"]
        assert config["Labels"][images.DESCRIPTION] == text
    assert "no TensorFlow" in image_config("tensorflow/tensorflow:2.20.0")["config"]["Labels"][
        images.DESCRIPTION]
    cuda = image_config(CUDA)["config"]["Env"]
    assert {"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
            "CUDA_VERSION=13.0.1"} <= set(cuda)
    jupyter = image_config("tensorflow/tensorflow:2.21.0-gpu-jupyter")["config"]
    assert "jupyter notebook --notebook-dir=/tf --ip 0.0.0.0" in jupyter["Cmd"][-1]
    # the same layers under both TensorFlow 2.21.0 tags
    assert manifest(TF_GPU)[0]["layers"] == \
        manifest("tensorflow/tensorflow:2.21.0")[0]["layers"]
    # the JupyterHub images: upstream's config where the chart and KubeSpawner rely on it
    hub = image_config(HUB)["config"]
    assert (hub["User"], hub["WorkingDir"], list(hub["ExposedPorts"])) == \
        ("1000:1000", "/srv/jupyterhub", ["8081/tcp"])
    assert hub["Cmd"] == ["jupyterhub", "--config",
                          "/usr/local/etc/jupyterhub/jupyterhub_config.py"]
    chp = image_config(CHP)["config"]
    assert (chp["User"], chp["Entrypoint"], sorted(chp["ExposedPorts"])) == \
        ("65534", ["configurable-http-proxy"], ["8000/tcp", "8001/tcp"])
    notebook = image_config(NOTEBOOK)["config"]
    assert (notebook["User"], notebook["WorkingDir"], notebook["Entrypoint"],
            notebook["Cmd"]) == ("1000:100", "/home/jovyan", ["/usr/local/bin/start.sh"],
                                 ["start-notebook.py"])
    assert {"HOME=/home/jovyan", "JUPYTER_PORT=8888", "NVIDIA_VISIBLE_DEVICES=all",
            "NVIDIA_DRIVER_CAPABILITIES=compute,utility"} <= set(notebook["Env"])
    # the notebook image is the -gpu-jupyter image's layers and one more
    assert manifest(NOTEBOOK)[0]["layers"][:-1] == \
        manifest("tensorflow/tensorflow:2.21.0-gpu-jupyter")[0]["layers"]


def test_a_second_ensure_comes_from_the_cache(pushed: dict[str, str]) -> None:
    t0 = time.monotonic()
    assert images.ensure_images() == pushed
    assert time.monotonic() - t0 < 30


def test_the_real_tensorflow_runs_in_the_node(node: Lab) -> None:
    pull(node, TF_GPU)
    out = sh(node, f"{CTR} run --snapshotter native --rm {TF_GPU} {PULLED[TF_GPU]} "
                   "python3 -c 'import tensorflow as tf; print(tf.__version__)'", timeout=300)
    assert out.strip() == "2.21.0"


def test_the_cuda_image_says_it_is_a_lab_image(node: Lab) -> None:
    pull(node, CUDA)
    out = sh(node, f"{CTR} run --snapshotter native --rm {CUDA} {PULLED[CUDA]} "
                   "cat /etc/gpuk8s-lab-image")
    assert out.splitlines()[0] == registry.LAB_NOTE
    assert "PyPI packages: none" in out


@pytest.mark.parametrize(("ref", "argv"), [
    (HUB, "jupyterhub --version"),
    (CHP, "configurable-http-proxy --version"),
    # as KubeSpawner starts it: the image's entrypoint, then the container's args
    (NOTEBOOK, "/usr/local/bin/start.sh jupyterhub-singleuser --version"),
], ids=["hub", "chp", "notebook"])
def test_the_jupyterhub_images_run_in_the_node(node: Lab, ref: str, argv: str) -> None:
    pull(node, ref)
    out = sh(node, f"{CTR} run --snapshotter native --rm {ref} {PULLED[ref]} {argv}",
             timeout=300)
    assert out.strip().splitlines()[-1] == {HUB: "5.5.0", CHP: "5.2.0", NOTEBOOK: "5.5.0"}[ref]
