"""Backups of the cluster: the one `invoke backup` takes (gpuk8s/day2/backup.py), and the one
every command that changes a control plane takes first (before_change).

From the first control plane whose etcd member is healthy: a snapshot made by the etcdctl of
its own etcd container (``crictl exec``: kubeadm's etcd runs the registry.k8s.io/etcd image,
whose /usr/local/bin holds etcdctl; cluster/images/etcd/Dockerfile of Kubernetes), kubeadm's
PKI, gpuk8s's kubeadm configuration and admin.conf, staged in a private folder on the node,
downloaded, checked and removed from the node, into

    <inventory dir>/artifacts/backups/<cluster>-<UTC time>/     (0700; every file 0600)
        etcd-snapshot.db  pki.tar  admin.conf  kubeadm-config.yaml  manifest.json

manifest.json names each file's size and SHA-256, the snapshot's revision and key count (read
from the file itself: gpuk8s/etcdsnap.py), etcd's members and version, the Kubernetes version,
the fingerprint of the cluster's CA (which says which cluster a backup belongs to), the host
and the reason. The newest ``backup_keep`` backups of the cluster are kept.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import io
import json
import re
import shutil
import ssl
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuk8s import __version__, etcdsnap
from gpuk8s.errors import Gpuk8sError
from gpuk8s.facts.controlplane import (
    ETCD_CONTAINER,
    ETCDCTL_IN,
    ControlPlaneHealth,
    ControlPlaneHealthState,
)
from gpuk8s.facts.kube import ADMIN_CONF
from gpuk8s.gather import gather
from gpuk8s.handoffs import write_private
from gpuk8s.ops import Op
from gpuk8s.ops.kube import KUBEADM_CONFIG
from gpuk8s.report import untrusted
from gpuk8s.session import Session

MANIFEST = "manifest.json"
SNAPSHOT = "etcd-snapshot.db"
#: every file a backup holds; kubeadm-config.yaml only where gpuk8s wrote one
FILES = (SNAPSHOT, "pki.tar", "admin.conf", "kubeadm-config.yaml")
REQUIRED = (SNAPSHOT, "pki.tar", "admin.conf")
FORMAT = 1
#: the stage folder on the node (mktemp -d, 0700); an interrupted backup's is removed by the next
STAGE = "/var/tmp/gpuk8s-backup."
#: where etcdctl writes the snapshot: inside the etcd container's own data mount (kubeadm's
#: etcd.yaml mounts the host's /var/lib/etcd at /var/lib/etcd), moved out at once
IN_CONTAINER = "/var/lib/etcd/gpuk8s-snapshot.db"
#: bytes per download round trip (base64 in the output: 43 MiB, under the transport's 64 MiB)
CHUNK_MIB = 32
#: bytes per upload script (base64 on the script's stdin)
UPLOAD_MIB = 16

_STAGE_RE = re.compile(re.escape(STAGE) + r"[A-Za-z0-9]{6,}")


class BackupError(Gpuk8sError):
    """A backup that cannot be taken, or one that is not whole; the message says which file."""


@dataclass(frozen=True)
class Taken:
    path: Path
    manifest: dict[str, Any]

    def line(self) -> str:
        e = self.manifest["etcd"]
        return (f"backup: {self.path} (etcd revision {e['revision']}, {e['total_keys']} keys, "
                f"{_size(self.manifest['files'][SNAPSHOT]['size'])}; from "
                f"{self.manifest['source']})")


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def stage_script() -> str:
    """Snapshot, PKI and configuration into a fresh stage folder; prints the folder, each
    file's size and SHA-256, etcd's members and status, and the API server's image."""
    etcdctl = ETCDCTL_IN
    return f"""set -eu
umask 077
rm -rf {STAGE}*
rm -f {IN_CONTAINER} {IN_CONTAINER}.part
{ETCD_CONTAINER}
if [ -z "$id" ]; then
  echo "no running etcd container here (crictl ps --label io.kubernetes.container.name=etcd" \\
    "lists none): is this node's etcd up?" >&2
  exit 3
fi
w=$(mktemp -d {STAGE}XXXXXX)
trap 'rm -f {IN_CONTAINER} {IN_CONTAINER}.part' EXIT
if ! {etcdctl} snapshot save {IN_CONTAINER} >"$w/etcdctl.log" 2>&1; then
  tail -n 5 "$w/etcdctl.log" >&2; rm -rf "$w"; exit 4
fi
mv {IN_CONTAINER} "$w/{SNAPSHOT}"
rm -f "$w/etcdctl.log"
tar -C /etc/kubernetes -cf "$w/pki.tar" pki
cp {ADMIN_CONF} "$w/admin.conf"
if [ -f {KUBEADM_CONFIG} ]; then cp {KUBEADM_CONFIG} "$w/kubeadm-config.yaml"; fi
echo "## stage $w"
echo "## files"
for f in "$w"/*; do echo "$(stat -c %s "$f") $(sha256sum < "$f" | cut -c1-64) ${{f##*/}}"; done
echo "## members"
{etcdctl} member list -w json
echo
echo "## status"
{etcdctl} endpoint status -w json
echo
echo "## image"
grep -o 'kube-apiserver:v[^" ]*' /etc/kubernetes/manifests/kube-apiserver.yaml | head -n 1 || true
"""


