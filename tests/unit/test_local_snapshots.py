"""etcd_backup_schedule: the schedule's check, the timer, service and script the first control
plane gets, and status's line about the snapshots they take."""

from __future__ import annotations

import datetime as dt
import subprocess

import pytest

from gpuk8s.day2.status import local_snapshot_line, local_snapshots
from gpuk8s.facts.controlplane import LocalSnapshots
from roles.control_plane import snapshots


@pytest.mark.parametrize("value", ["", "daily", "*-*-* 00/12:00:00", "Mon..Fri 02:30",
                                   "hourly", "*:0/15"])
def test_calendar_events_pass(value: str) -> None:
    assert snapshots.check_schedule("etcd_backup_schedule", value) is None


@pytest.mark.parametrize("value", ["daily\nExecStart=/bin/sh", "daily; reboot", "%H", "'x'",
                                   "a" * 101, 12])
def test_anything_else_is_refused_with_an_example(value: object) -> None:
    problem = snapshots.check_schedule("etcd_backup_schedule", value)
    assert problem is not None and "not a systemd calendar event" in problem.message
    assert "'*-*-* 00/12:00:00'" in problem.fix


def test_the_units_and_the_script() -> None:
    timer = snapshots.timer("*-*-* 00/12:00:00").decode()
    assert "OnCalendar=*-*-* 00/12:00:00\nPersistent=true\n" in timer
    assert "WantedBy=timers.target" in timer
    assert f"ExecStart={snapshots.SCRIPT}\n" in snapshots.service().decode()
    script = snapshots.script(3).decode()
    assert subprocess.run(["sh", "-n"], input=script, text=True).returncode == 0
    assert "snapshot save /var/lib/etcd/gpuk8s-local-snapshot.db" in script
    assert "head -n -3" in script and "umask 077" in script


def test_the_fact_keeps_only_snapshot_names() -> None:
    said = LocalSnapshots().parse("etcd-20261129T120000Z.db\nnotes.txt\n"
                                  "etcd-20261128T120000Z.db\netcd-x.db\n", 0)
    assert said == ("etcd-20261128T120000Z.db", "etcd-20261129T120000Z.db")


def test_status_names_the_newest_and_its_age() -> None:
    made = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=5)).strftime("%Y%m%dT%H%M%SZ")
    local = local_snapshots(("etcd-20261101T000000Z.db", f"etcd-{made}.db"), "daily")
    assert local["count"] == 2 and local["newest"] == f"etcd-{made}.db"
    assert local_snapshot_line("cp-01", local) == (
        "etcd snapshots on cp-01: 2 in /var/lib/gpuk8s/etcd-snapshots, the newest 5 h old",
        "green")
    none = local_snapshots((), "daily")
    assert local_snapshot_line("cp-01", none) == (
        "etcd snapshots on cp-01: none yet (etcd_backup_schedule 'daily')", "yellow")
