"""Fixtures of the stand-ins' tests. Kubernetes: a temp node root (node), an API server stand-in
with a REAL etcd (cluster), and kubeadm init on a node with the kubelet stand-in
(control_plane). NVIDIA: a fake root (root) and one with the dual-H200 capture's GPUs and a
loaded driver (dual)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab.selftest.standins.k8s_helpers import INIT_CFG, Cluster, Node, free_port
from tests.lab.selftest.standins.nvidia_helpers import (
    DUAL,
    NEW,
    fake_pci,
    install_files,
    load_module,
)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "node")
    yield n
    n.cleanup()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "cluster", gates="DRAPartitionableDevices=true")
    yield c
    c.stop()


@pytest.fixture
def control_plane(node: Node) -> Iterator[tuple[Node, str]]:
    """kubeadm init on a temp root with the kubelet stand-in as a child process."""
    for port in (10248, 10250):
        for _ in range(50):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
                break
            except OSError:
                time.sleep(0.2)
            finally:
                s.close()
        else:
            pytest.fail(f"port {port} is busy on this host for 10 s: the kubelet stand-in "
                        "needs it; stop what listens there (ss -ltnp)", pytrace=False)
    node.add_gpus(2)
    cfg = node.root / "_kubeadm.yaml"
    cfg.write_text(INIT_CFG.format(port=free_port()).replace(
        "  name: cp-01\n", "  name: cp-01\n  taints: []\n"))
    r = node.run("kubeadm", "init", "--config", str(cfg), "--skip-token-print")
    assert r.returncode == 0, r.stdout + r.stderr
    yield node, str(node.root / "etc/kubernetes/admin.conf")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / "etc").mkdir(parents=True)
    (r / "etc/machine-id").write_text("5f1c0c7e4a8b4d0f9e6b2a1c3d4e5f60\n")
    return r


@pytest.fixture
def dual(root: Path) -> Path:
    fake_pci(root, (DUAL / "sys-pci-nvidia.txt").read_text().splitlines())
    install_files(root, "nvidia-driver-cuda", NEW)
    load_module(root, NEW)
    return root
