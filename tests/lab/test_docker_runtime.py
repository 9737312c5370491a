"""container_runtime: docker against the booted lab: a 2-node cluster (cp-01, gpu-01) whose nodes
run Docker CE (the lab's docker-ce/docker-ce-cli: Debian's real dockerd and docker CLI) on
containerd.io's containerd, with containerd's CRI plugin on for the kubelet.

The tests of this module run in order and share one bootstrap; they start from the "fresh"
snapshot (made by test_bootstrap.py, or here on a freshly booted lab when it is missing).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.lab.lab import Lab
from tests.lab.runs import bootstrap_inline, cut_inventory, restore_fresh, ssh_ok

pytestmark = pytest.mark.lab

NODES = ("cp-01", "gpu-01")
KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf"


@pytest.fixture(scope="module")
def docker_lab(lab: Lab) -> Lab:
    return restore_fresh(lab)


@pytest.fixture(scope="module")
def inventory(docker_lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cut_inventory(docker_lab, tmp_path_factory.mktemp("docker-runtime"), NODES,
                         container_runtime="docker")


@pytest.fixture(scope="module")
def first_run(docker_lab: Lab, inventory: Path) -> tuple[dict[str, Any], str]:
    return bootstrap_inline(inventory)


def test_bootstrap_with_docker_succeeds(first_run: tuple[dict[str, Any], str]) -> None:
    result, text = first_run
    assert sorted(result["totals"]) == sorted(NODES), result["totals"]
    assert all(t["failed"] == 0 for t in result["totals"].values()), text
    assert result["changed"] > 20, text
    assert "docker-ce" in text


def test_docker_ce_installed_from_the_lab_docker_repo(docker_lab: Lab, first_run: Any) -> None:
    for node in NODES:
        out = ssh_ok(docker_lab, node, "dpkg-query -W -f '${Package} ${Version} "
                      "${db:Status-Abbrev}\\n' docker-ce docker-ce-cli containerd.io "
                      "containerd runc 2>/dev/null; true")
        status = {ln.split()[0]: ln.split()[-1] for ln in out.splitlines() if ln.strip()}
        version = {ln.split()[0]: ln.split()[1] for ln in out.splitlines() if len(ln.split()) == 3}
        for name in ("docker-ce", "docker-ce-cli"):
            assert version[name].startswith("5:28."), (node, version)
        for name in ("docker-ce", "docker-ce-cli", "containerd.io"):
            assert status[name] == "hi", (node, status)  # installed and held
        # Debian's containerd/runc never come in (containerd.io provides and conflicts)
        for name in ("containerd", "runc"):
            assert status.get(name, "un")[1] != "i", (node, status)
        held = ssh_ok(docker_lab, node, "apt-mark showhold").split()
        assert {"docker-ce", "docker-ce-cli", "containerd.io"} <= set(held), (node, held)


def test_dockerd_runs_on_containerd_io(docker_lab: Lab, first_run: Any) -> None:
    for node in NODES:
        units = ssh_ok(docker_lab, node, "systemctl is-active docker.service docker.socket "
                        "containerd.service; systemctl is-enabled docker.service "
                        "containerd.service")
        assert units.split() == ["active"] * 3 + ["enabled"] * 2, (node, units)
        rc, info, err = docker_lab.ssh(node, "docker info --format '{{json .}}'")
        if rc != 0:
            _, log, _ = docker_lab.ssh(node, "journalctl -u docker --no-pager -n 60")
            pytest.fail(f"{node}: docker info failed: {err}\n{log}")
        info_j = json.loads(info)
        assert info_j["ServerVersion"].startswith("28."), info_j["ServerVersion"]
        print(f"{node}: dockerd {info_j['ServerVersion']}, storage driver {info_j['Driver']}, "
              f"cgroup {info_j.get('CgroupDriver')}/v{info_j.get('CgroupVersion')}, "
              f"warnings {info_j.get('Warnings')}")
        # dockerd uses the system containerd (containerd.io's), not one of its own
        cmdline = ssh_ok(docker_lab, node, "tr '\\0' ' ' < /proc/$(systemctl show -P MainPID "
                          "docker)/cmdline")
        assert "--containerd=/run/containerd/containerd.sock" in cmdline, cmdline
        procs = ssh_ok(docker_lab, node, "pgrep -a containerd || true")
        daemons = [ln for ln in procs.splitlines() if ln.split()[1].endswith("/containerd")]
        assert len(daemons) == 1 and daemons[0].split()[1] == "/usr/bin/containerd", procs
        version = ssh_ok(docker_lab, node, "containerd --version")
        assert " 2.1." in version, version
        # a container through the whole chain: docker -> containerd.io -> runc (an image
        # imported locally from the static docker-init: the lab has no registry)
        out = ssh_ok(docker_lab, node, (
            "set -e; d=$(mktemp -d); cp /usr/bin/docker-init $d/tini; "
            "tar -C $d -c tini | docker import - gpuk8s-lab/tini:1 >/dev/null; rm -r $d; "
            "docker run --rm --network none gpuk8s-lab/tini:1 /tini --version; "
            "ctr namespaces ls -q"), timeout=180)
        assert "tini version 0.19" in out, out
        assert "moby" in out.split(), f"{node}: dockerd's containers are not in containerd: {out}"


def test_containerd_cri_plugin_enabled(docker_lab: Lab, first_run: Any) -> None:
    for node in NODES:
        out = ssh_ok(docker_lab, node, "ctr plugins ls")
        cri = [ln.split() for ln in out.splitlines()
               if ln.split()[:2] == ["io.containerd.grpc.v1", "cri"]]
        assert cri and cri[0][-1] == "ok", f"{node}: {out}"
        config = ssh_ok(docker_lab, node, "cat /etc/containerd/config.toml")
        assert 'disabled_plugins = ["cri"]' not in config


def test_nodes_ready_with_gpus(docker_lab: Lab, first_run: Any) -> None:
    ssh_ok(docker_lab, "cp-01", f"{KUBECTL} wait --for=condition=Ready node/cp-01 node/gpu-01 "
            "--timeout=180s", timeout=240)
    ssh_ok(docker_lab, "cp-01", f"{KUBECTL} wait --for=jsonpath='{{.status.allocatable."
            "nvidia\\.com/gpu}'=2 node/gpu-01 --timeout=180s", timeout=240)
    nodes = json.loads(ssh_ok(docker_lab, "cp-01", f"{KUBECTL} get nodes -o json"))["items"]
    by_name = {n["metadata"]["name"]: n for n in nodes}
    assert sorted(by_name) == sorted(NODES)
    for name, n in by_name.items():
        ready = next(c for c in n["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", f"{name}: {ready}"
    gpus = {name: n["status"].get("allocatable", {}).get("nvidia.com/gpu")
            for name, n in by_name.items()}
    assert gpus == {"cp-01": None, "gpu-01": "2"}


def test_second_bootstrap_changes_nothing(docker_lab: Lab, inventory: Path,
                                          first_run: Any) -> None:
    result, text = bootstrap_inline(inventory)
    assert all(t["failed"] == 0 for t in result["totals"].values()), text
    assert result["changed"] == 0, text
    assert "no changes" in text
    # docker is still up after the no-op run
    for node in NODES:
        ssh_ok(docker_lab, node, "docker info --format '{{.ServerVersion}}'")
