"""`invoke restore --from DIR`: the cluster brought back from a backup (gpuk8s/backups.py) on
its first control plane.

- The first control plane was lost (its disk, a reinstall, a mistaken reset): the backup's PKI
  goes back under /etc/kubernetes/pki, `invoke bootstrap` on that host alone runs kubeadm init,
  which keeps an existing CA, service-account key and certificates (kubeadm's "certs" phase
  reuses the files it finds), and then etcd's data is replaced by the snapshot. The workers
  keep their kubelets: the same CA signed their client certificates and the endpoint did not
  move, so they come back Ready without a new join, their pods still running.
- The first control plane runs: its etcd data is rolled back to the snapshot (a backup of the
  present state is taken first, unless --no-backup or no member is healthy).
- Several control planes whose etcd lost its quorum for good: the others are reset (kubeadm
  reset), the first is restored as a one-member etcd, and each other is joined again as a new
  member through bootstrap's control-plane-join phase (invoke add-node). One that is
  unreachable is left out, with what to do. A lost first control plane whose peers still hold
  a healthy quorum is refused (still_serving): that is a replacement, not a restore.

The snapshot goes in through the etcdutl of the node's own etcd container (`crictl exec`):
registry.k8s.io/etcd from 3.6.6 on is etcd's own release image, whose /usr/local/bin holds
etcd, etcdctl and etcdutl (Dockerfile@v3.6.6 of etcd-io/etcd); etcdctl has no `snapshot
restore` any more in 3.6 (etcdctl/ctlv3/command/snapshot_command.go@v3.6.0). etcdutl writes a
new data dir inside etcd's own hostPath mount, then etcd and the control plane's static pods
are stopped (their manifests moved out), the member dirs swapped, and the manifests put back.
etcd's previous data stays beside it, in <data dir>/gpuk8s-before-restore.<time>.

Refused before anything changes: a backup whose files do not match their checksums (or whose
snapshot is not whole), one whose CA is not the CA the nodes trust (another cluster), and one
taken on a newer Kubernetes than the inventory installs.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from gpuk8s import backups
from gpuk8s.backups import SNAPSHOT, BackupError, before_change, pem_fingerprint, verify
from gpuk8s.day2.certs import MANIFESTS, STOP_WAIT, static_pods_out
from gpuk8s.day2.control_planes import WAIT_READY
from gpuk8s.day2.steps import CLEANUP, ask_confirmation, run_step
from gpuk8s.errors import Gpuk8sError
from gpuk8s.facts.controlplane import CRICTL, ETCD_CONTAINER, TCP_OPEN, ControlPlaneHealth
from gpuk8s.gather import gathered_session
from gpuk8s.handoffs import fetch_admin_conf
from gpuk8s.ops.kube import KUBECTL, release
from gpuk8s.report import Reporter, untrusted
from gpuk8s.session import DEFAULT_OPENER, Opener, Session
from gpuk8s.sinks import node_arg

PKI = "/etc/kubernetes/pki"
#: kubeadm's local etcd data dir (etcd.local.dataDir's default), as roles/control_plane has it
ETCD_DATA = "/var/lib/etcd"
ETCD_MANIFEST = f"{MANIFESTS}/etcd.yaml"
#: in etcd's data dir (the container mounts it at the same path): the uploaded snapshot and
#: the data dir etcdutl makes from it
UPLOADED, RESTORED = "gpuk8s-restore.db", "gpuk8s-restored"
#: seconds the nodes have to report Ready after the restore
NODES_READY_WAIT = 300


class RestoreRefused(BackupError):
    """A backup that does not belong on this cluster, or a cluster this restore cannot do."""


def refusals(manifest: dict[str, Any], kubernetes_version: str,
             cas: dict[str, str]) -> list[str]:
    """Why this backup must not be restored here ([] when it may): its Kubernetes against the
    inventory's ``kubernetes_version`` (to its precision: "1.36" or "1.36.2"), and its CA
    against the fingerprint of the CA each reached node trusts (``cas``: host -> SHA-256)."""
    why = []
    theirs = release(str(manifest.get("kubernetes_version", "")))
    ours = release(kubernetes_version)
    if not theirs:
        why.append("the backup names no Kubernetes version (its manifest's "
                   "kubernetes_version is empty): gpuk8s cannot tell whether this cluster "
                   "can read it")
    elif ours and theirs[:len(ours)] > ours:
        why.append(f"the backup was taken on Kubernetes v{'.'.join(map(str, theirs))}, newer "
                   f"than the {kubernetes_version} this inventory installs: an older API "
                   "server may not read what a newer one stored. Set kubernetes_version to "
                   "that release (invoke upgrade first), or restore an older backup")
    want = str(manifest.get("ca_sha256", ""))
    other = sorted(h for h, fp in cas.items() if fp != want)
    if other:
        why.append(f"the backup's cluster CA (SHA-256 {want[:16]}...) is not the CA "
                   f"{', '.join(other)} trust(s) ({cas[other[0]][:16]}...): it is another "
                   "cluster's backup. Use one of this cluster's (artifacts/backups), or reset "
                   "those nodes first")
    return why


def still_serving(first: str, healthy: dict[str, bool | None]) -> str:
    """Why a lost first control plane must not be rebuilt from a backup while other members
    still hold etcd's data ("" when none does): the restore would roll the whole cluster back
    to the backup."""
    live = sorted(h for h, ok in healthy.items() if ok)
    if not live:
        return ""
    return (f"{first} is lost, but the etcd members of {', '.join(live)} are healthy: they "
            "hold the cluster's present data, and a restore would roll it back to the backup. "
            f"Replace {first} without a restore instead: list {live[0]} first under "
            f"control_plane, then `invoke remove-node {first}` (its dead member leaves etcd) "
            f"and, once the box is back, `invoke add-node --host {first}`")


def swap_script(data_dir: str) -> str:
    """On the first control plane, with the snapshot uploaded to <data dir>/UPLOADED: etcdutl
    (in the running etcd container) makes a one-member data dir from it for this member's
    name and peer URL (read from kubeadm's etcd.yaml: local.go of kubeadm's etcd phase writes
    --name, --initial-advertise-peer-urls and --data-dir there); the static pods stop, the
    member dirs are swapped, the pods start again (their manifests go back whatever
    happens)."""
    snap, out = f"{data_dir}/{UPLOADED}", f"{data_dir}/{RESTORED}"
    return f"""set -eu
