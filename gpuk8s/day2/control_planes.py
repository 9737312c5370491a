"""Day-2 on control planes beyond the first: remove one (its etcd member leaves with it, the
etcd quorum guarded), and the member removal of a dead one through a live etcd.

Only the control planes are contacted. The first control plane (the one that ran `kubeadm
init`, which speaks for the cluster) is not removed this way: list another one first in the
inventory, bootstrap, then remove it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from gpuk8s.backups import before_change
from gpuk8s.day2.steps import (
    CLEANUP,
    ask_confirmation,
    node_name,
    run_step,
)
from gpuk8s.drain import drain
from gpuk8s.errors import Gpuk8sError, InventoryError
from gpuk8s.facts.controlplane import ETCD_PKI, ControlPlaneHealth
from gpuk8s.facts.kube import Cluster
from gpuk8s.gather import gathered_session
from gpuk8s.ops.kube import KUBECTL
from gpuk8s.report import Reporter
from gpuk8s.session import DEFAULT_OPENER, Opener, Session
from gpuk8s.sinks import node_arg

#: etcd's v3 JSON gateway on the first control plane, with kubeadm's health-check client
#: certificate (kubeadm's etcd has no user auth: any certificate of its CA may manage members)
ETCD_API = (f"curl -s --fail-with-body --max-time 10 --cacert {ETCD_PKI}/ca.crt "
            f"--cert {ETCD_PKI}/healthcheck-client.crt --key {ETCD_PKI}/healthcheck-client.key "
            "-X POST https://127.0.0.1:2379/v3/cluster/member")


#: up to 60 s for the first control plane's API server to answer /readyz (its etcd member
#: healthy, a leader elected)
WAIT_READY = (f"i=0; until {KUBECTL} --request-timeout=5s get --raw /readyz >/dev/null 2>&1; do "
              "i=$((i+1)); [ $i -lt 60 ] || { echo 'the API server did not become ready in "
              "60s' >&2; exit 1; }; sleep 1; done")


def etcd_members(session: Session) -> dict[str, str]:
    """name -> member ID, as the first control plane's etcd lists them."""
    out = run_step(session, session.first_cp, f"{ETCD_API}/list -d '{{}}'", "etcd member list")
    try:
        listed = json.loads(out).get("members", [])
    except (ValueError, AttributeError):
        raise Gpuk8sError(f"{session.first_cp}: etcd's member list is not JSON: "
                          f"{out.strip()[-200:]!r}") from None
    return {str(m.get("name", "")): str(m["ID"]) for m in listed}


def remove_etcd_member(session: Session, name: str) -> bool:
    """Remove the member called ``name`` through the first control plane's etcd; False when
    there is none."""
    member = etcd_members(session).get(name)
    if member is None:
        return False
    if not re.fullmatch(r"[0-9]{1,20}", member):  # a uint64, as etcd writes it
        raise Gpuk8sError(f"etcd member ID {member!r} of {name!r} is not a number")
    run_step(session, session.first_cp, f"{ETCD_API}/remove -d '{{\"ID\":\"{member}\"}}'",
             f"etcd member remove {name}")
    return True


def quorum_after_removal(session: Session, host: str, members: int) -> None:
    """Refuse a removal that would leave etcd without a majority of healthy members."""
    healthy = {h for h in session.facts
               if session.host(h).is_control_plane
               and session.facts[h][ControlPlaneHealth()].etcd_healthy}
    left, remaining = members - 1, len(healthy - {host})
    need = left // 2 + 1
    if left < 1:
        raise Gpuk8sError(f"{host} holds the last etcd member: removing it ends the cluster "
                          "(use invoke reset)")
    if remaining < need:
        raise Gpuk8sError(
            f"removing {host} would leave {remaining} healthy etcd member(s) of {left}, and "
            f"etcd needs {need}: the cluster would stop accepting writes. Healthy now: "
            f"{', '.join(sorted(healthy)) or 'none'}. Bring the other control planes back "
            "first (status shows which), then remove it")


def remove_control_plane(inventory: str | Path, host: str, *, drain_timeout: int = 300,
                         yes: bool = False, reporter: Reporter | None = None,
                         confirm: Callable[[str], bool] | None = None,
                         opener: Opener = DEFAULT_OPENER, backup: bool = True) -> dict[str, Any]:
    """Drain it, `kubeadm reset` on it (kubeadm removes its etcd member), delete its Node. A
    dead one: its etcd member removed through a live etcd, its Node deleted."""
    session = gathered_session(inventory, "control_plane", "remove-node", reporter=reporter,
                               opener=opener, allow_unreachable=True)
    with closing(session):
        rep = session.reporter
        if host == session.inventory.control_planes[0].name:
            raise InventoryError(
                f"{host} is the first control plane (the one that speaks for the cluster)",
                path=str(session.inventory.path),
                fix=f"list another control plane first under control_plane, run invoke "
                f"bootstrap, then remove {host}")
        dead = host in session.unreachable
        node = node_name(session, host)
        members = etcd_members(session)
        quorum_after_removal(session, host, len(members))
        rep.phase(f"remove control plane {host} (node {node})")
        if dead:
            rep.print(f"  ! {host} is unreachable ({session.unreachable[host]}): its etcd "
                      "member is removed through a live one; reset the box by hand "
                      "(kubeadm reset -f) before reusing it", style="magenta")
            rep.print(f"  + etcd member remove {host} (on {session.first_cp})")
        else:
            rep.print(f"  + drain node {node}")
            rep.print(f"  + kubeadm reset on {host} (removes its etcd member) and clean up")
        rep.print(f"  + delete node {node}")
        ask_confirmation(f"remove control plane {host}? [y/N] ", yes, confirm)
        before_change(session, f"removing control plane {host}", backup)
        cluster = session.facts[session.first_cp][Cluster()]
        if not dead:
            if node in cluster.nodes:
                drain(session, node, drain_timeout)
            run_step(session, host, CLEANUP, "kubeadm reset and cleanup")
        # kubeadm reset leaves the member behind when it cannot reach etcd: remove it here
        if remove_etcd_member(session, host) and not dead:
            rep.print(f"  ! kubeadm reset left {host}'s etcd member: removed through "
                      f"{session.first_cp}", style="magenta")
        # a member leaving (the leader, maybe) makes etcd elect again: wait for the API
        run_step(session, session.first_cp, WAIT_READY, "wait for the API after the change")
        if node in cluster.nodes:
            run_step(session, session.first_cp, f"{KUBECTL} delete node {node_arg(node)}",
                     f"delete node {node}")
        left = sorted(etcd_members(session))
        session.runlog.write_report(removed=host, dead=dead, etcd_members=left)
        rep.print(f"removed {host}; etcd members now: {', '.join(left)}. Mark it absent: "
                  "true in the inventory (an odd number of control planes stays listed) or add "
                  f"it back with invoke add-node --host {host}")
        return {"removed": host, "dead": dead, "etcd_members": left,
                "contacted": sorted(session.transports)}
