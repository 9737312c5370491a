"""`invoke renew-certs`: kubeadm's certificates renewed on the control planes, one at a time.

On each control plane (a backup first): `kubeadm certs renew all`, which renews every leaf
certificate and the client certificates inside admin.conf and the other kubeconfigs from the
same CAs (it restarts nothing); the copies of admin.conf gpuk8s installed (root's and users'
~/.kube/config that still equal the old one) follow the new admin.conf; then the node's static
pods are restarted the way kubeadm's "Certificate Management with kubeadm" says (their
manifests moved out of /etc/kubernetes/manifests and, once the kubelet has stopped them, back)
and the command waits until etcd and the API server on that node serve the renewed certificates
and the API answers, before the next control plane starts: with several control planes the
endpoint keeps answering from the others. Last, admin.conf is fetched again.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from gpuk8s.backups import before_change
from gpuk8s.day2.control_planes import WAIT_READY
from gpuk8s.day2.steps import ask_confirmation, run_step
from gpuk8s.errors import Gpuk8sError, InventoryError
from gpuk8s.facts.certs import PKI, CertExpiry, days_left
from gpuk8s.facts.controlplane import APISERVER_MANIFEST, TCP_OPEN
from gpuk8s.facts.kube import ADMIN_CONF
from gpuk8s.gather import gather, gathered_session
from gpuk8s.handoffs import fetch_admin_conf
from gpuk8s.report import Reporter
from gpuk8s.session import DEFAULT_OPENER, Opener

MANIFESTS = "/etc/kubernetes/manifests"
STATIC_PODS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
#: seconds for the kubelet to stop the static pods once their manifests are gone, and to start
#: them again serving the new certificates
STOP_WAIT, START_WAIT = 90, 240

#: renew, then let the admin.conf copies gpuk8s installed follow (found as CLEANUP finds them:
#: regular files only, never through a symlink)
RENEW = f"""set -e
old=$(mktemp)
trap 'rm -f "$old"' EXIT
cp {ADMIN_CONF} "$old"
# kubeadm reads the cluster's kubeadm-config ConfigMap: its certificateValidityPeriod is the
# inventory's certificate_validity_period (the control_plane role uploads its config)
if ! out=$(kubeadm certs renew all 2>&1); then echo "$out" >&2; exit 1; fi
echo "$out"
case "$out" in
  *"Done renewing certificates"*) ;;
  *) echo "kubeadm certs renew all did not say it renewed the certificates" >&2; exit 1;;
esac
find /root /home -mindepth 2 -maxdepth 3 -path '*/.kube/config' -type f \\
  -exec cmp -s "$old" '{{}}' ';' -exec sh -c 'cat "$0" > "$1"' {ADMIN_CONF} '{{}}' ';'
"""


def static_pods_out(tag: str) -> str:
    """Shell lines that stop the control plane's static pods as kubeadm's docs say: their
    manifests moved into a fresh folder, and ``back`` (trapped on EXIT) moves them home
    whatever happens; renew-certs and restore share it."""
    files = " ".join(f"{MANIFESTS}/{p}.yaml" for p in STATIC_PODS)
    return f"""mkdir -p /etc/kubernetes/gpuk8s
