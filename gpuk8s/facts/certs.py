"""When the certificates kubeadm made on a node expire: the ones `kubeadm certs
check-expiration` lists (the leaf certificates under /etc/kubernetes/pki and pki/etcd, the
client certificates inside admin.conf, super-admin.conf, controller-manager.conf and
scheduler.conf), their CAs, and the kubelet's client certificate. The node prints the
certificates (never their keys) and the admin machine reads their dates; nothing is printed
where there are none (a node before kubeadm)."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
from dataclasses import dataclass, field

from cryptography import x509

from gpuk8s.facts import Fact

PKI = "/etc/kubernetes/pki"
KUBECONFIGS = ("admin.conf", "super-admin.conf", "controller-manager.conf", "scheduler.conf")
KUBELET_CLIENT = "/var/lib/kubelet/pki/kubelet-client-current.pem"
#: the CAs kubeadm makes (ten years; `kubeadm certs renew` does not renew them)
CAS = (f"{PKI}/ca.crt", f"{PKI}/front-proxy-ca.crt", f"{PKI}/etcd/ca.crt")
#: under this many days left, status and bootstrap warn
WARN_DAYS = 30
BEGIN, END = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"


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
    """Two processes on the node, whatever the number of certificates: one GNU sed prints each
    certificate file's first PEM certificate block after its path (GNU sed's F), the other
    each kubeconfig's client-certificate-data after its path; the admin machine reads notAfter
    with ``cryptography``. Only CERTIFICATE blocks leave the node: the private keys beside them
    (kubelet-client-current.pem, client-key-data) are never printed. One openssl per
    certificate cost 470-660 ms on a control plane (the 8-node bench's probe floor)."""

    def command(self) -> str:
        files = f"{PKI}/*.crt {PKI}/etcd/*.crt {KUBELET_CLIENT}"
        confs = " ".join(f"/etc/kubernetes/{k}" for k in KUBECONFIGS)
        begin, end = f"/^{BEGIN}$/", f"/^{END}$/"
        return f"""[ -d /etc/kubernetes ] || exit 0
sed -s -n -e '{begin}F' -e '{begin},{end}p' {files} 2>/dev/null
sed -s -n -e '/^ *client-certificate-data:/{{F;s/^ *client-certificate-data: *//p}}' \
  {confs} 2>/dev/null
true"""

    def parse(self, output: str, exit_code: int) -> CertState:
        expiry: dict[str, dt.datetime] = {}
        path, prev, pem = "", "", []   # pem: the lines of a block of ``path`` being read
        for line in output.splitlines():
            line = line.strip()
            if line == BEGIN:
                # sed's F put the file's path just before; a block left open (a truncated
                # file: sed's range goes on into the next file) is dropped
                path, pem = prev, [line]
            elif pem:
                pem.append(line)
                if line == END:
                    _keep(expiry, path, "\n".join(pem).encode())
                    pem = []
            elif line.startswith("/"):
                path = line
            elif path.endswith(".conf") and line:  # a kubeconfig's base64 client certificate
                with contextlib.suppress(ValueError):
                    _keep(expiry, path, base64.b64decode(line, validate=True))
            prev = line
        return CertState(expiry)


def _keep(expiry: dict[str, dt.datetime], path: str, pem: bytes) -> None:
    """The file's first certificate (what openssl x509 -in reads); unreadable ones are left
    out, as openssl's failures were."""
    if path in expiry:
        return
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError:
        return
    expiry[path] = cert.not_valid_after_utc


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
