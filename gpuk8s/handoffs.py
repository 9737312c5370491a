"""What one phase hands to the next, outside the roles' ops: a short-lived join token
(minted on the control plane, kept in memory) and admin.conf (checked, then saved privately
on the admin machine)."""

from __future__ import annotations

import os
import re
import secrets
import stat
from pathlib import Path

import yaml

from gpuk8s.errors import (
    Gpuk8sError,
    PhaseFailed,
)
from gpuk8s.executor import HostResult
from gpuk8s.facts.kube import ADMIN_CONF
from gpuk8s.ops import Op, q
from gpuk8s.session import Session

_JOIN_RE = re.compile(r"kubeadm join (\S+) --token (\S+)\s+--discovery-token-ca-cert-hash (\S+)")


def mint_join(session: Session) -> None:
    """A fresh short-lived token on the first control plane, kept in memory only."""
    cp = session.first_cp
    ttl = session.host(cp).vars["join_token_ttl"]
    op = Op("join | token", (f"kubeadm token create --ttl {q(str(ttl))} --print-join-command",),
            f"+ a join token valid {ttl}", timeout=120, secret=True)
    rc, out = session.runner(cp).run_now([op], keep_going=True)[0]
    match = _JOIN_RE.search(out)
    if rc != 0 or not match:
        raise PhaseFailed("join", {cp: HostResult(cp, error=Gpuk8sError(
            f"{cp}: kubeadm token create failed (exit {rc}): "
            + session.redact(out.strip()[-500:])))})
    session.redact.add(match.group(2), match.group(2).split(".")[-1])
    session.cluster["join"] = {"endpoint": match.group(1), "token": match.group(2),
                               "ca_hash": match.group(3)}


def upload_certs(session: Session) -> None:
    """A fresh certificate key, made here and kept in memory only; the first control plane
    uploads the cluster's shared certificates encrypted with it (kubeadm-certs, which kubeadm
    deletes after two hours), for the control planes joining in this run."""
    cp = session.first_cp
    key = secrets.token_hex(32)
    session.redact.add(key)
    op = Op("control-plane-join | upload certificates",
            (f"kubeadm init phase upload-certs --upload-certs --certificate-key {q(key)} "
             ">/dev/null",),
            "+ the shared certificates uploaded, encrypted with a fresh key", timeout=120,
            secret=True)
    rc, out = session.runner(cp).run_now([op], keep_going=True)[0]
    if rc != 0:
        raise PhaseFailed("control-plane-join", {cp: HostResult(cp, error=Gpuk8sError(
            f"{cp}: kubeadm init phase upload-certs failed (exit {rc}): "
            + session.redact(out.strip()[-500:])))})
    session.cluster["certificate_key"] = key


#: what a kubeadm admin.conf user may hold: client certificate and key, inline. Anything
#: else (an exec or auth-provider plugin, a token file, paths) would be run or read on the
#: admin machine by the operator's next kubectl, on the control plane's say-so.
_KUBECONFIG_USER_KEYS = {"client-certificate-data", "client-key-data"}


_KUBECONFIG_CLUSTER_KEYS = {"server", "certificate-authority-data", "tls-server-name"}


