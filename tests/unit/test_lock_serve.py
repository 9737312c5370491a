"""The air gap's pieces that need no lab: a bundle's checksums, the lines serve-bundle prints
(an inventory with them loads and checks clean), workloads pulled by the lock's digests, and the
base role's apt CA and OS mirror ops."""

from __future__ import annotations

import hashlib
import shutil
import socket
import ssl
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s.facts import HostFacts
from gpuk8s.facts.system import AptOsSources
from gpuk8s.inventory import load_inventory
from gpuk8s.lock import render
from gpuk8s.lock.aptindex import LockError
from gpuk8s.lock.bundle import check_sums, deb_name, write_sums
from gpuk8s.lock.serve import Served, _checked, distro, open_bundle, snippet
from gpuk8s.lock.tls import ensure_ca, server_cert
from gpuk8s.ops.apt import APT_CA_CONF, APT_CA_FILE, ca_conf, https_hosts
from gpuk8s.roles import HostContext, load_role
from gpuk8s.session import role_vars
from gpuk8s.workloads.commands import render_manifests
from tests.unit.scenarios import default_vars, fresh_facts

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "cluster"
    (root / "debs").mkdir(parents=True)
    (root / "debs" / "a_1_amd64.deb").write_bytes(b"deb a")
    (root / "images" / "blobs" / "sha256").mkdir(parents=True)
    (root / "images" / "blobs" / "sha256" / ("00" * 32)).write_bytes(b"layer")
    write_sums(root)
    return root


def test_checksums_name_the_changed_file_and_refuse_extra_ones(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    assert check_sums(root) == 2
    (root / "debs" / "a_1_amd64.deb").write_bytes(b"deb b")
    want = hashlib.sha256(b"deb a").hexdigest()
    with pytest.raises(LockError, match=f"a_1_amd64\\.deb: SHA256 [0-9a-f]{{64}} is not the "
                                        f"{want} SHA256SUMS lists"):
        check_sums(root)
    (root / "debs" / "a_1_amd64.deb").write_bytes(b"deb a")
    (root / "debs" / "z.deb").write_bytes(b"smuggled")
    with pytest.raises(LockError, match=r"debs/z\.deb is not listed in SHA256SUMS"):
        check_sums(root)
    (root / "debs" / "z.deb").unlink()
    (root / "SHA256SUMS").write_text(f"{want}  ../etc/passwd\n")
    with pytest.raises(LockError, match="is not a path inside the bundle"):
        check_sums(root)


def test_a_bundle_tarball_is_unpacked_and_checked_before_use(tmp_path: Path) -> None:
    root = _tree(tmp_path / "b" / "gpuk8s-bundle-x")
    tar = tmp_path / "b.tar.gz"
    with tarfile.open(tar, "w:gz") as fh:
        fh.add(root.parent, arcname="gpuk8s-bundle-x")
    got = open_bundle(tar, tmp_path / "state")
    assert got == tmp_path / "state" / "unpacked" / "gpuk8s-bundle-x" / "cluster"
    assert open_bundle(root.parent, tmp_path / "state2") == root
    shutil.rmtree(root / "images")
    with pytest.raises(LockError, match="listed in SHA256SUMS but missing"):
        open_bundle(root.parent, tmp_path / "state3")


LOCK: dict[str, Any] = {
    "apt": {"releases": {"debian-12-amd64": {"packages": {}, "os_archive": {}, "sources": {
        "kubernetes": {"url": "http://x/", "suite": "/", "components": "",
                       "key_url": "http://x/k", "key_fingerprint": "F" * 40,
                       "variable": "kubernetes_repo"},
        "docker": {"url": "http://d/", "suite": "bookworm", "components": "stable",
                   "key_url": "http://d/k", "key_fingerprint": "E" * 40,
                   "variable": "docker_repo"}}}}},
    "images": {"registry.k8s.io/pause:3.10.2": {"digest": DIGEST},
               "tensorflow/tensorflow:2.21.0-gpu": {"digest": DIGEST}}}


def test_the_printed_lines_make_an_inventory_that_checks_clean(tmp_path: Path) -> None:
    ca, _ = ensure_ca(tmp_path / "state")
    served = Served(tmp_path / "state", "10.88.0.1", 8443, 5443, "A" * 40, ca,
                    ("debian-12-amd64",))
    lines = yaml.safe_load(snippet(served, LOCK))
    assert lines["kubernetes_repo_url"] == \
        "https://10.88.0.1:8443/apt/{{ nvidia_cuda_distro }}/kubernetes/"
    assert lines["docker_repo_key_fingerprint"] == "A" * 40
    assert lines["apt_os_mirror_url"].endswith("/apt/{{ nvidia_cuda_distro }}/os/")
    assert lines["registry_mirrors"] == {
        r: [{"url": f"https://10.88.0.1:5443/v2/{r}", "ca_file": str(ca)}]
        for r in ("docker.io", "registry.k8s.io")}
    assert distro("ubuntu-24.04-amd64") == "ubuntu2404"
    inv = yaml.safe_load((ROOT / "inventories" / "lab.yaml").read_text())
    inv["all"]["vars"].update(lines)
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(inv))
    loaded = load_inventory(path)
    vars = role_vars(loaded.control_planes[0])
    assert vars["apt_ca_file"] == str(ca) and vars["docker_repo_key_fingerprint"] == "A" * 40


