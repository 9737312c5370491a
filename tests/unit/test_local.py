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


def test_the_run_log_keeps_each_facts_time_on_the_node(tmp_path: Path) -> None:
    """gather's probe of this machine: report.json's "facts" entry for the host has the
    node's milliseconds for every fact gathered, slowest first."""
    from contextlib import closing

    from gpuk8s.gather import fact_requests, gather
    from gpuk8s.session import open_session, role_vars

    inv = tmp_path / "local.ini"
    inv.write_text("[control_plane]\nthis-machine ansible_connection=local\n")
    session = open_session(inv, limit=None, sets=(), command="facts-times",
                           reporter=Reporter(io.StringIO()))
    with closing(session):
        gather(session, ["this-machine"])
        report = json.loads(session.runlog.write_report().read_text())
        asked = {f.key for f in fact_requests(role_vars(session.host("this-machine")))}
    (probe,) = report["facts"]["this-machine"]
    times = probe["node_ms"]
    assert asked <= set(times) and all(k in asked or k.startswith("source ") for k in times)
    assert list(times.values()) == sorted(times.values(), reverse=True)
    # each time is a difference of /proc/uptime's 10 ms steps: at most 10 ms over
    assert sum(times.values()) <= probe["elapsed"] * 1000 + 10 * len(times)
