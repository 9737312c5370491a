"""The Vagrantfile is valid Ruby and inventories/vagrant.yaml is a valid inventory for it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from gpuk8s.inventory import load_inventory

ROOT = Path(__file__).resolve().parents[2]


def test_vagrantfile_syntax() -> None:
    ruby = shutil.which("ruby")
    assert ruby, "ruby is needed to syntax-check the Vagrantfile (scripts/setup installs it)"
    out = subprocess.run([ruby, "-c", str(ROOT / "Vagrantfile")], capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0 and "Syntax OK" in out.stdout, out.stderr


def test_vagrant_inventory_matches_vagrantfile() -> None:
    inv = load_inventory(ROOT / "inventories" / "vagrant.yaml")
    text = (ROOT / "Vagrantfile").read_text()
    names = re.findall(r'name: "([a-z0-9-]+)",\s+ip: "#\{NET\}\.(\d+)"', text)
    assert {n: f"192.168.56.{ip}" for n, ip in names} == \
        {h.name: h.address for h in inv.hosts.values()}
    assert [h.name for h in inv.control_planes] == ["cp-01"]
    assert all(h.user == "vagrant" and h.become for h in inv.hosts.values())