def test_the_certificate_names_every_address_in_its_san(tmp_path: Path) -> None:
    from cryptography import x509

    crt, key = server_cert(tmp_path, ["10.88.0.1", "admin.lab"])
    cert = x509.load_pem_x509_certificate(crt.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(i) for i in san.get_values_for_type(x509.IPAddress)] == ["10.88.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["admin.lab"]
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "ca.key").stat().st_mode & 0o777) == "0o600"
    # a real handshake, verified the strict way (Python 3.13's default: key identifiers)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(str(crt), str(key))
    client = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    client.verify_flags |= ssl.VERIFY_X509_STRICT
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def accept() -> None:
            conn, _ = listener.accept()
            with server.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        with socket.create_connection(("127.0.0.1", port)) as raw, \
                client.wrap_socket(raw, server_hostname="admin.lab") as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
            tls.sendall(b"x")
        thread.join(5)


def test_with_a_lock_a_workload_pulls_by_the_locked_digest(tmp_path: Path) -> None:
    inv = tmp_path / "lab.yaml"
    inv.write_text((ROOT / "inventories" / "lab.yaml").read_text())
    plain = render_manifests(inv, "tensorflow-job")
    assert "image: tensorflow/tensorflow:2.21.0-gpu\n" in plain
    inv.with_name("lab.gpuk8s.lock").write_text(render(LOCK))
    pinned = render_manifests(inv, "tensorflow-job")
    assert f"image: tensorflow/tensorflow:2.21.0-gpu@{DIGEST}\n" in pinned


def _base(vars: dict[str, Any], active: tuple[str, ...], off: tuple[str, ...]) -> list[Any]:
    fresh = fresh_facts("debian12", 0, "node", vars)
    facts = HostFacts("node", {**dict(fresh), AptOsSources(): (active, off)})
    ctx = HostContext("node", "base", vars, facts, {})
    return [op for op in load_role("base").plan(ctx)]


