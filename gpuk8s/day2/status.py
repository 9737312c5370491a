"""What the cluster looks like (status, with drift) and the admin kubeconfig."""

from __future__ import annotations

import datetime as dt
import json
import textwrap
from contextlib import closing
from pathlib import Path
from typing import Any

from rich.text import Text

from gpuk8s import backups
from gpuk8s.accept.command import LABEL, TAINT, quarantined
from gpuk8s.day2.gpuusage import node_utilisation
from gpuk8s.day2.kernelstatus import kernel_lines, kernel_row
from gpuk8s.errors import Gpuk8sError, PreflightError
from gpuk8s.facts.certs import CertExpiry, CertState, days_left, expiry_warning
from gpuk8s.facts.controlplane import (
    LOCAL_SNAPSHOT_RE,
    LOCAL_SNAPSHOTS,
    ControlPlaneHealth,
    ControlPlaneHealthState,
    LocalSnapshots,
)
from gpuk8s.facts.kube import ADMIN_CONF, Cluster, Containerd
from gpuk8s.facts.nvidia import CudaToolkits, Nvidia
from gpuk8s.facts.system import Packages, PciDevices
from gpuk8s.facts.xid import XidEvents
from gpuk8s.gather import gathered_session
from gpuk8s.handoffs import fetch_admin_conf
from gpuk8s.ops.kube import KUBE_PACKAGES
from gpuk8s.playbook import PHASES
from gpuk8s.report import Cell, Column, Reporter
from gpuk8s.runner import phase_hosts, plan_phase, preflight
from gpuk8s.session import DEFAULT_OPENER, Opener, Session, open_session


# -- status -----------------------------------------------------------------------------------
def status(inventory: str | Path, *, as_json: bool = False, wide: bool = False,
           reporter: Reporter | None = None,
           opener: Opener = DEFAULT_OPENER) -> list[dict[str, Any]]:
    """One row per host: role, Ready, versions, GPUs, allocatable nvidia.com/gpu and drift
    (how many changes `plan` would make), or, for a host preflight refuses (so `plan` and
    bootstrap stop before planning it), "preflight": its problems and no drift. Unreachable
    hosts are rows too. The table shows the columns of kubectl's default view; ``wide``
    (``-o wide``) every column."""
    session = gathered_session(inventory, None, "status", reporter=reporter, opener=opener,
                               allow_unreachable=True, any_control_plane=True)
    with closing(session):
        cluster = session.facts[session.first_cp][Cluster()]
        refused = _refused(session)
        drift: dict[str, int] = {}
        for phase in PHASES:
            if session.lead and phase.hosts == "first_control_plane":
                continue  # the first control plane's own work: it did not answer
            work = plan_phase(session, phase, phase_hosts(session, phase))
            for planned_host, items in work.items():
                n = sum(op.changes for rw in items for op in rw.ops)
                drift[planned_host] = drift.get(planned_host, 0) + n
        util = _utilisation(session)
        rows = []
        for name, host in session.inventory.hosts.items():
            row: dict[str, Any] = {"host": name, "role": "control-plane"
                                   if host.is_control_plane else "worker"}
            if host.absent:
                rows.append({**row, "state": "absent"})
                continue
            if not (host.is_control_plane or host.is_worker):
                rows.append({**row, "role": "none", "state": "skipped (not a cluster member)"})
                continue
            if name in session.unreachable:
                rows.append({**row, "state": "unreachable",
                             "error": str(session.unreachable[name])})
                continue
            facts = session.facts[name]
            node = session.cluster["nodes"][name]
            kube = cluster.nodes.get(node["name"])
            pkgs = facts.get(Packages(*KUBE_PACKAGES)) or {}
            nv = facts[Nvidia()]
            gpus = [d for d in facts[PciDevices()] if d.is_gpu]
            if kube:
                state = "Ready" if kube.ready else "NotReady"
            elif cluster.error:  # the API did not answer: the node's state is not known
                state = "unknown (the API does not answer)"
            else:
                state = "not joined"
            rows.append({
                **row, "node": node["name"], "state": state,
                "cordoned": bool(kube and kube.unschedulable),
                **({"gpu_quarantine": {
                    "reason": kube.labels.get(LABEL, ""), "detail": kube.gpu_unhealthy}}
                   if kube is not None and quarantined(kube) else {}),
                **({"xids": [{"xid": e.xid, "bus": e.bus, "uptime_s": e.uptime_s,
                              "fatal": e.fatal, "text": e.text}
                             for e in facts.get(XidEvents()) or ()]} if gpus else {}),
                **({"unhealthy_gpus": kube.gpu_capacity - kube.gpu_allocatable}
                   if kube and kube.gpu_capacity is not None and kube.gpu_allocatable
                   is not None and kube.gpu_capacity > kube.gpu_allocatable else {}),
                "kubelet": pkgs["kubelet"].version.split("-")[0] if "kubelet" in pkgs else "",
                "containerd": facts[Containerd()].version,
                "driver": nv.loaded_version if nv.exit_code == 0 else
                ("not loaded" if nv.smi_present else ""),
                "cuda": ",".join(sorted(facts[CudaToolkits()].values())),
                "gpus": len(gpus), "gpu_model": gpus[0].model if gpus else "",
                "allocatable_gpu": kube.gpu_allocatable if kube else None,
                **({"gpu_util": util.get(node["name"])} if util is not None and gpus else {}),
                "drift": None if name in refused else drift.get(name, 0),
                **({"preflight": [{"check": c, "problem": m, "fix": f}
                                  for c, m, f in refused[name]]} if name in refused else {}),
                **_control_plane(facts[ControlPlaneHealth()]),
                **(_certificates(facts[CertExpiry()]) if host.is_control_plane else {}),
            })
            kernel = kernel_row(facts, bool(host.vars.get("gpu_node_lock", True)))
            if kernel is not None:
                rows[-1]["kernel"] = kernel
        backup = newest_backup(session.inventory.path)
        first = session.inventory.control_planes[0].name
        local = None
        for r in rows:  # the cluster's newest backups, on the first control plane's row
            if r["host"] == first:
                r["backup"] = backup
                if first in session.facts:
                    local = local_snapshots(session.facts[first].get(LocalSnapshots()) or (),
                                            str(session.host(first).vars.get(
                                                "etcd_backup_schedule") or ""))
                    r["local_snapshots"] = local
        session.runlog.write_report(status=rows)
        _print_status(session.reporter, rows, as_json, wide=wide)
        if not as_json and (line := quorum(rows)):
            session.reporter.print(line, style="green" if "NO QUORUM" not in line else "red")
        if not as_json:
            for line, style in certificate_lines(rows):
                session.reporter.print(line, style=style)
            line, style = backup_line(backup)
            session.reporter.print(line, style=style)
            if local and (local["count"] or local["schedule"]):
                line, style = local_snapshot_line(first, local)
                session.reporter.print(line, style=style)
        return rows


