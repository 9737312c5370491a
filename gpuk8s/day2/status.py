"""What the cluster looks like (status, with drift) and the admin kubeconfig."""

from __future__ import annotations

import json
from contextlib import closing
from pathlib import Path
from typing import Any

from gpuk8s.day2.gpuusage import node_utilisation
from gpuk8s.day2.steps import Opener, gathered_session
from gpuk8s.errors import Gpuk8sError
from gpuk8s.facts.controlplane import ControlPlaneHealth, ControlPlaneHealthState
from gpuk8s.facts.kube import ADMIN_CONF, Cluster, Containerd
from gpuk8s.facts.nvidia import CudaToolkits, Nvidia
from gpuk8s.facts.system import Packages, PciDevices
from gpuk8s.handoffs import fetch_admin_conf
from gpuk8s.ops.kube import KUBE_PACKAGES
from gpuk8s.playbook import PHASES
from gpuk8s.report import Reporter
from gpuk8s.runner import phase_hosts, plan_phase
from gpuk8s.session import Session, open_session
from gpuk8s.transport import open_transport


# -- status -----------------------------------------------------------------------------------
def status(inventory: str | Path, *, as_json: bool = False, reporter: Reporter | None = None,
           opener: Opener = open_transport) -> list[dict[str, Any]]:
    """One row per host: role, Ready, versions, GPUs, allocatable nvidia.com/gpu and drift
    (how many changes `plan` would make). Unreachable hosts are rows too."""
    session = gathered_session(inventory, None, "status", reporter=reporter, opener=opener,
                               allow_unreachable=True, any_control_plane=True)
    with closing(session):
        cluster = session.facts[session.first_cp][Cluster()]
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
                "kubelet": pkgs["kubelet"].version.split("-")[0] if "kubelet" in pkgs else "",
                "containerd": facts[Containerd()].version,
                "driver": nv.loaded_version if nv.exit_code == 0 else
                ("not loaded" if nv.smi_present else ""),
                "cuda": ",".join(sorted(facts[CudaToolkits()].values())),
                "gpus": len(gpus), "gpu_model": gpus[0].model if gpus else "",
                "allocatable_gpu": kube.gpu_allocatable if kube else None,
                **({"gpu_util": util.get(node["name"])} if util is not None and gpus else {}),
                "drift": drift.get(name, 0),
                **_control_plane(facts[ControlPlaneHealth()]),
            })
        session.runlog.write_report(status=rows)
        _print_status(session.reporter, rows, as_json)
        if not as_json and (line := quorum(rows)):
            session.reporter.print(line, style="green" if "NO QUORUM" not in line else "red")
        return rows


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


def _print_status(rep: Reporter, rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        rep.console.print(json.dumps(rows, indent=2), markup=False, highlight=False)
        return
    from rich.table import Table

    table = Table(title="cluster status", title_justify="left")
    cols = ("host", "role", "state", "kubelet", "containerd", "driver", "cuda", "gpus",
            "alloc gpu", "gpu util", "etcd / API", "drift")
    for col in cols:
        table.add_column(col)
    for r in rows:
        gpus = f"{r['gpus']} x {r['gpu_model']}" if r.get("gpus") else ("0" if "gpus" in r
                                                                        else "")
        alloc = r.get("allocatable_gpu")
        state = r["state"] + (" (cordoned)" if r.get("cordoned") else "")
        table.add_row(rep.cell(r["host"]), rep.cell(r["role"]), rep.cell(state),
                      rep.cell(r.get("kubelet", "")), rep.cell(r.get("containerd", "")),
                      rep.cell(r.get("driver", "")), rep.cell(r.get("cuda", "")),
                      rep.cell(gpus), "" if alloc is None else str(alloc), _util(r),
                      rep.cell(r.get("control_plane", "")), str(r.get("drift", "")))
    rep.console.print(table)


def _util(row: dict[str, Any]) -> str:
    if "gpu_util" not in row:
        return ""
    return "unknown" if row["gpu_util"] is None else f"{row['gpu_util']:.0f} %"


# -- kubeconfig -------------------------------------------------------------------------------
def kubeconfig(inventory: str | Path, *, reporter: Reporter | None = None,
               opener: Opener = open_transport) -> Path:
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
