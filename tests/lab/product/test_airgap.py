"""An air-gapped lab (issue #36's acceptance): fresh nodes whose egress the test drops in their
network namespaces, but to the admin machine's bundle server (two ports of the lab host), are
bootstrapped from a lock and its bundle, then run the TensorFlow job from an image pulled by
its digest from the bundle; the lab's apt-cacher-ng and registry, which the lab's nodes use
otherwise, see not one request from them.

The real programs: the nodes' apt (https, the bundle's CA, the bundle's signing key), their
containerd pulling through hosts.toml, Debian's docker-registry serving the bundle read-only
over TLS, apt-ftparchive and gpg making the repositories, TensorFlow in the job. The cluster's
own images are LAB placeholders (registry.push_placeholder), as in test_lock."""

from __future__ import annotations

import io
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s import api, workloads
from gpuk8s.images import cluster_images
from gpuk8s.inventory import load_inventory
from gpuk8s.lock import lock
from gpuk8s.lock.bundle import cluster_bundle
from gpuk8s.lock.serve import prepare, serve, snippet
from gpuk8s.report import Reporter
from gpuk8s.session import role_vars
from tests.lab import images, registry
from tests.lab.lab import Lab
from tests.lab.net import _acng_paths, netns_name
from tests.lab.paths import HOST_IP, node_ip, services_dir, shared_dir
from tests.lab.product.runs import derived_inventory, restore_fresh
from tests.lab.product.test_lock import TF, newest
from tests.tfenv import DIGITS_AS_MNIST

pytestmark = pytest.mark.lab

NODES = ("cp-01", "gpu-01", "gpu-02", "cpu-01")
APT_PORT, REGISTRY_PORT = 18443, 15443
CHAIN = "GPUK8S-AIRGAP"
SHARE = Path(HOST_IP) / "srv" / "gpuk8s"


def _ns(node: str, *cmd: str) -> None:
    subprocess.run(["ip", "netns", "exec", netns_name(node), *cmd], check=True,
                   capture_output=True)


def isolate(node: str) -> None:
    """Drop the node's egress but to the bundle server's two ports and the lab's other nodes
    (answers to the admin machine's SSH are replies, kept)."""
    ipt = ("iptables", "-w")
    _ns(node, *ipt, "-N", CHAIN)
    for rule in (["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"],
                 ["-o", "lo", "-j", "RETURN"],
                 ["-d", HOST_IP, "-p", "tcp", "-m", "multiport", "--dports",
                  f"{APT_PORT},{REGISTRY_PORT}", "-j", "RETURN"],
                 ["-d", HOST_IP, "-j", "REJECT"],
                 ["-d", "10.0.0.0/8", "-j", "RETURN"],
                 ["-j", "REJECT"]):
        _ns(node, *ipt, "-A", CHAIN, *rule)
    for chain in ("OUTPUT", "FORWARD"):
        _ns(node, *ipt, "-I", chain, "1", "-j", CHAIN)


def release(node: str) -> None:
    for cmd in (["-D", "OUTPUT", "-j", CHAIN], ["-D", "FORWARD", "-j", CHAIN],
                ["-F", CHAIN], ["-X", CHAIN]):
        subprocess.run(["ip", "netns", "exec", netns_name(node), "iptables", "-w", *cmd],
                       capture_output=True)


def requests_from(path: Path, since: int, addresses: set[str]) -> list[str]:
    """The lines a log gained since byte ``since`` that name one of ``addresses``."""
    if not path.exists():
        return []
    with path.open("rb") as fh:
        fh.seek(since)
        text = fh.read().decode("utf-8", "replace")
    return [line for line in text.splitlines()
            if any(f"|{a}|" in line or line.startswith(f"{a} ") for a in addresses)]


