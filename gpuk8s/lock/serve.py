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
import http.server
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tarfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from gpuk8s.lock.aptindex import LockError
from gpuk8s.lock.bundle import check_sums
from gpuk8s.lock.digests import INDEX_TYPES, Reference
from gpuk8s.lock.tls import server_cert

REGISTRY = "/usr/bin/docker-registry"
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
            tar.extractall(dest, filter="data")
        found = sorted(dest.glob("*/cluster")) + sorted(dest.glob("cluster"))
        if not found:
            raise LockError(f"{bundle}: no cluster/ in it: make it with `invoke bundle "
                            "--cluster`")
        root = found[0]
    else:
        root = bundle / "cluster" if (bundle / "cluster").is_dir() else bundle
    check_sums(root)
    return root


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
    fpr = signing_key(state)
    home = state / "gnupg"
    www = state / "www" / "apt"
    shutil.rmtree(www, ignore_errors=True)
    www.mkdir(parents=True)
    (www / "key.asc").write_text(_gpg(home, "--armor", "--export", fpr))
    bundle = json.loads((root / "bundle.json").read_text())
    sources = lock["apt"]["sources"]
    releases = []
    for release, body in sorted(lock["apt"]["releases"].items()):
        files = bundle["releases"][release]
        top = www / distro(release)
        by_source: dict[str, list[Path]] = {}
        for name, pkg in body["packages"].items():
            by_source.setdefault(pkg["source"], []).append(root / "debs" / files[name])
        by_source["os"] = [root / "debs" / files[n] for n in body.get("os_archive") or {}]
        for source, debs in sorted(by_source.items()):
            src = sources.get(source, {"suite": "/"})
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
    return fpr, releases


class _Files(http.server.SimpleHTTPRequestHandler):
    """GET and HEAD of the served folder's files; no listings, no other method."""

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
    server.socket = context.wrap_socket(server.socket, server_side=True)
    return server


# -- the registry --------------------------------------------------------------------------------
REGISTRY_CONFIG = """\
version: 0.1
log:
  level: warn
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: {data}
  maintenance:
    uploadpurging:
      enabled: false
    readonly:
      enabled: {readonly}
http:
  addr: {addr}
{tls}"""


def _registry(state: Path, addr: str, readonly: bool, tls: tuple[Path, Path] | None,
              log: Path) -> subprocess.Popen[bytes]:
    if not os.path.exists(REGISTRY):
        raise LockError(f"{REGISTRY} is missing: apt install docker-registry (Debian's CNCF "
                        "distribution registry; its own service on :5000 can stay off: "
                        "systemctl disable --now docker-registry)")
    conf = state / ("registry-ro.yml" if readonly else "registry-rw.yml")
    tls_text = (f"  tls:\n    certificate: {tls[0]}\n    key: {tls[1]}\n"
                "    minimumtls: tls1.2\n") if tls else ""
    conf.write_text(REGISTRY_CONFIG.format(data=state / "registry", addr=addr,
                                           readonly=str(readonly).lower(), tls=tls_text))
    with open(log, "ab") as fh:
        proc = subprocess.Popen([REGISTRY, "serve", str(conf)], stdin=subprocess.DEVNULL,
                                stdout=fh, stderr=fh, start_new_session=True)
    host, _, port = addr.rpartition(":")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.settimeout(0.5)
            if s.connect_ex((host.strip("[]"), int(port))) == 0:
                return proc
        time.sleep(0.1)
    proc.kill()
    raise LockError(f"docker-registry did not listen on {addr}; see {log}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _put(url: str, data: bytes, headers: dict[str, str], method: str = "PUT"
         ) -> tuple[int, dict[str, str]]:
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            return resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers or {})


def _layout(images: Path) -> Iterator[tuple[str, str, str]]:
    """(image, media type, digest) of each image the bundle's OCI layout names."""
    index = json.loads((images / "index.json").read_text())
    for desc in index["manifests"]:
        yield (desc["annotations"]["org.opencontainers.image.ref.name"], desc["mediaType"],
               desc["digest"])


def import_images(images: Path, base: str) -> int:
    """Push the layout's images into a (writable) registry at ``base``, under
    ``<registry>/<repository>``: blobs, then manifests (children before their index, which
    distribution 2.8.2 requires), then the tag; the count of images."""
    count = 0
    for image, media, digest in _layout(images):
        ref = Reference.parse(image)
        _push_manifest(images / "blobs" / "sha256", base, f"{ref.registry}/{ref.repository}",
                       image, media, digest, ref.tag if not ref.digest else "")
        count += 1
    return count


def _push_manifest(blobs: Path, base: str, name: str, image: str, media: str, digest: str,
                   tag: str = "") -> None:
    body = (blobs / digest[7:]).read_bytes()
    doc = json.loads(body)
    if media in INDEX_TYPES or "manifests" in doc:
        for child in doc.get("manifests", []):
            _push_manifest(blobs, base, name, image, child.get("mediaType", ""),
                           child["digest"])
    else:
        for desc in [doc["config"], *doc.get("layers", [])]:
            _push_blob(base, name, blobs / desc["digest"][7:], desc["digest"])
    for ref_name in (digest, tag):
        if not ref_name:
            continue
        status, _ = _put(f"{base}/v2/{name}/manifests/{ref_name}", body,
                         {"Content-Type": media or doc.get("mediaType", "")})
        if status != 201:
            raise LockError(f"the bundle registry refused {image} ({ref_name}): HTTP {status}")


def _push_blob(base: str, name: str, path: Path, digest: str) -> None:
    status, _ = _put(f"{base}/v2/{name}/blobs/{digest}", b"", {}, method="HEAD")
    if status == 200:
        return
    status, headers = _put(f"{base}/v2/{name}/blobs/uploads/", b"", {}, method="POST")
    location = headers.get("Location", "")
    if status != 202 or not location:
        raise LockError(f"the bundle registry refused an upload to {name}: HTTP {status}")
    if location.startswith("/"):
        location = base + location
    sep = "&" if "?" in location else "?"
    with path.open("rb") as fh:
        req = urllib.request.Request(f"{location}{sep}digest={digest}", data=fh, method="PUT",
                                     headers={"Content-Type": "application/octet-stream",
                                              "Content-Length": str(path.stat().st_size)})
        try:
            with urllib.request.urlopen(req, timeout=600) as resp:
                status = resp.status
        except urllib.error.HTTPError as exc:
            status = exc.code
    if status != 201:
        raise LockError(f"the bundle registry refused blob {digest} of {name}: HTTP {status}")


def build_registry(root: Path, state: Path) -> int:
    """The registry's storage, filled from the bundle by a writable instance on loopback."""
    shutil.rmtree(state / "registry", ignore_errors=True)
    (state / "registry").mkdir(parents=True)
    port = _free_port()
    proc = _registry(state, f"127.0.0.1:{port}", False, None, state / "registry-import.log")
    try:
        return import_images(root / "images", f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# -- the snippet ---------------------------------------------------------------------------------
def snippet(served: Served, lock: dict[str, Any]) -> str:
    """The inventory lines that send the nodes to this server."""
    base = f"{served.apt_url}/{{{{ nvidia_cuda_distro }}}}"
    out: dict[str, Any] = {}
    for name, src in sorted(lock["apt"]["sources"].items()):
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
    state = Path(state)
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    root = open_bundle(Path(bundle), state)
    if out:
        out.write(f"serve-bundle: {root}: every file matches its SHA256SUMS\n")
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
