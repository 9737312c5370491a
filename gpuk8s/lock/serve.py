"""`invoke serve-bundle BUNDLE`: a cluster bundle served from the admin machine, over HTTPS, to
nodes that reach nothing else.

- First the bundle is checked (every file against its SHA256SUMS): a changed .deb or layer is
  refused, named, before anything is served.
- apt: one repository per OS release and source, laid out as the roles' sources are written
  (flat, ``URL /``, for pkgs.k8s.io's, NVIDIA's and the toolkit's; ``dists/<codename>/stable``
  for Docker's), plus the OS archive's packages (``os/``), each holding only the locked
  versions (so apt's candidate is the locked one), made with apt-ftparchive and signed by a key
  made for this admin machine (ed25519, as apt 2.7's APT::Key::Assert-Pubkey-Algo wants:
  apt-pkg/init.cc@2.7.14). Served read-only by a small static HTTPS server (GET and HEAD of
  files, nothing else), which the lab's tests hold against the nodes' real apt.
- images: Debian's docker-registry (the CNCF distribution registry 2.8), its storage filled
  through its own HTTP API from the bundle's OCI layout by a writable instance on loopback, then
  served read-only (storage.maintenance.readonly, upload purging off: the registry never
  writes) over TLS, one repository per upstream registry (``registry.k8s.io/pause``), as
  ``registry_mirrors`` entries with a path reach it (containerd's override_path).
- TLS: a CA made once for this admin machine, and a server certificate with the listen address
  (and ``--name``s) in its subjectAltName (Go's TLS, containerd's, ignores the CN).

It prints the inventory lines that send the nodes there, then serves until interrupted.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tarfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from gpuk8s.lock.aptindex import LockError
from gpuk8s.lock.bundle import DEB_NAME, SUMS, check_sums
from gpuk8s.lock.digests import Reference
from gpuk8s.lock.registry import _registry, build_registry
from gpuk8s.lock.tls import server_cert

DEFAULT_STATE = "/var/lib/gpuk8s-bundle"
ORIGIN = "gpuk8s-bundle"  # Origin/Label never change between bundles (apt refuses that)


@dataclass(frozen=True)
class Served:
    state: Path
    host: str
    apt_port: int
    registry_port: int
    fingerprint: str
    ca: Path
    releases: tuple[str, ...]

    @property
    def apt_url(self) -> str:
        return f"https://{_url_host(self.host)}:{self.apt_port}/apt"

    @property
    def registry_url(self) -> str:
        return f"https://{_url_host(self.host)}:{self.registry_port}"


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _run(cmd: Sequence[str], **kw: Any) -> str:
    try:
        res = subprocess.run(list(cmd), capture_output=True, text=True, **kw)
    except FileNotFoundError:
        raise LockError(f"{cmd[0]} is missing on this machine: apt install "
                        f"{ {'apt-ftparchive': 'apt-utils'}.get(cmd[0], cmd[0]) }") from None
    if res.returncode != 0:
        raise LockError(f"{' '.join(cmd[:3])}... failed: {res.stderr.strip()[-400:]}")
    return res.stdout


# -- the bundle --------------------------------------------------------------------------------
def open_bundle(bundle: Path, state: Path) -> Path:
    """The checked cluster/ folder of a bundle (a folder, or its .tar.gz unpacked under
    ``state``); a changed file is refused here, before anything is served."""
    if bundle.is_file():
        dest = state / "unpacked"
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        with tarfile.open(bundle) as tar:
            _extract(tar, dest)
        found = sorted(dest.glob("*/cluster")) + sorted(dest.glob("cluster"))
        if not found:
            raise LockError(f"{bundle}: no cluster/ in it: make it with `invoke bundle "
                            "--cluster`")
        root = found[0]
    else:
        root = bundle / "cluster" if (bundle / "cluster").is_dir() else bundle
    check_sums(root)
    return root


def _extract(tar: tarfile.TarFile, dest: Path) -> None:
    """Unpack only plain files and folders that stay inside ``dest`` (tarfile's "data" filter
    where this Python has it, PEP 706; the same rules by hand otherwise)."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
        return
    for member in tar.getmembers():
        target = (dest / member.name).resolve()
        if not (member.isfile() or member.isdir()) or not target.is_relative_to(dest.resolve()):
            raise LockError(f"the bundle holds {member.name!r}, which is not a plain file or "
                            "folder inside it; refusing the bundle")
    tar.extractall(dest)


