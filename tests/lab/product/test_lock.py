"""`invoke lock` on the lab: the lab's nodes (their facts, read as plan reads them), the lab's
signed apt repositories over http (checked with gpgv against the pinned lab key) and the real
registry (Debian's docker-registry 2.8.2). What the lock pins is checked against what those
serve, byte for byte: the SHA256 of each .deb file in the repositories, the digest the lab
pushed for the TensorFlow image. The cluster's own images (kube-apiserver, flannel, the device
plugin...), which the lab's stand-ins play, are LAB placeholders pushed for this test
(registry.push_placeholder): an OCI index per image, two platforms each."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s import api
from gpuk8s.errors import PlanError
from gpuk8s.images import cluster_images
from gpuk8s.inventory import load_inventory
from gpuk8s.lock import lock, render
from gpuk8s.lock.aptindex import LockError
from gpuk8s.lock.bundle import check_sums, cluster_bundle
from gpuk8s.lock.debversion import version_key
from gpuk8s.lock.serve import prepare
from gpuk8s.report import Reporter
from gpuk8s.session import role_vars
from tests.lab import images, registry, repos
from tests.lab.lab import Lab
from tests.lab.product.runs import derived_inventory
from tests.lab.product.test_bootstrap import GATE_VARS
from tests.lab.product.test_day2 import restore_bootstrapped

pytestmark = pytest.mark.lab

PACKAGES = Path(__file__).resolve().parents[1] / "packages"
TF = "tensorflow/tensorflow:2.21.0-gpu"
SETS = ['lock_workloads=["tensorflow-job"]']
#: the driver's packages as the lab's nodes get them (the open flavour: H100 and H200)
DRIVER = {"nvidia-open-580", "nvidia-kernel-open-dkms", "nvidia-driver-cuda",
          "cuda-drivers-580", "nvidia-kernel-dkms", "nvidia-fabricmanager"}


def newest(name: str, prefix: str) -> str:
    spec = yaml.safe_load((PACKAGES / "k8s" / f"{name}.yaml").read_text())
    return sorted((v for v in spec["versions"] if v.startswith(prefix)), key=version_key)[-1]


@pytest.fixture(scope="module")
def lab_images(lab: Lab) -> dict[str, str]:
    """The TensorFlow lab image (real TensorFlow) and a placeholder for each cluster image at
    the Kubernetes patch the lab's repository offers: image -> the digest pushed. The lab is
    the bootstrapped one (its nodes' apt sources as the lab's inventory says)."""
    restore_bootstrapped(lab)
    registry.start()
    pushed = {TF: images.ensure_images([TF])[images.qualify(TF)]}
    vars = dict(role_vars(load_inventory(lab.inventory_path).control_planes[0]))
    vars["kubernetes_package_version"] = newest("kubeadm", "1.36.")
    for image, _ in cluster_images(vars):
        pushed[image] = registry.push_placeholder(image)
    return pushed


@pytest.fixture(scope="module")
def first(lab: Lab, lab_images: dict[str, str], tmp_path_factory: pytest.TempPathFactory
          ) -> Path:
    out = tmp_path_factory.mktemp("lock") / "first.lock"
    lock(lab.inventory_path, output=out, sets=SETS)
    return out


def test_the_lock_pins_what_the_repositories_and_the_registry_serve(
        first: Path, lab_images: dict[str, str]) -> None:
    data = yaml.safe_load(first.read_text())
    assert first.read_text().startswith("# gpuk8s.lock")
    releases = data["apt"]["releases"]
    assert list(releases) == ["debian-12-amd64"], "the lab's nodes are Debian 12 on amd64"
    release = releases["debian-12-amd64"]
    assert release["hosts"] == ["cp-01", "cpu-01", "gpu-01", "gpu-02"]
    pkgs: dict[str, Any] = release["packages"]
    assert pkgs["kubeadm"]["version"] == newest("kubeadm", "1.36.")
    assert pkgs["kubelet"]["version"] == newest("kubelet", "1.36.")
    # the dependencies the sources carry come along, pinned (kubeadm needs cri-tools)
    assert {"cri-tools", "kubernetes-cni", "nvidia-open-580", "nvidia-container-toolkit",
            "containerd.io"} <= set(pkgs)
    # the OS archive's part, as the nodes' own apt would fetch it (from Debian, through the
    # lab's apt-cacher-ng): curl and conntrack for base, what they need, each with its SHA256
    os_pkgs = release["os_archive"]
    assert {"curl", "conntrack", "libcurl4"} <= set(os_pkgs), sorted(os_pkgs)
    assert all(re.fullmatch(r"[0-9a-f]{64}", p["sha256"]) and
               p["url"].startswith("http://deb.debian.org/") for p in os_pkgs.values())
    assert not set(os_pkgs) & set(pkgs), "gpuk8s's sources' packages are pinned once"
    # every pin is the very file the repository serves
    sources = release["sources"]
    for name, pkg in pkgs.items():
        # a Filename is relative to the URL (flat) or to the archive root (dists/): both
        # the URL here
        path = urllib.parse.urlsplit(sources[pkg["source"]]["url"]).path.strip("/")
        deb = repos.www_root() / path / pkg["filename"]
        assert deb.is_file(), f"{name}: {deb}"
        assert hashlib.sha256(deb.read_bytes()).hexdigest() == pkg["sha256"], name
        assert deb.stat().st_size == pkg["size"], name
    assert {s["key_fingerprint"] for s in sources.values()} == {
        "4DB64E86A138065762E9BAA291D795CA270F06CD"}
    # images: the digests the lab pushed, each platform of the placeholders' indexes
    locked = data["images"]
    assert locked[TF]["digest"] == lab_images[TF]
    assert "platforms" not in locked[TF], "the lab's TensorFlow image is one manifest"
    api = f"registry.k8s.io/kube-apiserver:v{newest('kubeadm', '1.36.').split('-')[0]}"
    assert locked[api]["digest"] == lab_images[api]
    assert sorted(locked[api]["platforms"]) == ["linux/amd64", "linux/arm64"]
    assert set(lab_images) == set(locked)


def test_a_second_lock_with_nothing_changed_writes_the_same_bytes(lab: Lab, first: Path
                                                                   ) -> None:
    again = first.with_name("again.lock")
    lock(lab.inventory_path, output=again, sets=SETS)
    assert again.read_bytes() == first.read_bytes()


def test_another_driver_version_changes_only_the_driver_s_lines(lab: Lab, first: Path) -> None:
    other = first.with_name("driver.lock")
    before = yaml.safe_load(first.read_text())
    older = sorted(yaml.safe_load((PACKAGES / "nvidia" / "nvidia-open-580.yaml").read_text())
                   ["versions"], key=version_key)[0]
    lock(lab.inventory_path, output=other, sets=[*SETS, f"nvidia_driver_version="
                                                       f"{older.split('-')[0]}"])
    after = yaml.safe_load(other.read_text())
    a = before["apt"]["releases"]["debian-12-amd64"]["packages"]
    b = after["apt"]["releases"]["debian-12-amd64"]["packages"]
    changed = {n for n in a.keys() | b.keys() if a.get(n) != b.get(n)}
    assert changed and changed <= DRIVER, changed
    assert b["nvidia-open-580"]["version"] == older
    assert after["images"] == before["images"]


def test_a_key_that_is_not_the_pinned_one_stops_the_lock_and_keeps_the_old_file(
        lab: Lab, first: Path) -> None:
    kept = first.read_bytes()
    wrong = "0123456789ABCDEF0123456789ABCDEF01234567"
    with pytest.raises(LockError, match=f"not the pinned {wrong}"):
        lock(lab.inventory_path, output=first,
             sets=[*SETS, f"kubernetes_repo_key_fingerprint={wrong}"])
    assert first.read_bytes() == kept


# -- bootstrap with the lock -------------------------------------------------------------------
@pytest.fixture(scope="module")
def locked_cluster(lab: Lab, lab_images: dict[str, str], tmp_path_factory: pytest.TempPathFactory
                   ) -> Path:
    """The bootstrapped lab, its inventory (with the snapshot's feature gates) in a folder of
    its own, and that inventory's lock beside it: what `invoke lock -i INV` writes."""
    restore_bootstrapped(lab)
    inv = derived_inventory(lab, tmp_path_factory.mktemp("locked"), feature_gates=GATE_VARS,
                            lock_workloads=["tensorflow-job"])
    assert lock(inv) == inv.with_name("inventory.gpuk8s.lock")
    return inv


def plan_text(inv: Path, limit: str | None = None) -> tuple[dict[str, Any], str]:
    out = io.StringIO()
    result = api.plan(inv, limit=limit, reporter=Reporter(out))
    return result, out.getvalue()


def test_a_cluster_at_the_lock_s_pins_has_nothing_to_change(locked_cluster: Path) -> None:
    result, text = plan_text(locked_cluster)
    assert "lock: installing the versions inventory.gpuk8s.lock pins" in text
    assert result["planned"] == 0, text
    kube = [line for line in text.splitlines() if "kubernetes | packages" in line]
    assert len(kube) == 4 and all("(as the lock pins)" in line for line in kube), kube


def test_plan_names_the_drift_and_bootstrap_installs_exactly_the_pins(
        lab: Lab, locked_cluster: Path) -> None:
    """The lock made before 1.36.2 was published (its kube packages put back to 1.36.1-1.1,
    as real 1.36.1 files the repository also serves): plan names every node's drift, and
    bootstrap installs 1.36.1-1.1 although the repository's newest 1.36 is 1.36.2-1.1."""
    path = locked_cluster.with_name("inventory.gpuk8s.lock")
    data = yaml.safe_load(path.read_text())
    pkgs = data["apt"]["releases"]["debian-12-amd64"]["packages"]
    old = "1.36.1-1.1"
    assert newest("kubeadm", "1.36.") != old
    for name in ("kubeadm", "kubelet", "kubectl"):
        pkgs[name]["version"] = old
        pkgs[name]["filename"] = f"./{name}_{old}_amd64.deb"
    path.write_text(render(data))
    _, text = plan_text(locked_cluster)
    kube = [line for line in text.splitlines() if "kubernetes | packages" in line]
    assert len(kube) == 4, text
    for line in kube:
        assert f"+ install kubeadm={old}, kubelet={old}, kubectl={old}" in line, line
        assert f"(pinned by inventory.gpuk8s.lock; the node has kubeadm " \
               f"{newest('kubeadm', '1.36.')}" in line, line
    api.bootstrap(locked_cluster, limit="cpu-01", yes=True, reporter=Reporter(io.StringIO()))
    rc, out, err = lab.ssh("cpu-01", "dpkg-query -W -f '${Package} ${Version}\\n' kubeadm "
                                     "kubelet kubectl cri-tools; apt-mark showhold")
    assert rc == 0, err
    assert out.startswith(f"cri-tools {pkgs['cri-tools']['version']}\nkubeadm {old}\n"
                          f"kubectl {old}\nkubelet {old}\n"), out
    assert {"kubeadm", "kubelet", "kubectl"} <= set(out.split()), "held at the pins"
    again, text = plan_text(locked_cluster, limit="cpu-01")
    assert again["planned"] == 0, text


def test_a_lock_older_than_the_inventory_stops_bootstrap_before_any_change(
        locked_cluster: Path) -> None:
    newer = derived_inventory_like(locked_cluster, kubernetes_package_version="1.36.2-1.1")
    with pytest.raises(PlanError, match=r"pins kubeadm 1\.36\.1-1\.1 for debian-12-amd64, but "
                                        r"the inventory asks for '1\.36\.2-1\.1'"):
        api.bootstrap(newer, yes=True, reporter=Reporter(io.StringIO()))


def derived_inventory_like(inv: Path, **variables: Any) -> Path:
    """``inv`` with extra variables, in the same folder (so the same lock lies beside it)."""
    data = yaml.safe_load(inv.read_text())
    data["all"]["vars"].update(variables)
    out = inv.with_name("newer.yaml")
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    out.with_name("newer.gpuk8s.lock").write_text(
        inv.with_name("inventory.gpuk8s.lock").read_text())
    return out


# -- invoke bundle --cluster -------------------------------------------------------------------
@pytest.fixture(scope="module")
def bundled(lab: Lab, first: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cluster part of a bundle made from the first lock (beside a copy of the lab's
    inventory): every .deb from the lab's repositories and Debian (through the lab's
    apt-cacher-ng, as the nodes fetch it), every image from the lab's registry."""
    top = tmp_path_factory.mktemp("bundle")
    inv = top / "inventory.yaml"
    inv.write_text(lab.inventory_path.read_text())
    inv.with_name("inventory.gpuk8s.lock").write_text(first.read_text())
    cluster_bundle(inv, top / "out")
    return top / "out" / "cluster"


def test_the_bundle_holds_every_locked_file_checked(bundled: Path, first: Path) -> None:
    lock_data = yaml.safe_load(first.read_text())
    release = lock_data["apt"]["releases"]["debian-12-amd64"]
    debs = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in (bundled / "debs").iterdir()}
    want = {p["sha256"] for p in [*release["packages"].values(),
                                  *release["os_archive"].values()]}
    assert set(debs.values()) == want
    # coreutils' own check of the manifest, and gpuk8s's (which also refuses extra files)
    check = subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=bundled,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check_sums(bundled) == len((bundled / "SHA256SUMS").read_text().splitlines())
    layout = json.loads((bundled / "images" / "index.json").read_text())
    names = {m["annotations"]["org.opencontainers.image.ref.name"]: m["digest"]
             for m in layout["manifests"]}
    assert names == {i: e["digest"] for i, e in lock_data["images"].items()}
    for digest in names.values():  # each index/manifest, and what it names, is in blobs/
        assert (bundled / "images" / "blobs" / "sha256" / digest[7:]).is_file()


