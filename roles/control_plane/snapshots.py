"""Scheduled local etcd snapshots on the first control plane (etcd_backup_schedule): for when the
admin machine, where `invoke backup` keeps its backups, is away.

A systemd timer (OnCalendar = the schedule, Persistent=true so a run missed while the node was
down happens at boot) starts a oneshot service whose script takes a snapshot with the etcdctl
of the node's own etcd container, as `invoke backup` does (gpuk8s/backups.py), into
/var/lib/gpuk8s/etcd-snapshots/etcd-<UTC time>.db (0600, the folder 0700) and keeps the newest
etcd_backup_local_keep. These hold etcd only (no PKI: restore takes the PKI from a backup, or
from the node itself). An empty schedule removes the timer, its service and script; the
snapshots taken stay."""

from __future__ import annotations

import re
from typing import Any

from gpuk8s.checks import VarProblem
from gpuk8s.facts.controlplane import (
    ETCD_CONTAINER,
    ETCDCTL_IN,
    LOCAL_SNAPSHOTS,
    LocalSnapshots,
)
from gpuk8s.facts.system import Files, Services
from gpuk8s.ops import Op, change, noop, q, sha256
from gpuk8s.ops import files as file_ops

NAME = "gpuk8s-etcd-snapshot"
SCRIPT = f"/usr/local/sbin/{NAME}"
SERVICE = f"/etc/systemd/system/{NAME}.service"
TIMER = f"/etc/systemd/system/{NAME}.timer"
PATHS = (SCRIPT, SERVICE, TIMER)
#: etcdctl writes into etcd's own data mount; the file moves out at once
IN_CONTAINER = "/var/lib/etcd/gpuk8s-local-snapshot.db"
#: what an OnCalendar value may hold: systemd.time(7)'s calendar events and shorthands (daily,
#: hourly, Mon..Sun, *-*-* 00/12:00:00, ranges and lists); no newline, quote or '%' (a unit
#: file's specifier)
CALENDAR = re.compile(r"[A-Za-z0-9*,./:~ +-]{1,100}")


def check_schedule(name: str, value: Any) -> VarProblem | None:
    """An OnCalendar expression (the node's `systemd-analyze calendar` checks it too)."""
    if value in ("", None):
        return None
    if not isinstance(value, str) or not CALENDAR.fullmatch(value.strip()):
        return VarProblem(name, f"{name} {value!r} is not a systemd calendar event (letters, "
                          "digits, spaces and * , . / : ~ + - only)",
                          f"write {name}: '*-*-* 00/12:00:00' (every 12 hours), 'daily', or "
                          "'' for none (systemd.time(7), OnCalendar)")
    return None


def script(keep: int) -> bytes:
    return f"""#!/bin/sh
# managed by gpuk8s (control_plane, etcd_backup_schedule): one local etcd snapshot, the
# newest {keep} kept in {LOCAL_SNAPSHOTS}
set -eu
umask 077
{ETCD_CONTAINER}
if [ -z "$id" ]; then echo "no running etcd container: no snapshot" >&2; exit 1; fi
trap 'rm -f {IN_CONTAINER} {IN_CONTAINER}.part' EXIT
{ETCDCTL_IN} snapshot save {IN_CONTAINER} >/dev/null
mkdir -p {LOCAL_SNAPSHOTS}
chmod 0700 {LOCAL_SNAPSHOTS}
name="etcd-$(date -u +%Y%m%dT%H%M%SZ).db"
mv {IN_CONTAINER} "{LOCAL_SNAPSHOTS}/$name"
ls -1 {LOCAL_SNAPSHOTS} | grep -E '^etcd-[0-9]{{8}}T[0-9]{{6}}Z\\.db$' | sort | head -n -{keep} |
  while read -r old; do rm -f "{LOCAL_SNAPSHOTS}/$old"; done
echo "etcd snapshot {LOCAL_SNAPSHOTS}/$name ($(stat -c %s "{LOCAL_SNAPSHOTS}/$name") bytes)"
""".encode()


def service() -> bytes:
    return f"""# managed by gpuk8s (control_plane, etcd_backup_schedule)
[Unit]
Description=gpuk8s: a local etcd snapshot
After=kubelet.service

[Service]
Type=oneshot
ExecStart={SCRIPT}
""".encode()


def timer(schedule: str) -> bytes:
    return f"""# managed by gpuk8s (control_plane, etcd_backup_schedule)
[Unit]
Description=gpuk8s: local etcd snapshots ({schedule})

[Timer]
OnCalendar={schedule}
Persistent=true
RandomizedDelaySec=60

[Install]
WantedBy=timers.target
""".encode()


def facts() -> list[Any]:
    """The timer's files and unit, and the snapshots it took (status shows them)."""
    return [Files("+" + SCRIPT, "+" + SERVICE, "+" + TIMER), Services(f"{NAME}.timer"),
            LocalSnapshots()]


def plan(facts_of: Any, schedule: str, keep: int) -> list[Op]:
    """The timer as the schedule asks; ``facts_of``: the host's facts."""
    states = facts_of[Files("+" + SCRIPT, "+" + SERVICE, "+" + TIMER)]
    unit = facts_of[Services(f"{NAME}.timer")][f"{NAME}.timer"]
    schedule = schedule.strip()
    if not schedule:
        there = [p for p in PATHS if states[p].exists]
        if not there:
            return [noop("control_plane | etcd snapshot timer",
                         "= no local etcd snapshots scheduled (etcd_backup_schedule)")]
        return [change("control_plane | etcd snapshot timer",
                       f"- remove the etcd snapshot timer (etcd_backup_schedule is empty; the "
                       f"snapshots in {LOCAL_SNAPSHOTS} stay)",
                       f"systemctl disable --now {NAME}.timer 2>/dev/null || true",
                       f"rm -f {' '.join(PATHS)}", "systemctl daemon-reload")]
    notify = ("restart etcd snapshot timer",)
    ops = [
        change("control_plane | etcd snapshot schedule",
               f"+ check the schedule {schedule!r} (systemd-analyze calendar)",
               f"systemd-analyze calendar -- {q(schedule)} >/dev/null")
        if states[TIMER].sha256 != sha256(timer(schedule)) else
        noop("control_plane | etcd snapshot schedule", f"= schedule {schedule!r}"),
        file_ops.content(states[SCRIPT], "control_plane | etcd snapshot script", script(keep),
                         mode="0755", notify=notify),
        file_ops.content(states[SERVICE], "control_plane | etcd snapshot service", service(),
                         notify=notify),
        file_ops.content(states[TIMER], "control_plane | etcd snapshot timer", timer(schedule),
                         notify=notify),
    ]
    if unit.enabled == "enabled" and unit.active == "active":
        ops.append(noop("control_plane | etcd snapshot timer on",
                        f"= {NAME}.timer enabled and waiting"))
    elif not any(op.changes for op in ops[1:]):
        ops.append(change("control_plane | etcd snapshot timer on",
                          f"+ enable and start {NAME}.timer",
                          f"systemctl enable --now {NAME}.timer"))
    return ops


def restart_timer() -> Op:
    return change("control_plane | restart etcd snapshot timer",
                  f"restart {NAME}.timer", "systemctl daemon-reload",
                  f"systemctl enable {NAME}.timer", f"systemctl restart {NAME}.timer")