def _sections(out: str) -> dict[str, str]:
    parts: dict[str, str] = {}
    for chunk in ("\n" + out).split("\n## ")[1:]:
        name, _, body = chunk.partition("\n")
        key, _, inline = name.partition(" ")
        parts[key] = (inline + "\n" + body).strip() if inline else body.strip()
    return parts


def _secret_run(session: Session, host: str, what: str, script: str, timeout: float) -> str:
    """One script whose output carries secrets (keys, admin.conf): never logged."""
    op = Op(f"backup | {what}", (script,), f"+ {what}", timeout=timeout, secret=True)
    rc, out = session.runner(host).run_now([op], keep_going=True)[0]
    if rc != 0:
        raise BackupError(f"{host}: {what} failed (exit {rc}): {untrusted(out.strip()[-400:])}")
    return out


def _download(session: Session, host: str, path: str, size: int) -> bytes:
    """The file's bytes, CHUNK_MIB at a time through base64 (a non-root login reads it through
    sudo like any other command; no SFTP)."""
    data = bytearray()
    while len(data) < size:
        skip = len(data) // (1024 * 1024)  # every chunk but the last is whole MiBs
        out = _secret_run(session, host, f"download {path.rsplit('/', 1)[-1]}",
                          f"dd if={path} bs=1048576 skip={skip} count={CHUNK_MIB} status=none "
                          "| base64 -w 0", timeout=600)
        try:
            chunk = base64.b64decode(out.strip(), validate=True)
        except ValueError:
            raise BackupError(f"{host}: {path} came back damaged (not base64)") from None
        if not chunk:
            break  # shorter than the node said: the size check names it
        data += chunk
    return bytes(data)


