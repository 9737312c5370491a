"""Backups without a cluster: the snapshot reader against a snapshot the real etcd 3.5.30 wrote
(tests/fixtures/real/etcd-3.5.30/, with etcdutl's own status of it), a backup folder's checks,
which backups are kept, and the node script's shape."""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from gpuk8s import backups, etcdsnap

REAL = Path(__file__).parents[1] / "fixtures" / "real" / "etcd-3.5.30"


def test_the_reader_agrees_with_etcdutl_on_a_real_snapshot() -> None:
    said = json.loads((REAL / "snapshot-status.json").read_text())
    got = etcdsnap.status_of(REAL / "snapshot.db")
    assert (got.revision, got.total_keys, got.total_size) == \
        (said["revision"], said["totalKey"], said["totalSize"])
    assert got.checksum


def test_a_changed_byte_breaks_etcds_checksum() -> None:
    data = bytearray((REAL / "snapshot.db").read_bytes())
    data[9000] ^= 0x40
    with pytest.raises(etcdsnap.SnapshotError, match="does not match the one etcd appended"):
        etcdsnap.status(bytes(data))


def test_a_cut_or_foreign_file_is_named() -> None:
    data = (REAL / "snapshot.db").read_bytes()[:-32]  # the db alone, no trailer
    assert not etcdsnap.status(data).checksum
    with pytest.raises(etcdsnap.SnapshotError, match="truncated"):
        etcdsnap.status(data[:12288])
    with pytest.raises(etcdsnap.SnapshotError, match="no valid bbolt meta page"):
        etcdsnap.status(b"PK\x03\x04" + bytes(20000))


