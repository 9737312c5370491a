"""Kubernetes patch upgrades: the target and the inventory are checked before any host
changes; the package script resolves, unholds, installs and holds again."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuk8s import day2
from gpuk8s.day2.kubernetes import _resolve_and_install, check_inventory, parse_target
from gpuk8s.errors import InventoryError
from gpuk8s.inventory import load_inventory

LAB = Path(__file__).resolve().parents[2] / "inventories" / "lab.yaml"


def session(**overrides: Any) -> Any:
    inv = load_inventory(LAB, overrides=[f"{k}={v}" for k, v in overrides.items()])
    return SimpleNamespace(first_cp=inv.control_planes[0].name, scope=list(inv.hosts),
                           host=lambda name: inv.hosts[name])


@pytest.mark.parametrize(("given", "want"), [("1.36.2", "1.36.2"), ("v1.36.2", "1.36.2"),
                                             (" 1.36.10 ", "1.36.10")])
def test_targets(given: str, want: str) -> None:
    assert parse_target(given) == want


@pytest.mark.parametrize("bad", ["1.36", "latest", "1.36.2-1.1", "2.0.0", ""])
def test_bad_targets(bad: str) -> None:
    with pytest.raises(InventoryError, match="is not a Kubernetes release"):
        parse_target(bad)


def test_inventory_of_the_same_minor_and_unpinned_is_fine() -> None:
    check_inventory(session(), "1.36.2")
    check_inventory(session(kubernetes_package_version="1.36.2-1.1"), "1.36.2")


def test_another_minor_is_refused_with_a_fix() -> None:
    with pytest.raises(InventoryError) as err:
        check_inventory(session(), "1.37.1")
    assert "not a 1.36 release" in str(err.value)
    assert "--kubernetes 1.36.1" in str(err.value)


def test_a_pin_on_another_version_names_where_it_is_set() -> None:
    with pytest.raises(InventoryError) as err:
        check_inventory(session(kubernetes_package_version="1.36.1-1.1"), "1.36.2")
    text = str(err.value)
    assert "kubernetes_package_version pins 1.36.1-1.1" in text
    assert "(--set)" in text  # where the value came from: here the override
    assert 'kubernetes_package_version: ""' in text


def test_driver_kubernetes_or_kernel_one_of_them() -> None:
    with pytest.raises(InventoryError, match="--driver VERSION, --kubernetes VERSION or "
                       r"--kernel \[RELEASE\]"):
        day2.upgrade(LAB)
    with pytest.raises(InventoryError, match="one of them"):
        day2.upgrade(LAB, driver="580.159.04", kubernetes="1.36.2")
    with pytest.raises(InventoryError, match="one of them"):
        day2.upgrade(LAB, driver="580.159.04", kernel=True)
    with pytest.raises(InventoryError, match="is not a kernel release"):
        day2.upgrade(LAB, kernel="6.8; reboot")


def test_install_script_holds_again_and_fails_clearly_without_the_release(
        tmp_path: Path) -> None:
    script = _resolve_and_install(["kubelet", "kubectl"], "1.36.2")
    assert "apt-mark unhold kubelet kubectl" in script
    assert script.index("--allow-change-held-packages install kubelet=\"$v\" kubectl=\"$v\"") \
        < script.index("apt-mark hold kubelet kubectl")
    # run it against stub apt tools that know only 1.36.1: a clear error, nothing unheld
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    calls = tmp_path / "calls"
    for tool, body in {
        "apt-cache": "echo ' kubelet | 1.36.1-1.1 | https://pkgs.k8s.io/core:/stable:/v1.36/deb "
                     " Packages'",
        "apt-get": f"echo apt-get \"$@\" >> {calls}",
        "apt-mark": f"echo apt-mark \"$@\" >> {calls}",
    }.items():
        (bin_ / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bin_ / tool).chmod(0o755)
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True,
                          env={"PATH": f"{bin_}:/usr/bin:/bin"}, check=False)
    assert proc.returncode == 3
    assert "no kubelet 1.36.2 in the configured repos; they offer:\n  1.36.1-1.1" in proc.stdout
    made = calls.read_text() if calls.exists() else ""
    assert "update" in made and "unhold" not in made and "install" not in made