#: names a bundle may give its OS releases and apt sources (they become folders served)
RELEASE = re.compile(r"[a-z0-9][a-z0-9.+~-]*-[0-9][0-9.]*-[a-z0-9]+")
SOURCE = re.compile(r"[a-z0-9][a-z0-9.-]{0,62}")


def _checked(root: Path, lock: Mapping[str, Any], bundle: Mapping[str, Any]
             ) -> dict[str, dict[str, Path]]:
    """release -> package -> its .deb in the bundle, each file name a plain .deb name inside
    debs/ and each file the one the lock pins (its SHA256, as SHA256SUMS, just checked, says):
    the lock and bundle.json travel with the bundle, so nothing in them is taken on trust."""
    sums = dict((line.partition("  ")[2], line.partition("  ")[0])
                for line in (root / SUMS).read_text().splitlines())
    out: dict[str, dict[str, Path]] = {}
    for release, body in lock["apt"]["releases"].items():
        if not RELEASE.fullmatch(str(release)):
            raise LockError(f"the bundle's lock names an OS release {release!r}; refusing it")
        files = bundle["releases"].get(release, {})
        pins = {**body.get("os_archive", {}), **body.get("packages", {})}
        out[release] = {}
        for name, pkg in pins.items():
            file = str(files.get(name, ""))
            if not DEB_NAME.fullmatch(file) or sums.get(f"debs/{file}") != pkg["sha256"]:
                raise LockError(f"the bundle's {name} ({file or 'no file'}) is not the .deb "
                                f"the lock pins (SHA256 {pkg['sha256']}); refusing the bundle")
            out[release][name] = root / "debs" / file
        for pkg in body.get("packages", {}).values():
            if not SOURCE.fullmatch(str(pkg["source"])) or pkg["source"] == "os":
                raise LockError(f"the bundle's lock names an apt source {pkg['source']!r}; "
                                "refusing it")
    return out


# -- apt ---------------------------------------------------------------------------------------
def _gpg(home: Path, *args: str) -> str:
    return _run(["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback",
                 "--passphrase", "", *args])