def _certificates(state: CertState) -> dict[str, Any]:
    """A control plane's certificates: the earliest leaf (what `kubeadm certs renew all`
    renews, and the kubelet's client certificate) and CA expiry, and the warning."""
    leaf, ca = state.earliest(), state.earliest(cas=True)
    if leaf is None:
        return {}
    now = dt.datetime.now(dt.UTC)
    return {"certificates": {
        "earliest": leaf[1].strftime("%Y-%m-%dT%H:%M:%SZ"), "file": leaf[0],
        "days_left": days_left(leaf[1], now),
        "ca_earliest": ca[1].strftime("%Y-%m-%dT%H:%M:%SZ") if ca else None,
        "warning": expiry_warning(state, now)}}


def certificate_lines(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """status's lines about the control planes' certificates: one line for all that are fine,
    one warning per control plane whose certificates expire within 30 days."""
    fine = []
    out: list[tuple[str, str]] = []
    for r in rows:
        certs = r.get("certificates")
        if not certs:
            continue
        if certs["warning"]:
            style = "red" if certs["days_left"] < 7 else "yellow"
            out += [(line, style) for line in textwrap.wrap(
                f"warning: {r['host']}: {certs['warning']}", 80, subsequent_indent="  ",
                break_on_hyphens=False)]
        else:
            fine.append(f"{r['host']} until {certs['earliest'][:10]} ({certs['days_left']} d)")
    if fine:
        out[:0] = [(line, "green") for line in textwrap.wrap(
            "certificates: " + ", ".join(fine), 80, subsequent_indent="  ")]
    return out


#: a backup older than this is called old in status
BACKUP_OLD_DAYS = 7


def newest_backup(inventory_path: str | Path) -> dict[str, Any] | None:
    """The cluster's newest backup on this machine: its folder and age in seconds."""
    found = backups.newest(inventory_path)
    if found is None:
        return None
    folder, age = found
    return {"path": str(folder), "age_s": int(age.total_seconds()),
            "count": len(backups.listed(inventory_path))}


def backup_line(backup: dict[str, Any] | None) -> tuple[str, str]:
    """status's line about backups, and its style."""
    if backup is None:
        return "backup: none here yet (invoke backup takes one)", "yellow"
    age = backup["age_s"]
    words = (f"{age // 86400} d" if age >= 86400 else f"{age // 3600} h" if age >= 3600
             else f"{age // 60} min")
    old = age >= BACKUP_OLD_DAYS * 86400
    return (f"backup: {Path(backup['path']).name}, {words} old" +
            (": take one (invoke backup)" if old else f" ({backup['count']} kept)"),
            "yellow" if old else "green")


def local_snapshots(names: tuple[str, ...] | list[str], schedule: str) -> dict[str, Any]:
    """The first control plane's scheduled local etcd snapshots (etcd_backup_schedule): how
    many, the newest and its age."""
    newest = names[-1] if names else ""
    age = None
    if (m := LOCAL_SNAPSHOT_RE.fullmatch(newest)) is not None:
        made = dt.datetime.strptime(m.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
        age = int((dt.datetime.now(dt.UTC) - made).total_seconds())
    return {"count": len(names), "newest": newest, "age_s": age, "schedule": schedule}


def local_snapshot_line(host: str, local: dict[str, Any]) -> tuple[str, str]:
    """status's line about the local snapshots, and its style."""
    if not local["count"]:
        return (f"etcd snapshots on {host}: none yet (etcd_backup_schedule "
                f"{local['schedule']!r})", "yellow")
    age = local["age_s"] or 0
    words = (f"{age // 86400} d" if age >= 86400 else f"{age // 3600} h" if age >= 3600
             else f"{age // 60} min")
    return (f"etcd snapshots on {host}: {local['count']} in {LOCAL_SNAPSHOTS}, the newest "
            f"{words} old", "green" if local["schedule"] else "yellow")


def _refused(session: Session) -> dict[str, list[tuple[str, str, str]]]:
    """The problems preflight finds per host (the hosts `plan` and bootstrap refuse); {}
    when it accepts them all."""
    try:
        preflight(session, show=False)
    except PreflightError as exc:
        return {h: list(p) for h, p in exc.problems.items() if p}
    return {}


def _utilisation(session: Session) -> dict[str, float] | None:
    """Mean GPU utilisation per node from the cluster's Prometheus; None when gpu_monitoring
    is off, {} (said once) when it does not answer."""
    if not session.host(session.first_cp).vars.get("gpu_monitoring"):
        return None
    try:
        return node_utilisation(session)
    except Gpuk8sError as exc:
        session.reporter.print(f"GPU utilisation unknown: {str(exc).splitlines()[0]}")
        return {}


def _control_plane(health: ControlPlaneHealthState) -> dict[str, Any]:
    if not health.present:
        return {}
    return {"control_plane": health.words, "etcd_healthy": health.etcd_healthy,
            "etcd_members": list(health.members), "api_ready": health.api_ready}


def quorum(rows: list[dict[str, Any]]) -> str:
    """The stacked etcd's quorum in words, from the control planes' rows ("" with none)."""
    cps = [r for r in rows if r["role"] == "control-plane" and r["state"] != "absent"]
    seen = [r for r in cps if "etcd_healthy" in r]
    if not seen and not any(r["state"] == "unreachable" for r in cps):
        return ""
    members = max([len(r["etcd_members"]) for r in seen] + [len(cps)])
    need = members // 2 + 1
    up = [r["host"] for r in seen if r["etcd_healthy"] is not None]  # its etcd answers
    healthy = [r["host"] for r in seen if r["etcd_healthy"]]
    down = ", ".join(f"{r['host']} ({_why(r)})" for r in cps if r["host"] not in healthy)
    if len(healthy) >= need:
        return (f"etcd: {len(healthy)} of {members} members healthy (a majority is {need}): "
                "the cluster accepts writes" + (f"; not healthy: {down}" if down else ""))
    if len(up) >= need:
        return (f"etcd: {len(up)} of {members} members are up but not healthy (electing a "
                f"leader?): {down}. Run status again in a minute.")
    return (f"etcd has NO QUORUM: {len(up)} of {members} members are up "
            f"({', '.join(up) or 'none'}) and etcd needs {need} to elect a leader: the API "
            f"servers refuse writes until {need - len(up)} more control plane(s) are back; "
            f"not healthy: {down}. Start those hosts: their etcd members rejoin by themselves.")


def _why(row: dict[str, Any]) -> str:
    if row["state"] == "unreachable":
        return "unreachable"
    return "etcd unhealthy" if row.get("etcd_healthy") is False else "etcd not answering"


#: the status table: kubectl's default view (fits 80 columns with host names of 20
#: characters), then what ``-o wide`` adds
STATUS_COLUMNS = (Column("host"), Column("role"), Column("state"),
                  Column("gpus", justify="right"), Column("offered", justify="right"),
                  Column("plan"), Column("gpu model", wide=True), Column("gpu util", wide=True),
                  Column("driver", wide=True), Column("cuda", wide=True),
                  Column("kubelet", wide=True), Column("containerd", wide=True),
                  Column("etcd / API", wide=True))


def _print_status(rep: Reporter, rows: list[dict[str, Any]], as_json: bool, *,
                  wide: bool = False) -> None:
    if as_json:
        rep.console.print(json.dumps(rows, indent=2), markup=False, highlight=False)
        return
    cells: list[list[Cell]] = []
    for r in rows:
        alloc = r.get("allocatable_gpu")
        state = r["state"] + (" (GPU quarantine)" if r.get("gpu_quarantine") else
                               " (cordoned)" if r.get("cordoned") else "")
        cells.append([r["host"], r["role"], state, _dash(r.get("gpus")),
                      _dash(alloc), _plan(r), _dash(r.get("gpu_model")), _util(r),
                      _dash(r.get("driver")), _dash(r.get("cuda")), _dash(r.get("kubelet")),
                      _dash(r.get("containerd")), _dash(r.get("control_plane"))])
    rep.table("cluster status", STATUS_COLUMNS, cells, wide=wide)
    for r in rows:  # each GPU node's kernel and driver, and what needs the admin
        for text, style in kernel_lines(r["host"], r["kernel"]) if r.get("kernel") else ():
            rep.console.print(rep.cell(text, style), soft_wrap=True)
    for r in rows:  # what the GPUs' driver and the device plugin say went wrong
        fatal = [x for x in r.get("xids", []) if x["fatal"]]
        if r.get("xids"):
            last = r["xids"][-1]
            rep.console.print(Text.assemble(
                rep.cell(r["host"], "bold"), f": {len(r['xids'])} Xid event(s) since boot "
                f"({len(fatal)} needing a GPU reset or a reboot); last: Xid {last['xid']} on ",
                rep.cell(last["bus"]), f" at {last['uptime_s']:.0f} s",
                style="red" if fatal else "yellow"), soft_wrap=True)
        if r.get("unhealthy_gpus"):
            rep.console.print(Text.assemble(
                rep.cell(r["host"], "bold"), f": the device plugin reports "
                f"{r['unhealthy_gpus']} GPU(s) unhealthy (capacity above allocatable)"),
                style="red", soft_wrap=True)
    for r in rows:  # GPU nodes `invoke accept` quarantined, and why
        if q := r.get("gpu_quarantine"):
            rep.console.print(Text.assemble(
                rep.cell(r["host"], "bold"), f" is quarantined ({TAINT}=",
                rep.cell(q["reason"]), "): ", rep.cell(q["detail"] or "no reason recorded"),
                f"; after fixing it: invoke release --host {r['host']}", style="red"),
                soft_wrap=True)
    for r in rows:  # why a host is refused: the checks and their problems, short
        if r.get("preflight"):
            rep.console.print(Text.assemble(rep.cell(r["host"], "bold"), " is refused by "
                                            "preflight (invoke plan shows the fixes):",
                                            style="red"), soft_wrap=True)
            for p in r["preflight"]:
                rep.console.print(Text.assemble("  ", rep.cell(p["check"]), ": ",
                                                rep.cell(p["problem"])), soft_wrap=True)


def _dash(value: Any) -> str:
    """A value as its cell; "-" where there is none (kubectl's <none>), so that every line
    of the plain table has as many fields as its header."""
    return "-" if value is None or value == "" else str(value)


def _plan(row: dict[str, Any]) -> str:
    """What `plan` would do to the host: in sync, N changes, or refused by preflight."""
    if row.get("preflight"):
        return "refused"
    drift = row.get("drift")
    if drift is None or drift == "":
        return "-"
    return "in sync" if drift == 0 else f"{drift} change" + ("s" if drift != 1 else "")


def _util(row: dict[str, Any]) -> str:
    if "gpu_util" not in row:
        return "-"
    return "unknown" if row["gpu_util"] is None else f"{row['gpu_util']:.0f} %"


# -- kubeconfig -------------------------------------------------------------------------------
def kubeconfig(inventory: str | Path, *, reporter: Reporter | None = None,
               opener: Opener = DEFAULT_OPENER) -> Path:
    """Fetch admin credentials to <inventory dir>/artifacts/admin.conf (0600)."""
    from gpuk8s.inventory import load_inventory

    cp = load_inventory(inventory).control_planes[0].name
    session = open_session(inventory, limit=cp, sets=(), command="kubeconfig",
                               reporter=reporter, opener=opener)
    with closing(session):
        path = fetch_admin_conf(session)
        if path is None:
            raise Gpuk8sError(f"{cp}: no {ADMIN_CONF}: the cluster is not "
                              "initialised (run invoke bootstrap)")
        session.reporter.print(f"admin kubeconfig: {path} (0600)\n"
                               f"  export KUBECONFIG={path}")
        return path
