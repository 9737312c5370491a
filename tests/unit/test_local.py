"""ansible_connection: local runs the real probe on this machine, no SSH involved."""

from __future__ import annotations

import io
import json
from pathlib import Path

from gpuk8s import api
from gpuk8s.report import Reporter


def test_facts_over_local_connection(tmp_path: Path) -> None:
    inv = tmp_path / "local.ini"
    inv.write_text("[control_plane]\nthis-machine ansible_connection=local\n")
    out = io.StringIO()
    data = api.facts(inv, reporter=Reporter(out), as_json=True)
    facts = data["this-machine"]
    os_release = facts["OsRelease"]
    assert os_release["ID"] and os_release["VERSION_ID"]
    assert facts["System"].boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    printed = json.loads(out.getvalue())
    assert printed["this-machine"]["OsRelease"] == os_release


def test_facts_summary_names_what_an_admin_needs(tmp_path: Path) -> None:
    inv = tmp_path / "local.ini"
    inv.write_text("[control_plane]\nthis-machine ansible_connection=local\n")
    out = io.StringIO()
    api.facts(inv, reporter=Reporter(out))
    text = out.getvalue()
    for key in ("os", "kernel", "cgroup", "secure boot", "pci gpus", "driver", "containerd"):
        assert f"  {key} " in text, text