def signing_key(state: Path) -> str:
    """The fingerprint of the admin machine's repository key (ed25519, made once)."""
    home = state / "gnupg"
    if not home.is_dir():
        home.mkdir(parents=True, mode=0o700)
        _gpg(home, "--quick-gen-key", "gpuk8s bundle repository <root@localhost>", "ed25519",
             "sign", "never")
    out = _gpg(home, "--with-colons", "--list-secret-keys")
    fprs = [line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:")]
    if not fprs:
        raise LockError(f"{home}: no signing key")
    return fprs[0]


def distro(release: str) -> str:
    """``debian-12-amd64`` -> ``debian12``: the {{ nvidia_cuda_distro }} URL placeholder."""
    os_id, version, _ = release.rsplit("-", 2)
    return f"{os_id}{version.replace('.', '')}"


def _link(repo: Path, debs: Sequence[Path]) -> None:
    repo.mkdir(parents=True, exist_ok=True)
    for deb in debs:
        target = repo / deb.name
        if not target.exists():
            try:
                os.link(deb, target)
            except OSError:  # another file system
                shutil.copyfile(deb, target)


def _flat(repo: Path, debs: Sequence[Path]) -> None:
    _link(repo, debs)
    packages = _run(["apt-ftparchive", "packages", "."], cwd=repo)
    (repo / "Packages").write_text(packages)


def _release(directory: Path, fpr: str, home: Path, suite: str, **fields: str) -> None:
    opts = [f"-oAPT::FTPArchive::Release::{k}={v}" for k, v in
            {"Origin": ORIGIN, "Label": ORIGIN, "Suite": suite, **fields}.items()]
    (directory / "Release").unlink(missing_ok=True)
    release = _run(["apt-ftparchive", *opts, "release", "."], cwd=directory)
    (directory / "Release").write_text(release)
    (directory / "InRelease").unlink(missing_ok=True)
    _gpg(home, "--local-user", fpr, "--digest-algo", "SHA512", "--clearsign", "-o",
         str(directory / "InRelease"), str(directory / "Release"))


def build_apt(root: Path, state: Path) -> tuple[str, list[str]]:
    """The apt repositories of the bundle under ``state``/www/apt; the key's fingerprint and
    the releases served."""
    lock = yaml.safe_load((root / "gpuk8s.lock").read_text())
    debs_of = _checked(root, lock, json.loads((root / "bundle.json").read_text()))
    fpr = signing_key(state)
    home = state / "gnupg"
    www = state / "www" / "apt"
    shutil.rmtree(www, ignore_errors=True)
    www.mkdir(parents=True)
    (www / "key.asc").write_text(_gpg(home, "--armor", "--export", fpr))
    releases = []
    for release, body in sorted(lock["apt"]["releases"].items()):
        files = debs_of[release]
        sources = body["sources"]
        top = www / distro(release)
        by_source: dict[str, list[Path]] = {}
        for name, pkg in body["packages"].items():
            by_source.setdefault(pkg["source"], []).append(files[name])
        by_source["os"] = [files[n] for n in body.get("os_archive") or {}]
        for source, debs in sorted(by_source.items()):
            src = sources.get(source, {"suite": "/"})
            if src["suite"] != "/" and not SOURCE.fullmatch(src["suite"]):
                raise LockError(f"the bundle's lock gives apt source {source} the suite "
                                f"{src['suite']!r}; refusing it")
            if src["suite"] == "/":
                _flat(top / source, debs)
                _release(top / source, fpr, home, distro(release))
            else:  # dists/<suite>/<component>/binary-<arch>/, the pool beside it
                comp = src["components"].split()[0]
                _link(top / source / "pool", debs)
                suite = top / source / "dists" / src["suite"]
                index = suite / comp / f"binary-{release.rsplit('-', 1)[1]}"
                index.mkdir(parents=True, exist_ok=True)
                text = _run(["apt-ftparchive", "packages", "pool"], cwd=top / source)
                (index / "Packages").write_text(text)
                _release(suite, fpr, home, src["suite"], Codename=src["suite"],
                         Components=comp, Architectures=release.rsplit("-", 1)[1])
        releases.append(release)
    # gpg started an agent for this home to sign: it has nothing more to do
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"],
                   capture_output=True)
    return fpr, releases


class _Files(http.server.SimpleHTTPRequestHandler):
    """GET and HEAD of the served folder's files; no listings, no other method. The TLS
    handshake happens here, in the connection's own thread, within ``timeout``: a client that
    never finishes it holds only its own thread, never the server's accept loop."""

    timeout = 60

    def setup(self) -> None:
        self.request.settimeout(self.timeout)
        self.request.do_handshake()
        super().setup()

    def list_directory(self, path: str) -> None:  # type: ignore[override]
        self.send_error(404)
        return None

    def log_message(self, format: str, *args: Any) -> None:
        line = f"{self.client_address[0]} {format % args}\n"
        with open(self.server.access_log, "a") as fh:  # type: ignore[attr-defined]
            fh.write(line)


def apt_server(www: Path, host: str, port: int, crt: Path, key: Path, log: Path
               ) -> http.server.ThreadingHTTPServer:
    handler = functools.partial(_Files, directory=str(www))
    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class Server(http.server.ThreadingHTTPServer):
        address_family = family
        daemon_threads = True

    server = Server((host, port), handler)
    server.access_log = log  # type: ignore[attr-defined]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(crt), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True,
                                        do_handshake_on_connect=False)
    return server


