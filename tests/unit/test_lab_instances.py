"""The lab's two instances (tests/lab/paths.py): what each owns, what they share, and that a
bad instance number is refused. Each case runs in its own interpreter, since the instance is
read once, at import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

SHOW = """
import json
from tests.lab import lock, paths
print(json.dumps({
    "ips": [paths.node_ip(1), paths.node_ip(4)],
    "state": str(paths.state_dir()), "other_state": str(paths.state_dir(1 - paths.INSTANCE)),
    "services": str(paths.services_dir()), "netns": paths.NETNS_PREFIX,
    "cgroup": paths.CGROUP_PREFIX, "lock": lock.LOCK_PATH,
    "own": [o for o in (11, 130, 131, 250) if paths.own_veth_octet(o)],
    "top": 250 - paths.IP_OFFSET[paths.INSTANCE]}))
"""


def show(instance: str | None, **env: str) -> dict[str, Any]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUK8S_LAB_")}
    if instance is not None:
        clean["GPUK8S_LAB_INSTANCE"] = instance
    out = subprocess.run([sys.executable, "-c", SHOW], cwd=ROOT, env={**clean, **env},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def test_instance_0_is_the_lab_of_before() -> None:
    got = show(None)
    assert got["ips"] == ["10.88.0.11", "10.88.0.14"]
    assert got["state"] == "/var/lib/gpuk8s-lab"
    assert got["other_state"] == "/var/lib/gpuk8s-lab-1"
    assert (got["netns"], got["cgroup"]) == ("gk8s-", "gpuk8s-lab-")
    assert got["lock"] == "/run/gpuk8s-lab.lock"
    assert got["services"] == "/run/gpuk8s-lab-services"


def test_instance_1_has_its_own_nodes_addresses_state_and_lock() -> None:
    got = show("1")
    assert got["ips"] == ["10.88.0.131", "10.88.0.134"]
    assert got["state"] == "/var/lib/gpuk8s-lab-1"
    assert got["other_state"] == "/var/lib/gpuk8s-lab"
    assert (got["netns"], got["cgroup"]) == ("gk8s1-", "gpuk8s-lab1-")
    # the netns and cgroup globs of one instance never match the other's names
    assert not "gk8s1-cp-01".startswith("gk8s-") and not "gpuk8s-lab1-x".startswith("gpuk8s-lab-")
    assert got["lock"] == "/run/gpuk8s-lab-1.lock"
    assert got["services"] == "/run/gpuk8s-lab-services"  # shared with instance 0
    assert got["own"] == [131, 250] and got["top"] == 120


def test_a_state_dir_of_a_tests_own_keeps_its_services_there_too(tmp_path: Path) -> None:
    got = show("1", GPUK8S_LAB_STATE=str(tmp_path))
    assert got["state"] == str(tmp_path) and got["services"] == str(tmp_path / "services")


def test_an_unknown_instance_is_refused_naming_the_choices() -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUK8S_LAB_")}
    out = subprocess.run([sys.executable, "-c", "import tests.lab.paths"], cwd=ROOT,
                         env={**clean, "GPUK8S_LAB_INSTANCE": "2"}, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1
    assert "GPUK8S_LAB_INSTANCE='2'" in out.stderr and "set 0 or 1" in out.stderr