umask 077
flag() {{ sed -n "s/^ *- --$1=//p" {ETCD_MANIFEST} | head -n 1 | tr -d '"'; }}
name=$(flag name); peer=$(flag initial-advertise-peer-urls); dir=$(flag data-dir)
if [ -z "$name" ] || [ -z "$peer" ] || [ "$dir" != "{data_dir}" ]; then
  echo "{ETCD_MANIFEST} names no --name/--initial-advertise-peer-urls, or its --data-dir is" \\
    "not {data_dir}: is this kubeadm's local etcd?" >&2
  rm -f {snap}; exit 3
fi
{ETCD_CONTAINER}
[ -n "$id" ] || {{ echo "no running etcd container to restore with" >&2; rm -f {snap}; exit 3; }}
if ! {CRICTL} exec "$id" etcdutl version >/dev/null 2>&1; then
  echo "the etcd container has no etcdutl (registry.k8s.io/etcd carries it from 3.6.6 on;" \
    "etcdctl 3.6 no longer restores): move etcd's image on, or restore by hand with an" \
    "etcdutl of the same etcd release" >&2
  rm -f {snap}; exit 5
fi
rm -rf {out}
log=$(mktemp)
if ! {CRICTL} exec "$id" etcdutl snapshot restore {snap} --data-dir {out} \\
    --name "$name" --initial-cluster "$name=$peer" --initial-advertise-peer-urls "$peer" \\
    >"$log" 2>&1; then
  tail -n 5 "$log" >&2; rm -rf {out} {snap} "$log"; exit 4
fi
rm -f "$log" {snap}
[ -d {out}/member ] || {{ echo "etcdutl made no member dir in {out}" >&2; exit 4; }}
{static_pods_out("restore")}
i=0
while {TCP_OPEN} 127.0.0.1 2379 2>/dev/null || [ -n "$({CRICTL} ps --state running \\
    --label io.kubernetes.container.name=etcd -q)" ]; do
  i=$((i+1))
  [ $i -lt {STOP_WAIT} ] || {{ echo "the kubelet did not stop etcd in {STOP_WAIT}s" \\
"(manifests put back, nothing swapped)" >&2; rm -rf {out}; exit 1; }}
  sleep 1