def check_admin_conf(text: str, host: str, what: str = ADMIN_CONF,
                     remedy: str = "kubeadm init phase kubeconfig admin rewrites it") -> None:
    """Refuse a kubeconfig from ``host`` that is not plain kubeadm admin.conf material
    (``what``: the file or command it came from)."""
    def bad(why: str) -> Gpuk8sError:
        return Gpuk8sError(f"{host}: {what} is refused: {why}; it is not what kubeadm "
                           "writes, so it is not saved on this machine. Check the control "
                           f"plane ({remedy})")
    try:
        conf = yaml.safe_load(text)
    except yaml.YAMLError:
        raise bad("it is not YAML") from None
    if not isinstance(conf, dict) or conf.get("kind") != "Config":
        raise bad("it is not a kubeconfig (kind: Config)")
    for field in ("users", "clusters"):
        if not isinstance(conf.get(field) or [], list):
            raise bad(f"its {field} is a {type(conf[field]).__name__}, not a list")
    for entry in conf.get("users") or []:
        user = entry.get("user") if isinstance(entry, dict) else None
        extra = sorted(set(user or {}) - _KUBECONFIG_USER_KEYS) if isinstance(user, dict) \
            else ["(not a mapping)"]
        if extra:
            raise bad(f"user {entry.get('name') if isinstance(entry, dict) else entry!r} has "
                      f"{', '.join(extra)} (only client-certificate-data and client-key-data "
                      "are accepted)")
    clusters = conf.get("clusters") or []
    if not clusters:
        raise bad("it names no cluster")
    for entry in clusters:
        cluster = entry.get("cluster") if isinstance(entry, dict) else None
        if not isinstance(cluster, dict):
            raise bad("a cluster entry is not a mapping")
        extra = sorted(set(cluster) - _KUBECONFIG_CLUSTER_KEYS)
        if extra:
            raise bad(f"a cluster has {', '.join(extra)}")
        if not str(cluster.get("server", "")).startswith("https://"):
            raise bad(f"the server {cluster.get('server')!r} is not an https:// URL")


def _direct(text: str, address: str) -> str:
    """admin.conf for the admin machine when the cluster's endpoint is each node's own load
    balancer (127.0.0.1:6443, which means nothing here): the first control plane's API server,
    whose certificate names its address."""
    conf = yaml.safe_load(text)
    host = f"[{address}]" if ":" in address else address
    for entry in conf["clusters"]:
        entry["cluster"]["server"] = f"https://{host}:6443"
    return yaml.safe_dump(conf, sort_keys=False)


def write_private(dest: Path, data: str | bytes) -> None:
    """Write ``data`` to ``dest`` readable by this user only, atomically, never through a
    symlink, in a folder no one else can write to."""
    folder = dest.parent
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = folder.lstat()
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise Gpuk8sError(
            f"{folder} is refused for secrets: it is "
            + ("a symlink" if stat.S_ISLNK(st.st_mode) else
               f"owned by uid {st.st_uid}" if st.st_uid != os.getuid() else
               f"writable by others (mode {stat.S_IMODE(st.st_mode):o})")
            + f"; make it your own with mode 0700 (chmod 0700 {folder})")
    tmp = folder / f".{dest.name}.{secrets.token_hex(6)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def fetch_admin_conf(session: Session) -> Path | None:
    """Copy admin.conf to <inventory dir>/artifacts/admin.conf (0600) on the admin machine,
    once it is checked to be plain kubeadm material (see check_admin_conf)."""
    op = Op("control_plane | fetch admin.conf", (f"cat {ADMIN_CONF}",),
            "+ admin.conf to the admin machine", timeout=60, secret=True)
    rc, data = session.runner(session.first_cp).run_now([op], keep_going=True)[0]
    if rc != 0:
        return None
    return save_kubeconfig(session, data, "admin.conf")


def save_kubeconfig(session: Session, data: str, name: str, what: str = ADMIN_CONF,
                    remedy: str = "kubeadm init phase kubeconfig admin rewrites it",
                    namespace: str = "") -> Path:
    """A kubeconfig the first control plane printed, checked (check_admin_conf), its
    credentials added to the run's redaction, pointed at the first control plane's own API
    server when the endpoint is each node's local balancer (and its context at
    ``namespace``), written to <inventory dir>/artifacts/<name> (0600)."""
    cp = session.first_cp
    data += "\n"  # the executor's sections drop the output's last newline
    for line in data.splitlines():
        key, _, value = line.strip().partition(":")
        if key.endswith("-data") and value.strip():
            session.redact.add(value.strip())
    check_admin_conf(data, cp, what, remedy)
    if session.cluster.get("endpoint_mode") == "local_lb":
        data = _direct(data, session.host(cp).address)
    if namespace:
        conf = yaml.safe_load(data)
        for entry in conf.get("contexts") or []:
            entry.setdefault("context", {})["namespace"] = namespace
        data = yaml.safe_dump(conf, sort_keys=False)
    dest = Path(session.inventory.path).resolve().parent / "artifacts" / name
    write_private(dest, data)
    return dest