d=$(mktemp -d /etc/kubernetes/gpuk8s/manifests-{tag}.XXXXXX)
back() {{ for f in "$d"/*.yaml; do [ -f "$f" ] && mv "$f" {MANIFESTS}/; done; rmdir "$d"; }}
trap back EXIT
for f in {files}; do [ -f "$f" ] && mv "$f" "$d"/; done"""


def restart_script() -> str:
    """Move the static pod manifests out, wait until etcd and the API server stop answering,
    move them back (whatever happens), wait until both serve the renewed certificates."""
    etcd_auth = (f"-CAfile {PKI}/etcd/ca.crt -cert {PKI}/etcd/healthcheck-client.crt "
                 f"-key {PKI}/etcd/healthcheck-client.key")
    return f"""set -e
a=$(grep -o -- '--advertise-address=[^" ]*' {APISERVER_MANIFEST} | head -n 1)
a=${{a#--advertise-address=}}
[ -n "$a" ] || {{ echo "no --advertise-address in {APISERVER_MANIFEST}" >&2; exit 1; }}
fp() {{ openssl x509 -noout -fingerprint -sha256 2>/dev/null; }}
served() {{ echo | timeout 5 openssl s_client -connect "$1" $2 2>/dev/null | fp; }}
want_api=$(fp < {PKI}/apiserver.crt)
want_etcd=$(fp < {PKI}/etcd/server.crt)
{static_pods_out("renew")}
i=0
while {TCP_OPEN} 127.0.0.1 2379 2>/dev/null || {TCP_OPEN} "$a" 6443 2>/dev/null; do
  i=$((i+1))
  [ $i -lt {STOP_WAIT} ] || {{ echo "the kubelet did not stop etcd and the API server in \\
{STOP_WAIT}s (manifests put back)" >&2; exit 1; }}
  sleep 1
done
back
trap - EXIT
i=0
until [ "$(served "$a:6443")" = "$want_api" ] && \\
      [ "$(served 127.0.0.1:2379 "{etcd_auth}")" = "$want_etcd" ]; do
  i=$((i+1))
  [ $i -lt {START_WAIT} ] || {{ echo "etcd and the API server did not come back with the \\
renewed certificates in {START_WAIT}s: crictl ps -a on the node shows them" >&2; exit 1; }}
  sleep 1
done
"""


def renew_certs(inventory: str | Path, *, host: str | None = None, yes: bool = False,
                backup: bool = True, reporter: Reporter | None = None,
                confirm: Callable[[str], bool] | None = None,
                opener: Opener = DEFAULT_OPENER) -> dict[str, Any]:
    """Renew kubeadm's certificates on every control plane (or ``host``), one at a time."""
    session = gathered_session(inventory, "control_plane", "renew-certs", reporter=reporter,
                               opener=opener)
    with closing(session):
        rep = session.reporter
        cps = [h.name for h in session.inventory.control_planes if not h.absent]
        if host is not None:
            if host not in cps:
                raise InventoryError(f"{host} is not a control plane of the inventory",
                                     path=str(session.inventory.path),
                                     fix=f"control planes: {', '.join(cps)}")
            cps = [host]
        now = dt.datetime.now(dt.UTC)
        rep.phase("renew kubeadm's certificates, one control plane at a time")
        for cp in cps:
            earliest = session.facts[cp][CertExpiry()].earliest()
            if earliest is None:
                raise Gpuk8sError(f"{cp} has no kubeadm certificates under {PKI}: is it "
                                  "bootstrapped? (invoke status)")
            rep.print(f"  + {cp}: first to end {earliest[0].rpartition('/')[2]}, "
                      f"{earliest[1]:%Y-%m-%d} ({days_left(earliest[1], now)} d); kubeadm "
                      "certs renew all, restart etcd and the control plane's static pods")
        ask_confirmation(f"renew the certificates of {len(cps)} control plane(s)? [y/N] ",
                         yes, confirm)
        before_change(session, "renewing certificates", backup)
        for cp in cps:
            rep.print(f"  [{cp}] kubeadm certs renew all")
            run_step(session, cp, RENEW, "kubeadm certs renew all", timeout=300)
            rep.print(f"  [{cp}] restart etcd, kube-apiserver, kube-controller-manager, "
                      "kube-scheduler")
            run_step(session, cp, restart_script(), "restart the static pods", timeout=600)
            run_step(session, cp, WAIT_READY, "wait for the API")
        path = fetch_admin_conf(session)
        if path:
            rep.print(f"admin kubeconfig: {path} (0600)")
        gather(session, cps)
        after = {}
        for cp in cps:
            earliest = session.facts[cp][CertExpiry()].earliest()
            assert earliest is not None
            after[cp] = earliest[1].strftime("%Y-%m-%dT%H:%M:%SZ")
            rep.print(f"  {cp}: certificates now valid until {earliest[1]:%Y-%m-%d} "
                      f"({days_left(earliest[1], dt.datetime.now(dt.UTC))} d)")
        session.runlog.write_report(renewed=cps, certificates=after)
        return {"renewed": cps, "earliest": after}