done
before={data_dir}/gpuk8s-before-restore.$(date -u +%Y%m%dT%H%M%SZ)
mv {data_dir}/member "$before"
mv {out}/member {data_dir}/member
rmdir {out}
echo "## before $before"
"""


def _trusted_cas(session: Session) -> dict[str, str]:
    """host -> SHA-256 of the CA certificate it trusts (/etc/kubernetes/pki/ca.crt), for the
    reached hosts that have one."""
    cas = {}
    for host in sorted(session.transports):
        pem = run_step(session, host, f"cat {PKI}/ca.crt 2>/dev/null || true",
                       "read the cluster CA", timeout=60)
        if "BEGIN CERTIFICATE" in pem:
            try:
                cas[host] = pem_fingerprint(pem)
            except BackupError:
                cas[host] = "unreadable"
    return cas


def _nodes_ready(session: Session, cp: str, names: list[str], wait: int) -> dict[str, bool]:
    """Poll the nodes' Ready condition until all of ``names`` are Ready or ``wait`` s pass."""
    ready: dict[str, bool] = {}
    deadline = time.monotonic() + wait
    while True:
        out = run_step(session, cp, f"{KUBECTL} get nodes -o json", "list nodes", timeout=60)
        try:
            items = json.loads(out).get("items", [])
        except ValueError:
            items = []
        ready = {n: False for n in names}
        for item in items:
            name = str(item.get("metadata", {}).get("name", ""))
            if name in ready:
                ready[name] = any(c.get("type") == "Ready" and c.get("status") == "True"
                                  for c in item.get("status", {}).get("conditions", []))
        if all(ready.values()) or time.monotonic() > deadline:
            return ready
        time.sleep(3)


