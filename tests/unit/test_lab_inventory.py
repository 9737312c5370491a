"""inventories/lab.yaml is what the lab writes for its default topology, and it validates."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
import yaml

from gpuk8s import checks
from gpuk8s.errors import InventoryError
from gpuk8s.inventory import load_inventory
from gpuk8s.roles import HostContext
from gpuk8s.session import role_vars
from roles.preflight import role as preflight
from tests.lab import paths
from tests.lab.topology import Topology, inventory
from tests.unit.scenarios import fresh_facts

ROOT = Path(__file__).resolve().parents[2]


def test_committed_lab_inventory_matches_the_generated_one() -> None:
    committed = yaml.safe_load((ROOT / "inventories" / "lab.yaml").read_text())
    assert committed == inventory(Topology.load("default"))


def test_lab_inventory_loads() -> None:
    inv = load_inventory(ROOT / "inventories" / "lab.yaml")
    assert [h.name for h in inv.control_planes] == ["cp-01"]
    assert [h.name for h in inv.workers] == ["gpu-01", "gpu-02", "cpu-01"]
    assert inv.hosts["gpu-01"].vars["gpu_required"] is True


# -- the lab's signing key is public: LAB ONLY (review 2, L8) -----------------------------------

def test_gpuk8s_knows_the_lab_key_and_subnet() -> None:
    """gpuk8s cannot import tests/: its copy of the fingerprint and subnet must be the lab's."""
    assert checks.LAB_KEY_FINGERPRINT == paths.LAB_KEY_FINGERPRINT
    assert set(paths.key_pins().values()) == {checks.LAB_KEY_FINGERPRINT}
    addresses = [h.address for h in load_inventory(ROOT / "inventories" / "lab.yaml")
                 .hosts.values()] + [paths.HOST_IP]
    assert all(ipaddress.ip_address(a) in checks.LAB_SUBNET for a in addresses)
    assert str(checks.LAB_SUBNET.network_address)[:-1] == paths.SUBNET_PREFIX


def _lab_host(address: str, *sets: str) -> HostContext:
    """gpu-01 of the committed lab inventory (every repo pinned to the lab key), at
    ``address``, as preflight sees it after cluster_values."""
    inv = load_inventory(ROOT / "inventories" / "lab.yaml", overrides=list(sets))
    vars = role_vars(inv.hosts["gpu-01"])
    facts = fresh_facts("debian12", 1, "gpu-01", dict(vars))
    cluster = {"nodes": {"gpu-01": {"address": address}}, "endpoint_mode": "direct",
               "control_planes": [{"host": "cp-01", "address": "10.88.0.11"}]}
    return HostContext("gpu-01", "preflight", vars, facts, cluster, ("workers",))


def _errors(ctx: HostContext) -> dict[str, str]:
    errors, _ = preflight.check(ctx)
    return {name: f"{message} | fix: {fix}" for name, message, fix in errors}


def test_preflight_refuses_the_lab_key_outside_the_lab() -> None:
    found = _errors(_lab_host("192.168.10.21"))["lab_signing_key"]
    assert found.startswith("docker_repo_key_fingerprint, kubernetes_repo_key_fingerprint, "
                            "nvidia_container_toolkit_repo_key_fingerprint, "
                            "nvidia_cuda_repo_key_fingerprint pin(s) the gpuk8s lab's repo "
                            f"signing key {paths.LAB_KEY_FINGERPRINT}, whose private key is "
                            "public")
    assert "192.168.10.21 is not in the lab's subnet 10.88.0.0/24" in found
    assert "lab_signing_key_allowed: true" in found
    # a host name is not an address in the lab; neither is a neighbouring subnet
    assert "lab_signing_key" in _errors(_lab_host("gpu-01.example.com"))
    assert "lab_signing_key" in _errors(_lab_host("10.88.1.12"))
    # one pin is enough, written in lower case with spaces as gpg prints it
    spaced = " ".join(paths.LAB_KEY_FINGERPRINT.lower()[i:i + 4] for i in range(0, 40, 4))
    one = _lab_host("192.168.10.21", f"docker_repo_key_fingerprint={spaced}",
                    *(f"{v}=" for v in ("kubernetes_repo_key_fingerprint",
                                        "nvidia_cuda_repo_key_fingerprint",
                                        "nvidia_container_toolkit_repo_key_fingerprint")),
                    *(f"{v}=https://mirror.example/key" for v in (
                        "kubernetes_repo_key_url", "nvidia_cuda_repo_key_url",
                        "nvidia_container_toolkit_repo_key_url")))
    assert _errors(one)["lab_signing_key"].startswith("docker_repo_key_fingerprint pin(s)")
    # preflight_ignore cannot lift it, and plan stops at it as at a bad hostname
    ignored = _lab_host("192.168.10.21", "preflight_ignore=[lab_signing_key]")
    assert "lab_signing_key" in _errors(ignored)
    assert "lab_signing_key" in preflight.NEVER_IGNORED
    assert "lab_signing_key" in preflight.UNPLANNABLE


def test_the_lab_itself_and_an_explicit_opt_in_pass() -> None:
    assert "lab_signing_key" not in _errors(_lab_host("10.88.0.12"))
    # from the inventory alone (what `invoke check` has): every lab host passes
    inv = load_inventory(ROOT / "inventories" / "lab.yaml")
    assert [h for h in inv.hosts.values()
            if preflight.lab_key_problems(role_vars(h), h.address)] == []
    assert preflight.lab_key_problems(role_vars(inv.hosts["cp-01"]), "cp-01.example.com")
    allowed = _lab_host("192.168.10.21", "lab_signing_key_allowed=true")
    assert "lab_signing_key" not in _errors(allowed)
    with pytest.raises(InventoryError, match="lab_signing_key_allowed must be a boolean"):
        _lab_host("192.168.10.21", "lab_signing_key_allowed=maybe")


def test_the_lab_inventory_says_lab_only() -> None:
    text = (ROOT / "inventories" / "lab.yaml").read_text()
    assert "air-gapped" not in text
    pins = [line for line in text.splitlines() if "_repo_key_fingerprint:" in line]
    assert len(pins) == 4 and all(line.endswith("# LAB ONLY") for line in pins)
    assert "LAB ONLY: do not start a real inventory from this file" in text
