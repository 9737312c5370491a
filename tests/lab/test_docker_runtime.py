"""container_runtime: docker against the booted lab: a 2-node cluster (cp-01, gpu-01) whose nodes
run Docker CE (the lab's docker-ce/docker-ce-cli: Debian's real dockerd and docker CLI) on
containerd.io's containerd, with containerd's CRI plugin on for the kubelet.

The tests of this module run in order and share one bootstrap; they start from the "fresh"
snapshot (made by test_bootstrap.py, or here on a freshly booted lab when it is missing).
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s import api
from gpuk8s.report import Reporter
from tests.lab.lab import Lab

pytestmark = pytest.mark.lab

NODES = ("cp-01", "gpu-01")
KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf"


def _bootstrap(path: Path) -> tuple[dict[str, Any], str]:
    out = io.StringIO()
    result = api.bootstrap(path, yes=True, reporter=Reporter(out))
    text = out.getvalue()
    sys.stdout.write(text)
    return result, text


def _ssh_ok(lab: Lab, node: str, cmd: str, timeout: float = 120.0) -> str:
    rc, out, err = lab.ssh(node, cmd, timeout=timeout)
    assert rc == 0, f"{node}: {cmd}: rc={rc}\n{out}\n{err}"
    return out


def _docker_inventory(lab: Lab, dest: Path) -> Path:
    """The lab's inventory cut down to cp-01 and gpu-01, with container_runtime: docker."""
    inv = yaml.safe_load(lab.inventory_path.read_text())
    inv["all"]["vars"]["container_runtime"] = "docker"
    for group in inv["all"]["children"].values():
        hosts = group.get("hosts") or {}
        for name in list(hosts):
            if name not in NODES:
                del hosts[name]
    kept = [h for g in inv["all"]["children"].values() for h in (g.get("hosts") or {})]
    assert sorted(kept) == sorted(NODES), kept
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def docker_lab(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Lab:
    if (lab.snapshot_dir("fresh") / "topology.yaml").exists():
        lab.restore("fresh")
    else:  # no snapshot yet: boot the lab afresh and take it
        lab.up(reuse=False)
        lab.snapshot("fresh")
    return lab


@pytest.fixture(scope="module")
def inventory(docker_lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _docker_inventory(docker_lab, tmp_path_factory.mktemp("docker-runtime"))


@pytest.fixture(scope="module")
def first_run(docker_lab: Lab, inventory: Path) -> tuple[dict[str, Any], str]:
    return _bootstrap(inventory)


def test_bootstrap_with_docker_succeeds(first_run: tuple[dict[str, Any], str]) -> None:
    result, text = first_run
    assert sorted(result["totals"]) == sorted(NODES), result["totals"]
    assert all(t["failed"] == 0 for t in result["totals"].values()), text
    assert result["changed"] > 20, text
    assert "docker-ce" in text


def test_docker_ce_installed_from_the_lab_docker_repo(docker_lab: Lab, first_run: Any) -> None:
    for node in NODES:
        out = _ssh_ok(docker_lab, node, "dpkg-query -W -f '${Package} ${Version} "
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
        held = _ssh_ok(docker_lab, node, "apt-mark showhold").split()
        assert {"docker-ce", "docker-ce-cli", "containerd.io"} <= set(held), (node, held)


def test_dockerd_runs_on_containerd_io(docker_lab: Lab, first_run: Any) -> None:
    for node in NODES:
        units = _ssh_ok(docker_lab, node, "systemctl is-active docker.service docker.socket "
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
        cmdline = _ssh_ok(docker_lab, node, "tr '\\0' ' ' < /proc/$(systemctl show -P MainPID "
                          "docker)/cmdline")
        assert "--containerd=/run/containerd/containerd.sock" in cmdline, cmdline
        procs = _ssh_ok(docker_lab, node, "pgrep -a containerd || true")
        daemons = [ln for ln in procs.splitlines() if ln.split()[1].endswith("/containerd")]
        assert len(daemons) == 1 and daemons[0].split()[1] == "/usr/bin/containerd", procs
        version = _ssh_ok(docker_lab, node, "containerd --version")
        assert " 2.1." in version, version
        # a container through the whole chain: docker -> containerd.io -> runc (an image
        # imported locally from the static docker-init: the lab has no registry)
        out = _ssh_ok(docker_lab, node, (
            "set -e; d=$(mktemp -d); cp /usr/bin/docker-init $d/tini; "
            "tar -C $d -c tini | docker import - gpuk8s-lab/tini:1 >/dev/null; rm -r $d; "
            "docker run --rm --network none gpuk8s-lab/tini:1 /tini --version; "
            "ctr namespaces ls -q"), timeout=180)
        assert "tini version 0.19" in out, out
        assert "moby" in out.split(), f"{node}: dockerd's containers are not in containerd: {out}"


def test_containerd_cri_plugin_enabled(docker_lab: Lab, first_run: Any) -> None:
    for node in NODES:
        out = _ssh_ok(docker_lab, node, "ctr plugins ls")
        cri = [ln.split() for ln in out.splitlines()
               if ln.split()[:2] == ["io.containerd.grpc.v1", "cri"]]
        assert cri and cri[0][-1] == "ok", f"{node}: {out}"
        config = _ssh_ok(docker_lab, node, "cat /etc/containerd/config.toml")
        assert 'disabled_plugins = ["cri"]' not in config


def test_nodes_ready_with_gpus(docker_lab: Lab, first_run: Any) -> None:
    _ssh_ok(docker_lab, "cp-01", f"{KUBECTL} wait --for=condition=Ready node/cp-01 node/gpu-01 "
            "--timeout=180s", timeout=240)
    _ssh_ok(docker_lab, "cp-01", f"{KUBECTL} wait --for=jsonpath='{{.status.allocatable."
            "nvidia\\.com/gpu}'=2 node/gpu-01 --timeout=180s", timeout=240)
    nodes = json.loads(_ssh_ok(docker_lab, "cp-01", f"{KUBECTL} get nodes -o json"))["items"]
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
    result, text = _bootstrap(inventory)
    assert all(t["failed"] == 0 for t in result["totals"].values()), text
    assert result["changed"] == 0, text
    assert "no changes" in text
    # docker is still up after the no-op run
    for node in NODES:
        _ssh_ok(docker_lab, node, "docker info --format '{{.ServerVersion}}'")
