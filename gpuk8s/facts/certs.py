"""When the certificates kubeadm made on a node expire: the ones `kubeadm certs
check-expiration` lists (the leaf certificates under /etc/kubernetes/pki and pki/etcd, the
client certificates inside admin.conf, super-admin.conf, controller-manager.conf and
scheduler.conf), their CAs, and the kubelet's client certificate. Read with the node's
openssl; nothing is printed where there are none (a node before kubeadm)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from gpuk8s.facts import Fact

PKI = "/etc/kubernetes/pki"
KUBECONFIGS = ("admin.conf", "super-admin.conf", "controller-manager.conf", "scheduler.conf")
KUBELET_CLIENT = "/var/lib/kubelet/pki/kubelet-client-current.pem"
#: the CAs kubeadm makes (ten years; `kubeadm certs renew` does not renew them)
CAS = (f"{PKI}/ca.crt", f"{PKI}/front-proxy-ca.crt", f"{PKI}/etcd/ca.crt")
#: under this many days left, status and bootstrap warn
WARN_DAYS = 30


@dataclass(frozen=True)
class CertState:
    #: path (a kubeconfig for its embedded client certificate) -> expiry (UTC)
    expiry: dict[str, dt.datetime] = field(default_factory=dict)

    def leaves(self) -> dict[str, dt.datetime]:
        """What `kubeadm certs renew all` renews, and the kubelet's client certificate."""
        return {p: t for p, t in self.expiry.items() if p not in CAS}

    def earliest(self, *, cas: bool = False) -> tuple[str, dt.datetime] | None:
        pool = {p: t for p, t in self.expiry.items() if p in CAS} if cas else self.leaves()
        return min(pool.items(), key=lambda kv: kv[1]) if pool else None

    def expiring(self, now: dt.datetime, days: int = WARN_DAYS) -> list[tuple[str, dt.datetime]]:
        """Certificates (CAs too) that expire within ``days``, soonest first."""
        limit = now + dt.timedelta(days=days)
        return sorted(((p, t) for p, t in self.expiry.items() if t <= limit),
                      key=lambda kv: kv[1])


class CertExpiry(Fact[CertState]):
    def command(self) -> str:
        files = f"{PKI}/*.crt {PKI}/etcd/*.crt {KUBELET_CLIENT}"
        confs = " ".join(f"/etc/kubernetes/{k}" for k in KUBECONFIGS)
        return f"""[ -d /etc/kubernetes ] && command -v openssl >/dev/null 2>&1 || exit 0
export LC_ALL=C
for f in {files}; do
  [ -f "$f" ] || continue
  e=$(openssl x509 -noout -enddate -in "$f" 2>/dev/null) && echo "$f ${{e#notAfter=}}"
done
for f in {confs}; do
  [ -f "$f" ] || continue
  d=$(sed -n 's/^ *client-certificate-data: *//p' "$f" | head -n 1)
  [ -n "$d" ] || continue
  e=$(printf '%s' "$d" | base64 -d 2>/dev/null | openssl x509 -noout -enddate 2>/dev/null) \\
    && echo "$f ${{e#notAfter=}}"
done
true"""

    def parse(self, output: str, exit_code: int) -> CertState:
        expiry: dict[str, dt.datetime] = {}
        for line in output.splitlines():
            path, _, when = line.partition(" ")
            if not path.startswith("/"):
                continue
            try:  # openssl's "Nov 29 13:10:40 2027 GMT" (a one-digit day has two spaces)
                stamp = dt.datetime.strptime(" ".join(when.split()), "%b %d %H:%M:%S %Y GMT")
            except ValueError:
                continue
            expiry[path] = stamp.replace(tzinfo=dt.UTC)
        return CertState(expiry)


def days_left(when: dt.datetime, now: dt.datetime) -> int:
    return int((when - now).total_seconds() // 86400)


def expiry_warning(state: CertState, now: dt.datetime) -> str:
    """The plan's and status's warning for certificates that expire within WARN_DAYS ("" for
    none): how many days, which files, and what renews them."""
    soon = state.expiring(now)
    if not soon:
        return ""
    when = soon[0][1]
    left = days_left(when, now)
    names = ", ".join(p.rpartition("/")[2] if not p.startswith(f"{PKI}/etcd/") else
                      "etcd/" + p.rpartition("/")[2] for p, _ in soon[:4])
    more = f" and {len(soon) - 4} more" if len(soon) > 4 else ""
    ca = any(p in CAS for p, _ in soon)
    when_words = (f"expired {days_left(now, when)} day(s) ago" if when < now else
                  f"expire in {left} day(s)")
    fix = ("a CA among them: kubeadm does not renew CAs; plan a new cluster CA" if ca else
           "renew them: `kubeadm certs renew all` on the node, then restart its control-plane "
           "static pods (kubeadm's docs, \"Certificate Management with kubeadm\")")
    return (f"certificates {when_words} ({names}{more}; the first {when:%Y-%m-%d}): "
            f"{fix}")