def _pki_tar(ca_pem: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("pki/ca.crt")
        info.size = len(ca_pem)
        tar.addfile(info, io.BytesIO(ca_pem))
    return buf.getvalue()


def _folder(root: Path, name: str, created: str = "2026-11-29T10:00:00Z") -> Path:
    """A backup folder as take() writes one, from the real snapshot."""
    folder = root / "artifacts" / "backups" / name
    folder.mkdir(parents=True)
    files = {"etcd-snapshot.db": (REAL / "snapshot.db").read_bytes(),
             "pki.tar": _pki_tar(b"not needed by verify\n"), "admin.conf": b"apiVersion: v1\n"}
    for n, d in files.items():
        (folder / n).write_bytes(d)
    manifest = {"format": 1, "created": created, "etcd": {"revision": 43},
                "files": {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                          for n, d in files.items()}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_verify_accepts_a_whole_backup_and_names_what_is_wrong(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "lab-20261129T100000Z")
    assert backups.verify(folder)["etcd"]["revision"] == 43
    (folder / "admin.conf").write_bytes(b"apiVersion: v2\n")
    with pytest.raises(backups.BackupError, match=r"admin\.conf: its SHA-256 is"):
        backups.verify(folder)
    (folder / "admin.conf").unlink()
    with pytest.raises(backups.BackupError, match=r"admin\.conf: missing"):
        backups.verify(folder)
    (folder / "manifest.json").write_text("{")
    with pytest.raises(backups.BackupError, match=r"no readable manifest\.json"):
        backups.verify(folder)


def test_a_manifest_naming_a_file_outside_the_backup_is_refused(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "lab-20261129T100000Z")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["../../etc/passwd"] = {"size": 1, "sha256": "0" * 64}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(backups.BackupError, match="unknown file"):
        backups.verify(folder)


def test_only_this_clusters_newest_backups_are_kept(tmp_path: Path) -> None:
    inv = tmp_path / "lab.yaml"
    for stamp in ("20261101T000000Z", "20261102T000000Z", "20261103T000000Z"):
        _folder(tmp_path, f"lab-{stamp}")
    _folder(tmp_path, "other-20261101T000000Z")      # another inventory's
    (tmp_path / "artifacts" / "backups" / "lab-notes").mkdir()  # no manifest: not a backup
    removed = backups.prune(inv, 2)
    assert [p.name for p in removed] == ["lab-20261101T000000Z"]
    assert [p.name for p in backups.listed(inv)] == ["lab-20261102T000000Z",
                                                    "lab-20261103T000000Z"]
    assert (tmp_path / "artifacts" / "backups" / "other-20261101T000000Z").is_dir()
    assert (tmp_path / "artifacts" / "backups" / "lab-notes").is_dir()


def test_the_newest_backup_and_its_age(tmp_path: Path) -> None:
    inv = tmp_path / "lab.yaml"
    assert backups.newest(inv) is None
    made = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    _folder(tmp_path, "lab-20261101T000000Z", "2026-11-01T00:00:00Z")
    _folder(tmp_path, "lab-20261129T070000Z", made)
    folder, age = backups.newest(inv) or (None, None)
    assert folder is not None and folder.name == "lab-20261129T070000Z"
    assert age is not None and 4.9 * 3600 < age.total_seconds() < 5.1 * 3600


def test_the_cluster_label_is_a_safe_file_name() -> None:
    assert backups.cluster_label("inventories/lab.yaml") == "lab"
    assert backups.cluster_label("/x/My Lab (GPU).ini") == "my-lab-gpu"
    assert backups.cluster_label("/x/__.yaml") == "cluster"


def _ca_pem() -> str:
    """A self-signed CA as kubeadm makes one (CN kubernetes), made now."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1).not_valid_before(now)
            .not_valid_after(now + dt.timedelta(days=3650)).sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def test_the_ca_fingerprint_is_the_certificates_der_sha256() -> None:
    import ssl

    pem = _ca_pem()
    assert backups.ca_fingerprint(_pki_tar(pem.encode())) == \
        hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()
    with pytest.raises(backups.BackupError, match="not a PEM certificate"):
        backups.ca_fingerprint(_pki_tar(b"garbage"))


def test_the_node_script_snapshots_inside_etcds_own_container() -> None:
    script = backups.stage_script()
    # etcdctl of the etcd image, found by the kubelet's labels, writing into etcd's data mount
    assert "--label io.kubernetes.container.name=etcd" in script
    assert 'exec "$id" etcdctl --endpoints=https://127.0.0.1:2379' in script
    assert "snapshot save /var/lib/etcd/gpuk8s-snapshot.db" in script
    # the copy in etcd's folder goes whatever happens; an earlier run's stage is swept
    assert "trap 'rm -f /var/lib/etcd/gpuk8s-snapshot.db" in script
    assert script.index("rm -rf /var/tmp/gpuk8s-backup.*") < script.index("mktemp -d")
    assert "umask 077" in script


def test_sections_of_the_node_output() -> None:
    out = ("noise\n## stage /var/tmp/gpuk8s-backup.AbC123\n## files\n10 " + "a" * 64 +
           " pki.tar\n## members\n{\"members\": []}\n")
    parts = backups._sections(out)
    assert parts["stage"] == "/var/tmp/gpuk8s-backup.AbC123"
    assert parts["files"].endswith("pki.tar") and parts["members"] == '{"members": []}'
    assert backups._STAGE_RE.fullmatch(parts["stage"])
    assert not backups._STAGE_RE.fullmatch("/var/tmp/gpuk8s-backup.x; rm -rf /")


def test_etcd_meta_from_etcdctls_json() -> None:
    members = {"members": [{"ID": 13668033151171901709, "name": "cp-01",
                            "peerURLs": ["https://10.88.0.10:2380"]}]}
    status = [{"Endpoint": "https://127.0.0.1:2379", "Status": {"version": "3.6.8"}}]
    got, version = backups._etcd_meta({"members": json.dumps(members),
                                       "status": json.dumps(status)})
    assert got == [{"name": "cp-01", "id": "bdae9bbc11dd390d",
                    "peer_urls": ["https://10.88.0.10:2380"]}]
    assert version == "3.6.8"


def test_a_backup_folder_is_made_private(tmp_path: Path) -> None:
    folder = backups._new_folder(tmp_path / "lab.yaml")
    again = backups._new_folder(tmp_path / "lab.yaml")
    assert folder != again and again.name.startswith(folder.name)  # same second: -2
    for d in (folder, again, folder.parent):
        assert d.stat().st_mode & 0o777 == 0o700
    shutil.rmtree(folder.parent)
