"""registry_mirrors on a bootstrapped lab, with the real registry (Debian's docker-registry
2.8 on the lab bridge) and the nodes' real containerd 2.1: gpuk8s writes one hosts.toml per
registry without restarting containerd, a node pulls ``docker.io/library/busybox`` from the
mirror (containerd's own host resolver, through ``ctr --hosts-dir``, which reads the same
certs.d the CRI plugin's config_path names) and runs it; a mirror that does not answer stops
preflight with the node and the mirror named; dropping the mirrors removes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s import api
from gpuk8s.errors import PreflightError
from tests.lab import registry
from tests.lab.lab import Lab
from tests.lab.product.runs import call
from tests.lab.product.test_bootstrap import GATES
from tests.lab.product.test_day2 import restore_bootstrapped

pytestmark = pytest.mark.lab

MIRROR = registry.URL
IMAGE = "docker.io/library/busybox:gpuk8s-lab"
NODE = "gpu-01"


@pytest.fixture(scope="module")
def cluster(lab: Lab) -> Lab:
    restore_bootstrapped(lab)
    registry.start()
    registry.push_busybox()
    return lab


def inventory(lab: Lab, tmp_path: Path, mirrors: dict[str, Any]) -> Path:
    data = yaml.safe_load(lab.inventory_path.read_text())
    data["all"]["vars"]["feature_gates"] = yaml.safe_load(GATES.split("=", 1)[1])
    data["all"]["vars"]["registry_mirrors"] = mirrors
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def sh(lab: Lab, node: str, cmd: str, timeout: int = 120) -> str:
    rc, out, err = lab.ssh(node, cmd, timeout=timeout)
    assert rc == 0, f"{node}: {cmd}: {out} {err}"
    return out


def test_the_lab_registry_is_the_real_distribution_registry(cluster: Lab) -> None:
    out = sh(cluster, NODE, f"curl -sS -D - {MIRROR}/v2/ -o /dev/null")
    assert "Docker-Distribution-Api-Version: registry/2.0" in out, out


def test_mirrors_are_written_pulled_through_and_removed(cluster: Lab, tmp_path: Path) -> None:
    pid = sh(cluster, NODE, "systemctl show -p MainPID --value containerd").strip()
    inv = inventory(cluster, tmp_path, {"docker.io": [MIRROR], "quay.io": [MIRROR]})
    planned, text = call(api.plan, inv)
    assert planned["planned"] > 0
    result, text = call(api.bootstrap, inv, yes=True)
    assert result["changed"] > 0, text
    hosts = sh(cluster, NODE, "cat /etc/containerd/certs.d/docker.io/hosts.toml")
    assert 'server = "https://registry-1.docker.io"' in hosts
    assert f'[host."{MIRROR}"]' in hosts
    # only hosts.toml changed: containerd was not restarted
    assert sh(cluster, NODE, "systemctl show -p MainPID --value containerd").strip() == pid
    # the real containerd resolves docker.io through the mirror (Docker Hub is unreachable
    # from the lab: the image can only come from the lab registry). The registry is shared
    # by both lab instances: only its access-log lines written from here on, from this node's
    # own address, count as this pull; containerd names the registry it mirrors (ns=)
    log_path = Path(registry._paths()["log"])
    offset = log_path.stat().st_size
    node_ip = cluster.node(NODE).ip
    sh(cluster, NODE, f"ctr -n gpuk8s-test images pull --hosts-dir /etc/containerd/certs.d "
       f"{IMAGE}", timeout=180)  # exit 0 (its progress text may end before its last line)
    assert IMAGE in sh(cluster, NODE, "ctr -n gpuk8s-test images ls -q").split()
    # run with the native snapshotter (ctr unpacks for it): the node's own root is an
    # overlay, and overlayfs refuses an upper dir on it
    note = sh(cluster, NODE, f"ctr -n gpuk8s-test run --rm --snapshotter native --net-host "
              f"{IMAGE} mirror-check /bin/busybox cat /etc/gpuk8s-lab-image", timeout=120)
    assert note.strip() == registry.LAB_NOTE
    with log_path.open("rb") as fh:
        fh.seek(offset)
        pulled = [line for line in fh.read().decode(errors="replace").splitlines()
                  if line.startswith(f"{node_ip} ")
                  and "/v2/library/busybox/manifests/gpuk8s-lab?ns=docker.io " in line]
    assert pulled, f"no manifest request from {NODE} ({node_ip}) in the registry's log"
    again, text = call(api.bootstrap, inv, yes=True)
    assert again["changed"] == 0, text

    inv = inventory(cluster, tmp_path, {"docker.io": [MIRROR]})
    result, text = call(api.bootstrap, inv, yes=True)
    assert "remove the mirrors of quay.io" in text
    rc, _, _ = cluster.ssh(NODE, "test -e /etc/containerd/certs.d/quay.io")
    assert rc != 0
    sh(cluster, NODE, "ctr -n gpuk8s-test images rm " + IMAGE)


def test_a_mirror_that_does_not_answer_stops_preflight(cluster: Lab, tmp_path: Path) -> None:
    dead = f"http://{registry.HOST_IP}:5999"
    inv = inventory(cluster, tmp_path, {"docker.io": [MIRROR], "nvcr.io": [dead]})
    with pytest.raises(PreflightError) as err:
        call(api.bootstrap, inv, yes=True)
    problems = err.value.problems
    assert set(problems) >= {"cp-01", "gpu-01", "gpu-02", "cpu-01"}
    [(_, message, fix)] = [p for p in problems[NODE] if p[0] == "registry_mirror"]
    assert message == (f"mirror {dead} (of nvcr.io) does not answer from this node: "
                       "connection refused or no route")
    assert f"curl -sk {dead}/v2/" in fix
    rc, _, _ = cluster.ssh(NODE, "test -e /etc/containerd/certs.d/nvcr.io")
    assert rc != 0  # preflight changed nothing