def test_a_tampered_deb_or_layer_is_refused_with_its_checksum_named(bundled: Path,
                                                                     tmp_path: Path) -> None:
    for pick in ("debs", "images/blobs/sha256"):
        copy = tmp_path / pick.replace("/", "-")
        shutil.copytree(bundled, copy, copy_function=os.link)  # links: 2 GB not copied
        victim = max((copy / pick).iterdir(), key=lambda p: p.stat().st_size)
        victim.unlink()  # the one file changed, a copy of its own
        shutil.copyfile(bundled / victim.relative_to(copy), victim)
        with victim.open("r+b") as fh:
            fh.seek(victim.stat().st_size // 2)
            byte = fh.read(1)
            fh.seek(-1, 1)
            fh.write(bytes([byte[0] ^ 1]))
        rel = victim.relative_to(copy).as_posix()
        listed = next(line.split()[0] for line in (copy / "SHA256SUMS").read_text()
                      .splitlines() if line.endswith("  " + rel))
        # serve-bundle checks before it builds or serves anything
        with pytest.raises(LockError, match=f"{re.escape(rel)}: SHA256 [0-9a-f]{{64}} is not "
                                            f"the {listed} SHA256SUMS lists"):
            prepare(copy, listen="127.0.0.1", state=tmp_path / "state")
        assert not (tmp_path / "state" / "www").exists()


def test_an_edited_lock_cannot_smuggle_a_deb_into_the_bundle(lab: Lab, first: Path,
                                                             tmp_path: Path) -> None:
    data = yaml.safe_load(first.read_text())
    pkg = data["apt"]["releases"]["debian-12-amd64"]["packages"]["kubeadm"]
    pkg["sha256"] = hashlib.sha256(b"not kubeadm").hexdigest()
    inv = tmp_path / "inventory.yaml"
    inv.write_text(lab.inventory_path.read_text())
    inv.with_name("inventory.gpuk8s.lock").write_text(render(data))
    with pytest.raises(LockError, match=r"pins kubeadm .* which apt source kubernetes's signed "
                                        r"index does not list"):
        cluster_bundle(inv, tmp_path / "out")
    assert not list((tmp_path / "out" / "cluster" / "debs").glob("*.deb"))