@pytest.fixture(scope="module")
def airgap(lab: Lab, tf_venv: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[dict[str, Any]]:
    top = tmp_path_factory.mktemp("airgap")
    restore_fresh(lab)
    # the connected side: lock the fresh cluster, bundle what the lock names
    registry.start()
    images.ensure_images([TF])
    vars = dict(role_vars(load_inventory(lab.inventory_path).control_planes[0]))
    vars["kubernetes_package_version"] = newest("kubeadm", "1.36.")
    for image, _ in cluster_images(vars):
        registry.push_placeholder(image)
    connected = derived_inventory(lab, top / "connected", lock_workloads=["tensorflow-job"])
    lock(connected)
    cluster_bundle(connected, top / "bundle")
    # the admin machine's side: serve it
    served = prepare(top / "bundle", listen=HOST_IP, apt_port=APT_PORT,
                     registry_port=REGISTRY_PORT, state=top / "state")
    stop = threading.Event()
    out = io.StringIO()
    server = threading.Thread(target=serve, args=(served,), kwargs={"out": out, "stop": stop},
                              daemon=True)
    server.start()
    # the air-gapped inventory: the printed lines, no apt proxy, the same lock beside it
    lines = yaml.safe_load(snippet(served, yaml.safe_load(
        connected.with_name("inventory.gpuk8s.lock").read_text())))
    gapped = derived_inventory(lab, top / "gapped", apt_proxy="",
                               lock_workloads=["tensorflow-job"], **lines)
    gapped.with_name("inventory.gpuk8s.lock").write_text(
        connected.with_name("inventory.gpuk8s.lock").read_text())
    data = shared_dir() / SHARE / "data" / "mnist.npz"
    data.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(tf_venv / "bin" / "python"), "-c", DIGITS_AS_MNIST, str(data)],
                   check=True)
    logs = {"apt-cacher-ng": _acng_paths()["logs"] / "apt-cacher.log",
            "registry": services_dir() / "registry" / "registry.log"}
    marks = {k: p.stat().st_size if p.exists() else 0 for k, p in logs.items()}
    for node in NODES:
        isolate(node)
    try:
        yield {"inventory": gapped, "state": top / "state", "logs": logs, "marks": marks,
               "lock": yaml.safe_load(gapped.with_name("inventory.gpuk8s.lock").read_text()),
               "printed": out}
    finally:
        for node in NODES:
            release(node)
        stop.set()
        server.join(timeout=60)


def test_bootstrap_from_the_lock_and_the_bundle_with_no_other_egress(airgap: dict[str, Any],
                                                                      lab: Lab) -> None:
    # the nodes reach nothing else: not the lab's package cache, not Debian
    rc, out, _ = lab.ssh("cpu-01", "curl -sS -m 5 -o /dev/null http://10.88.0.1:3142/ "
                                   "&& echo reached || echo refused")
    assert out.strip().endswith("refused"), out
    result = api.bootstrap(airgap["inventory"], yes=True, reporter=Reporter(io.StringIO()))
    assert result["changed"] > 0
    pinned = airgap["lock"]["apt"]["releases"]["debian-12-amd64"]["packages"]
    rc, out, err = lab.ssh("cp-01", "dpkg-query -W -f '${Package} ${Version}\\n' kubeadm "
                                    "kubelet containerd.io; ls /etc/apt/sources.list*")
    assert rc == 0, err
    for name in ("kubeadm", "kubelet", "containerd.io"):
        assert f"{name} {pinned[name]['version']}" in out, out
    assert "/etc/apt/sources.list.gpuk8s-off" in out
    again = api.plan(airgap["inventory"], reporter=Reporter(io.StringIO()))
    assert again["planned"] == 0


def test_the_tensorflow_job_pulls_by_digest_from_the_bundle_and_trains(
        airgap: dict[str, Any], lab: Lab) -> None:
    inv = airgap["inventory"]
    out = io.StringIO()
    workloads.deploy(inv, "storage", sets=["nfs.server=" + HOST_IP, "nfs.path=/srv/gpuk8s"],
                     reporter=Reporter(out))
    result = workloads.deploy(inv, "tensorflow-job",
                              sets=["epochs=1", "batchSize=32", "cpu=500m"],
                              reporter=Reporter(out))
    assert result["objects"] == {"Job/tensorflow-job": "complete"}, out.getvalue()
    (train,) = result["results"].values()
    assert train["checkpoint"] == "/shared/checkpoints/mnist/latest.keras"
    digest = airgap["lock"]["images"][TF]["digest"]
    assert "images pulled by the digests inventory.gpuk8s.lock pins" in out.getvalue()
    rc, pod, err = lab.ssh("cp-01", "kubectl --kubeconfig /etc/kubernetes/admin.conf -n ml get "
                                  "pods -l gpuk8s.io/workload=tensorflow-job -o "
                                  "jsonpath='{.items[0].spec.containers[0].image}'")
    assert rc == 0 and pod.strip() == f"{TF}@{digest}", err
    served = (airgap["state"] / "registry.log").read_text()
    assert f"/v2/docker.io/tensorflow/tensorflow/manifests/{digest}" in served


def test_the_lab_s_package_cache_and_registry_saw_no_request_from_the_nodes(
        airgap: dict[str, Any]) -> None:
    """Runs last: after the bootstrap and the job above."""
    addresses = {node_ip(i) for i in range(1, len(NODES) + 1)}
    for name, path in airgap["logs"].items():
        seen = requests_from(path, airgap["marks"][name], addresses)
        assert seen == [], f"{name}: {len(seen)} request(s) from the nodes: {seen[:5]}"
    apt = (airgap["state"] / "apt-access.log").read_text()
    assert any(a in apt for a in addresses), "the nodes' apt used the bundle's repositories"
