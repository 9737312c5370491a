"""inventories/lab.yaml is what the lab writes for its default topology, and it validates."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpuk8s.inventory import load_inventory
from tests.lab.topology import Topology, inventory

ROOT = Path(__file__).resolve().parents[2]


def test_committed_lab_inventory_matches_the_generated_one() -> None:
    committed = yaml.safe_load((ROOT / "inventories" / "lab.yaml").read_text())
    assert committed == inventory(Topology.load("default"))


def test_lab_inventory_loads() -> None:
    inv = load_inventory(ROOT / "inventories" / "lab.yaml")
    assert [h.name for h in inv.control_planes] == ["cp-01"]
    assert [h.name for h in inv.workers] == ["gpu-01", "gpu-02", "cpu-01"]
    assert inv.hosts["gpu-01"].vars["gpu_required"] is True