def upload(session: Session, host: str, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` on the host (0600, root's), UPLOAD_MIB at a time through
    base64 in the script's stdin (never argv, never logged), then check its SHA-256 there."""
    step = UPLOAD_MIB * 1024 * 1024
    name = path.rsplit("/", 1)[-1]
    for at in range(0, max(len(data), 1), step):
        encoded = base64.encodebytes(data[at:at + step]).decode()
        start = f"umask 077; : > {path}; " if at == 0 else ""
        _secret_run(session, host, f"upload {name}",
                    f"{start}base64 -d >> {path} <<'GPUK8S_EOF'\n{encoded}GPUK8S_EOF\n",
                    timeout=600)
    said = _secret_run(session, host, f"check {name}", f"sha256sum < {path} | cut -c1-64",
                       timeout=120).strip()
    if said != hashlib.sha256(data).hexdigest():
        _secret_run(session, host, f"remove {name}", f"rm -f -- {path}", timeout=60)
        raise BackupError(f"{host}: {name} arrived changed (SHA-256 {untrusted(said[:64])}); "
                          "it was removed: run again")


def pem_fingerprint(pem: str) -> str:
    """SHA-256 of a PEM certificate's DER (ca_fingerprint's for one file)."""
    try:
        der = ssl.PEM_cert_to_DER_cert(pem[pem.index("-----BEGIN CERTIFICATE-----"):])
    except ValueError:
        raise BackupError("not a PEM certificate") from None
    return hashlib.sha256(der).hexdigest()


def ca_fingerprint(pki_tar: bytes) -> str:
    """SHA-256 of the cluster CA's certificate (DER) in a pki.tar: which cluster it is."""
    with tarfile.open(fileobj=io.BytesIO(pki_tar)) as tar:
        member = tar.extractfile("pki/ca.crt")
        if member is None:
            raise BackupError("pki.tar holds no pki/ca.crt")
        pem = member.read().decode(errors="replace")
    try:
        return pem_fingerprint(pem)
    except BackupError:
        raise BackupError("pki.tar's pki/ca.crt is not a PEM certificate") from None


def backups_dir(inventory_path: str | Path) -> Path:
    return Path(inventory_path).resolve().parent / "artifacts" / "backups"


def cluster_label(inventory_path: str | Path) -> str:
    """The backup folders' prefix: the inventory file's name, in a file name's safe letters."""
    stem = Path(inventory_path).stem.lower()
    return re.sub(r"[^a-z0-9-]+", "-", stem).strip("-") or "cluster"


def _health(session: Session, host: str) -> ControlPlaneHealthState | None:
    """A control plane's etcd and API health, from its facts (gathered now where the command
    gathered none, as reset); None when the host is not reached."""
    if host not in session.facts and host in session.transports:
        try:
            gather(session, [host])
        except Gpuk8sError:
            return None
    facts = session.facts.get(host)
    return None if facts is None else facts.get(ControlPlaneHealth())


def pick_source(session: Session) -> str:
    """The first control plane (inventory order) whose etcd member reports healthy."""
    seen = []
    for h in session.inventory.control_planes:
        health = _health(session, h.name)
        if health is None:
            seen.append(f"{h.name}: not reached")
            continue
        if health.present and health.etcd_healthy:
            return h.name
        seen.append(f"{h.name}: " + (health.words or "no etcd member (kubeadm's etcd.yaml "
                                                     "is missing)"))
    raise BackupError("no control plane has a healthy etcd member to take a backup from ("
                      + "; ".join(seen) + ")")


def cluster_exists(session: Session) -> bool:
    """Whether a reached control plane runs an etcd member: there is a cluster to lose."""
    return any((health := _health(session, h.name)) is not None and health.present
               for h in session.inventory.control_planes if not h.absent)


def before_change(session: Session, what: str, backup: bool | str = True) -> Taken | None:
    """The backup a command takes before it changes a control plane or the cluster's
    Kubernetes; with ``backup`` False it says that none was taken (--no-backup), with a string
    it says that and why. Nothing when there is no cluster yet. A backup that fails stops the
    command before it changes anything."""
    if not cluster_exists(session):
        return None
    if backup is not True:
        why = backup if isinstance(backup, str) and backup else "--no-backup"
        session.reporter.print(f"  ! no backup before {what} ({why})", style="magenta")
        return None
    try:
        return take(session, f"before {what}")
    except BackupError as exc:
        raise BackupError(f"{exc}\n  nothing was changed: a backup comes before {what}. Fix "
                          "the control plane, or add --no-backup to go on without one") from None


def take(session: Session, reason: str, *, keep: int | None = None) -> Taken:
    """Take one backup through ``session`` (facts gathered), check it, keep the newest
    ``keep`` (default: the inventory's backup_keep)."""
    host = pick_source(session)
    inv = session.inventory
    rep = session.reporter
    rep.print(f"  backup of the cluster from {host} ({reason})", style="dim")
    out = _secret_run(session, host, "etcd snapshot and PKI", stage_script(), timeout=600)
    parts = _sections(out)
    stage = parts.get("stage", "")
    if not _STAGE_RE.fullmatch(stage):
        raise BackupError(f"{host}: the backup's stage folder is unreadable: "
                          f"{untrusted(out.strip()[-300:])}")
    try:
        staged: dict[str, tuple[int, str]] = {}
        for line in parts.get("files", "").splitlines():
            size, sha, name = [*line.split(" ", 2), "", ""][:3]
            if name in FILES and size.isdigit() and re.fullmatch(r"[0-9a-f]{64}", sha):
                staged[name] = (int(size), sha)
        missing = [f for f in REQUIRED if f not in staged]
        if missing:
            raise BackupError(f"{host}: the backup lacks {', '.join(missing)}")
        got: dict[str, bytes] = {}
        for name, (length, digest) in staged.items():
            data = _download(session, host, f"{stage}/{name}", length)
            if len(data) != length or hashlib.sha256(data).hexdigest() != digest:
                raise BackupError(f"{host}: {name} changed on the way ({len(data)} of {length} "
                                  "bytes, or another SHA-256): nothing was kept; run again")
            got[name] = data
    finally:
        _secret_run(session, host, "remove the stage folder", f"rm -rf -- {stage}", timeout=60)
    try:
        snap = etcdsnap.status(got[SNAPSHOT])
    except etcdsnap.SnapshotError as exc:
        raise BackupError(f"{host}: the etcd snapshot is not whole: {exc}") from None
    if not snap.checksum:
        raise BackupError(f"{host}: the etcd snapshot has no SHA-256 trailer (etcd writes one)")
    members, etcd_version = _etcd_meta(parts)
    image = parts.get("image", "")
    manifest = {
        "format": FORMAT, "cluster": cluster_label(inv.path),
        "created": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "reason": reason, "source": host, "gpuk8s": __version__,
        "kubernetes_version": image.rpartition(":")[2] if image.startswith("kube-apiserver:v")
        else "",
        "ca_sha256": ca_fingerprint(got["pki.tar"]),
        "etcd": {"revision": snap.revision, "total_keys": snap.total_keys,
                 "db_size": snap.total_size, "version": etcd_version, "members": members},
        "files": {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                  for n, d in sorted(got.items())},
    }
    folder = _new_folder(inv.path)
    for name, data in got.items():
        write_private(folder / name, data)
    write_private(folder / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    taken = Taken(folder, manifest)
    verify(folder)  # what was written reads back whole
    limit = int(keep if keep is not None else inv.hosts[host].vars.get("backup_keep", 10))
    for old in prune(inv.path, limit):
        rep.print(f"  removed old backup {old.name} (backup_keep {limit})", style="dim")
    rep.print(f"  {taken.line()}")
    session.runlog.write_report(backup=str(folder))
    return taken


def _etcd_meta(parts: Mapping[str, str]) -> tuple[list[dict[str, Any]], str]:
    members: list[dict[str, Any]] = []
    try:
        for m in json.loads(parts.get("members", "")).get("members", []):
            members.append({"name": str(m.get("name", "")), "id": f"{int(m['ID']):x}",
                            "peer_urls": [str(u) for u in m.get("peerURLs", [])]})
    except (ValueError, KeyError, AttributeError, TypeError):
        pass
    version = ""
    try:
        status = json.loads(parts.get("status", ""))
        version = str((status[0] if isinstance(status, list) else status)["Status"]["version"])
    except (ValueError, KeyError, IndexError, TypeError):
        pass
    return sorted(members, key=lambda m: m["name"]), version


def _new_folder(inventory_path: str | Path) -> Path:
    root = backups_dir(inventory_path)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    name = f"{cluster_label(inventory_path)}-{stamp}"
    n = 1
    while (root / name).exists():  # two backups in one second
        n += 1
        name = f"{cluster_label(inventory_path)}-{stamp}-{n}"
    folder = root / name
    for d in (root.parent, root, folder):
        d.mkdir(mode=0o700, exist_ok=d is not folder)
    folder.chmod(0o700)
    return folder


def listed(inventory_path: str | Path) -> list[Path]:
    """This cluster's backups (folders with a manifest), oldest first."""
    root = backups_dir(inventory_path)
    prefix = cluster_label(inventory_path) + "-"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir()
                  if p.is_dir() and p.name.startswith(prefix) and (p / MANIFEST).is_file())


def prune(inventory_path: str | Path, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` backups of this cluster; the removed ones."""
    found = listed(inventory_path)
    old = found[:-keep] if keep > 0 else []
    for p in old:
        shutil.rmtree(p)
    return old


def verify(folder: str | Path) -> dict[str, Any]:
    """The backup's manifest, once every file matches its size and SHA-256 and the snapshot
    reads whole; BackupError naming the first file that does not."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BackupError(f"{folder}: no readable {MANIFEST} ({exc}); is this a gpuk8s "
                          "backup folder?") from None
    for name in REQUIRED:
        if name not in files:
            raise BackupError(f"{folder}: the manifest lists no {name}")
    for name, want in sorted(files.items()):
        if name not in FILES:
            raise BackupError(f"{folder}: the manifest lists an unknown file {name!r}")
        try:
            data = (folder / name).read_bytes()
        except OSError as exc:
            raise BackupError(f"{folder / name}: missing ({exc.strerror})") from None
        sha = hashlib.sha256(data).hexdigest()
        if len(data) != want.get("size") or sha != want.get("sha256"):
            raise BackupError(f"{folder / name}: its SHA-256 is {sha}, the manifest says "
                              f"{want.get('sha256')}: the file changed after the backup was "
                              "taken; use another backup")
    try:
        etcdsnap.status_of(folder / SNAPSHOT)
    except etcdsnap.SnapshotError as exc:
        raise BackupError(f"{folder / SNAPSHOT}: {exc}") from None
    return dict(manifest)


def newest(inventory_path: str | Path) -> tuple[Path, dt.timedelta] | None:
    """The newest backup of this cluster and its age, from its manifest's time."""
    for folder in reversed(listed(inventory_path)):
        try:
            made = json.loads((folder / MANIFEST).read_text())["created"]
            when = dt.datetime.strptime(made, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        return folder, dt.datetime.now(dt.UTC) - when
    return None