def test_the_os_mirror_sets_the_node_s_sources_aside_and_puts_them_back(tmp_path: Path
                                                                         ) -> None:
    ca, _ = ensure_ca(tmp_path)
    vars = default_vars(apt_os_mirror_url="https://10.88.0.1:8443/apt/debian12/os/",
                        apt_os_mirror_key_url="https://10.88.0.1:8443/apt/key.asc",
                        apt_os_mirror_key_fingerprint="A" * 40, apt_ca_file=str(ca))
    ops = {op.id: op for op in _base(vars, ("/etc/apt/sources.list",), ())}
    mirror = ops["base | OS archive mirror"]
    text = "\n".join(mirror.commands)
    assert f"--cacert {APT_CA_FILE}" in text and "gpuk8s-os.list" in text
    aside = ops["base | the node's own apt sources"]
    assert aside.commands == ("mv -f /etc/apt/sources.list /etc/apt/sources.list.gpuk8s-off",)
    conf = ops["base | apt CA"]
    assert conf.changes and APT_CA_CONF in conf.reason
    assert ca_conf(["10.88.0.1"]) == \
        'Acquire::https::10.88.0.1::CAInfo "/usr/local/share/gpuk8s/apt-ca.crt";\n'
    assert https_hosts(vars) == {"10.88.0.1", "pkgs.k8s.io", "developer.download.nvidia.com",
                                 "nvidia.github.io", "download.docker.com"}
    ids = list(ops)
    assert ids.index("base | apt CA") < ids.index("base | OS archive mirror") < \
        ids.index("base | the node's own apt sources") < ids.index("base | packages")
    back = {op.id: op for op in _base(default_vars(), (),
                                      ("/etc/apt/sources.list.gpuk8s-off",))}
    assert back["base | the node's own apt sources"].commands == (
        "mv -f /etc/apt/sources.list.gpuk8s-off /etc/apt/sources.list",)
    assert not back["base | apt CA"].changes


def test_names_in_a_bundle_cannot_reach_outside_its_debs(tmp_path: Path) -> None:
    """The lock and bundle.json travel inside the bundle: a file name that leaves debs/ (the
    serve state's CA key, say), an odd source or release name, or a .deb that is not the one
    the lock pins are refused before any repository is built."""
    root = _tree(tmp_path)
    sha = hashlib.sha256(b"deb a").hexdigest()
    lock = {"apt": {"releases": {"debian-12-amd64": {"sources": {}, "os_archive": {}, "packages": {
        "a": {"version": "1", "source": "kubernetes", "filename": "a.deb", "size": 5,
              "sha256": sha}}}}}}
    assert _checked(root, lock, {"releases": {"debian-12-amd64": {"a": "a_1_amd64.deb"}}}) == {
        "debian-12-amd64": {"a": root / "debs" / "a_1_amd64.deb"}}
    for files in ({"a": "../../state/ca.key"}, {"a": "a_1_amd64.deb\nx.deb"}, {}):
        with pytest.raises(LockError, match=r"is not the \.deb the lock pins"):
            _checked(root, lock, {"releases": {"debian-12-amd64": files}})
    other = yaml.safe_load(yaml.safe_dump(lock))
    other["apt"]["releases"]["debian-12-amd64"]["packages"]["a"]["sha256"] = "0" * 64
    with pytest.raises(LockError, match=r"is not the \.deb the lock pins"):
        _checked(root, other, {"releases": {"debian-12-amd64": {"a": "a_1_amd64.deb"}}})
    other = yaml.safe_load(yaml.safe_dump(lock))
    other["apt"]["releases"]["debian-12-amd64"]["packages"]["a"]["source"] = "../os"
    with pytest.raises(LockError, match=r"names an apt source '\.\./os'"):
        _checked(root, other, {"releases": {"debian-12-amd64": {"a": "a_1_amd64.deb"}}})
    other = {"apt": {"releases": {"../x-1-amd64": {}}}}
    with pytest.raises(LockError, match=r"names an OS release '\.\./x-1-amd64'"):
        _checked(root, other, {"releases": {}})
    for url in ("http://h/pool/..", "http://h/a%0ab.deb", "http://h/x/../../etc/passwd"):
        with pytest.raises(LockError, match=r"is not a \.deb file name"):
            deb_name(url)
    assert deb_name("http://h/pool/c/curl_7.88.1-10%2bdeb12u15_amd64.deb") == \
        "curl_7.88.1-10+deb12u15_amd64.deb"