def restore(inventory: str | Path, source: str | Path, *, yes: bool = False,
            backup: bool = True, reporter: Reporter | None = None,
            confirm: Callable[[str], bool] | None = None,
            opener: Opener = DEFAULT_OPENER) -> dict[str, Any]:
    """Restore the backup in folder ``source`` onto the inventory's first control plane."""
    from gpuk8s.runner import bootstrap

    folder = Path(source)
    manifest = verify(folder)       # every file against its SHA-256, the snapshot whole
    session = gathered_session(inventory, None, "restore", reporter=reporter, opener=opener,
                               allow_unreachable=True)
    with closing(session):
        rep = session.reporter
        inv = session.inventory
        cps = [h.name for h in inv.control_planes if not h.absent]
        cp = session.first_cp
        # the other control planes: reset, then joined again as new members of the restored
        # one-member etcd (an unreachable one is left to the admin)
        others = [h for h in cps if h != cp and h not in session.unreachable]
        lost = [h for h in cps if h != cp and h in session.unreachable]
        if cp in session.unreachable:
            raise RestoreRefused(f"{cp} (the first control plane) is unreachable: "
                                 f"{session.unreachable[cp]}")
        why = refusals(manifest, str(session.host(cp).vars.get("kubernetes_version", "")),
                       _trusted_cas(session))
        if why:
            raise RestoreRefused(f"{folder}: not restored, nothing was changed:\n  - "
                                 + "\n  - ".join(why))
        health = session.facts[cp][ControlPlaneHealth()]
        rebuild = not health.present
        if rebuild and (live := still_serving(cp, {
                h: session.facts[h][ControlPlaneHealth()].etcd_healthy for h in others})):
            raise RestoreRefused(live)
        etcd = manifest["etcd"]
        rep.phase(f"restore the cluster from {folder.name}")
        rep.print(f"  backup: {folder} ({manifest['created']}, {manifest['reason']}; Kubernetes "
                  f"{manifest['kubernetes_version']}, etcd revision {etcd['revision']}, "
                  f"{etcd['total_keys']} keys, from {manifest['source']})")
        if rebuild:
            rep.print(f"  + {cp}: put the backup's PKI back under {PKI} (the cluster CA, "
                      "service-account key and certificates the workers know)")
            rep.print(f"  + {cp}: kubeadm init with them (bootstrap's phases on {cp} alone, "
                      "through the control-plane phase)")
        else:
            rep.print(f"  ! {cp} runs a control plane: its etcd data is rolled back to the "
                      "backup; what changed since is lost", style="magenta")
        rep.print(f"  + {cp}: etcd's data replaced by the snapshot (etcdutl snapshot restore),"
                  " etcd and the control plane restarted on it")
        for h in others:
            rep.print(f"  + {h}: kubeadm reset, then joined again as a new etcd member and "
                      "control plane (invoke add-node)")
        for h in lost:
            rep.print(f"  ! {h} is unreachable ({session.unreachable[h]}): left out; reset it "
                      f"by hand (kubeadm reset -f) before `invoke add-node --host {h}`",
                      style="magenta")
        rep.print("  = the workers keep their kubelets and pods (same CA, same endpoint): no "
                  "new join")
        ask_confirmation(f"restore the cluster from {folder.name} onto {cp}? [y/N] ", yes,
                         confirm)
        if not rebuild:
            healthy = [h for h in cps if h in session.facts and
                       session.facts[h][ControlPlaneHealth()].etcd_healthy]
            if healthy:
                before_change(session, "restoring a backup", backup)
            else:
                rep.print("  ! no backup of the present state: no etcd member is healthy "
                          "(quorum lost)", style="magenta")
        started = time.monotonic()
        for h in others:  # their members would otherwise call the restored one's peers
            rep.print(f"  [{h}] kubeadm reset")
            run_step(session, h, CLEANUP, f"kubeadm reset on {h}", timeout=600)
        if rebuild:
            _put_pki(session, cp, (folder / "pki.tar").read_bytes())
            rep.print(f"  [{cp}] kubeadm init with the backup's PKI")
            bootstrap(inv.path, limit=cp, yes=True, reporter=rep, opener=opener,
                      through="control-plane", backup="no cluster yet: restoring one")
        rep.print(f"  [{cp}] etcd restored from the snapshot")
        backups.upload(session, cp, f"{ETCD_DATA}/{UPLOADED}", (folder / SNAPSHOT).read_bytes())
        out = run_step(session, cp, swap_script(ETCD_DATA),
                       "restore etcd from the snapshot", timeout=900)
        kept = out.rpartition("## before ")[2].strip()
        run_step(session, cp, WAIT_READY, "wait for the API after the restore")
        path = fetch_admin_conf(session)
        for h in others:
            # the snapshot still has its Node (Ready then): kubeadm join refuses a name that a
            # Ready Node holds, so it goes, and the join makes it again
            name = str(session.cluster["nodes"][h]["name"])
            run_step(session, cp, f"{KUBECTL} delete node {node_arg(name)} --ignore-not-found",
                     f"delete node {name}")
            rep.print(f"  [{h}] join again as a control plane")
            bootstrap(inv.path, limit=h, yes=True, reporter=rep, opener=opener,
                      backup="the cluster was just restored from a backup")
        names = [str(session.cluster["nodes"][h]["name"]) if h in session.facts else h
                 for h in inv.hosts if not inv.hosts[h].absent and h not in session.unreachable]
        ready = _nodes_ready(session, cp, names, NODES_READY_WAIT)
        took = time.monotonic() - started
        for name, ok in ready.items():
            rep.print(f"  {'=' if ok else '!'} node {name} {'Ready' if ok else 'not Ready'}",
                      style=None if ok else "magenta")
        rep.print(f"restored {folder.name} onto {cp} in {took:.0f} s; etcd's data before the "
                  f"restore is kept on {cp} in {untrusted(kept)}"
                  + (f"; admin kubeconfig: {path}" if path else ""))
        session.runlog.write_report(restored=str(folder), onto=cp, rebuilt=rebuild,
                                    nodes_ready=ready, seconds=round(took, 1))
        if not all(ready.values()):
            late = ", ".join(n for n, ok in ready.items() if not ok)
            raise Gpuk8sError(f"restored, but {late} did not report Ready in "
                              f"{NODES_READY_WAIT} s: invoke status shows why")
        return {"restored": str(folder), "onto": cp, "rebuilt": rebuild, "nodes_ready": ready,
                "seconds": round(took, 1), "before": kept,
                "at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}


def _put_pki(session: Session, cp: str, pki_tar: bytes) -> None:
    """The backup's pki/ under /etc/kubernetes on ``cp`` (root's, 0600 keys as tar made them),
    unless the node already has a CA (the same one: refusals() checked)."""
    staged = "/var/tmp/gpuk8s-restore-pki.tar"
    backups.upload(session, cp, staged, pki_tar)
    run_step(session, cp, f"""set -eu
trap 'rm -f {staged}' EXIT
if [ -f {PKI}/ca.crt ]; then echo "{PKI}/ca.crt is there: the node keeps its PKI"; exit 0; fi
mkdir -p /etc/kubernetes
tar --no-same-owner -C /etc/kubernetes -xf {staged} pki
""", "put back the PKI", timeout=120)