# -- the snippet ---------------------------------------------------------------------------------
def snippet(served: Served, lock: dict[str, Any]) -> str:
    """The inventory lines that send the nodes to this server."""
    base = f"{served.apt_url}/{{{{ nvidia_cuda_distro }}}}"
    out: dict[str, Any] = {}
    sources = {n: src for release in lock["apt"]["releases"].values()
               for n, src in release.get("sources", {}).items()}
    for name, src in sorted(sources.items()):
        var = src.get("variable")
        if not var:
            continue
        out[f"{var}_url"] = f"{base}/{name}/"
        out[f"{var}_key_url"] = f"{served.apt_url}/key.asc"
        out[f"{var}_key_fingerprint"] = served.fingerprint
    out["apt_os_mirror_url"] = f"{base}/os/"
    out["apt_os_mirror_key_url"] = f"{served.apt_url}/key.asc"
    out["apt_os_mirror_key_fingerprint"] = served.fingerprint
    out["apt_ca_file"] = str(served.ca)
    registries = sorted({Reference.parse(i).registry for i in lock["images"]})
    out["registry_mirrors"] = {r: [{"url": f"{served.registry_url}/v2/{r}",
                                    "ca_file": str(served.ca)}] for r in registries}
    return yaml.safe_dump(out, sort_keys=False, default_flow_style=False, width=200)


def prepare(bundle: str | Path, *, listen: str, names: Sequence[str] = (),
            apt_port: int = 8443, registry_port: int = 5443,
            state: str | Path = DEFAULT_STATE, out: TextIO | None = None) -> Served:
    """Check the bundle, then build what serve() serves (apt repositories, registry storage,
    certificate); nothing listens yet."""
    try:
        address = ipaddress.ip_address(listen)
    except ValueError:
        address = None
    if address is not None and address.is_unspecified:
        raise LockError(f"--listen {listen}: give the address the nodes reach this machine at "
                        "(it goes into the URLs they are given and into the certificate)")
    state = Path(state)
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    root = open_bundle(Path(bundle), state)
    if out:
        lock_sum = hashlib.sha256((root / "gpuk8s.lock").read_bytes()).hexdigest()
        out.write(f"serve-bundle: {root}: every file matches its SHA256SUMS; its lock's "
                  f"SHA256 is {lock_sum} (compare with the lock you made)\n")
    fpr, releases = build_apt(root, state)
    count = build_registry(root, state)
    server_cert(state, [listen, *names])
    shutil.copyfile(root / "gpuk8s.lock", state / "gpuk8s.lock")
    if out:
        out.write(f"serve-bundle: apt repositories for {', '.join(releases)} (key {fpr}), "
                  f"{count} images in the registry\n")
    return Served(state, listen, apt_port, registry_port, fpr, state / "ca.crt",
                  tuple(releases))


def serve(served: Served, *, out: TextIO, stop: threading.Event | None = None) -> None:
    """Serve until interrupted (or ``stop`` is set): apt over HTTPS, the registry read-only."""
    crt, key = served.state / "server.crt", served.state / "server.key"
    registry = _registry(served.state, f"{_url_host(served.host)}:{served.registry_port}",
                         True, (crt, key), served.state / "registry.log")
    httpd = apt_server(served.state / "www", served.host, served.apt_port, crt, key,
                       served.state / "apt-access.log")
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    lock = yaml.safe_load((served.state / "gpuk8s.lock").read_text())
    out.write(f"serve-bundle: apt on {served.apt_url}/, registry on {served.registry_url} "
              "(read-only); add to the inventory's all.vars:\n\n" + snippet(served, lock)
              + "\n")
    out.flush()
    stop = stop or threading.Event()
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1):
            if registry.poll() is not None:
                raise LockError(f"docker-registry exited; see {served.state / 'registry.log'}")
    except KeyboardInterrupt:
        pass
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)
        httpd.shutdown()
        registry.terminate()
        registry.wait(timeout=30)


def serve_bundle(bundle: str | Path, *, listen: str, names: Sequence[str] = (),
                 apt_port: int = 8443, registry_port: int = 5443,
                 state: str | Path = DEFAULT_STATE, out: TextIO | None = None) -> None:
    import sys

    out = out or sys.stdout
    served = prepare(bundle, listen=listen, names=names, apt_port=apt_port,
                     registry_port=registry_port, state=state, out=out)
    serve(served, out=out)


__all__ = ["prepare", "serve", "serve_bundle", "snippet"]
