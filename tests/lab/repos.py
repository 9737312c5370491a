"""Lab apt repositories laid out like the upstream ones, signed by one lab key.

Test infrastructure for gpuk8s (tests/lab/CONTRACT.md); never shipped to users.

    build_all(force=False) -> Path        # <cache>/repos/www, built and signed
    serve(listen, background=True)        # ThreadingHTTPServer on the www root
    ensure_served(listen) / stop_serving()
    mirror_settings(base_url) -> dict     # inventory variables pointing gpuk8s at the lab repos
    python -m tests.lab.repos --listen 10.88.0.1:8081   # build if needed, serve, print settings
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # python tests/lab/repos.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import yaml

from tests.lab import debs, net
from tests.lab.paths import LAB_KEY_FINGERPRINT, key_pins, registry_mirrors, services_dir

DEFAULT_LISTEN = "10.88.0.1:8081"
LAYOUT_VERSION = "2"
# Debian packages whose real binaries are repackaged (downloaded from deb.debian.org once).
_DEB_SIGNED = "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]"
SID_LIST = f"{_DEB_SIGNED} http://deb.debian.org/debian sid main\n"
BOOKWORM_LIST = (
    f"{_DEB_SIGNED} http://deb.debian.org/debian bookworm main\n"
    f"{_DEB_SIGNED} http://deb.debian.org/debian-security bookworm-security main\n"
)


def cache_dir() -> Path:
    return Path(os.environ.get("GPUK8S_LAB_CACHE", "/var/cache/gpuk8s-lab"))


def repos_dir() -> Path:
    return cache_dir() / "repos"


def www_root() -> Path:
    return repos_dir() / "www"


@dataclass(frozen=True)
class Repo:
    id: str
    path: str  # relative to the www root
    keys: tuple[str, ...]  # key file paths relative to the www root (ASCII-armoured)
    suite: str | None = None  # None: flat repo ("deb URL /"); else dists/<suite>/<component>
    component: str = "main"
    origin: str = "gpuk8s-lab"
    label: str = "gpuk8s-lab"
    publishes: str | None = None  # publish the packages of another repo id (same debs)


def _k8s(minor: str) -> Repo:
    path = f"pkgs.k8s.io/core:/stable:/v{minor}/deb"
    return Repo(
        f"pkgs.k8s.io/v{minor}",
        path,
        (f"{path}/Release.key",),
        origin=f"obs://build.opensuse.org/isv:kubernetes:core:stable:v{minor}/deb",
        label=f"isv:kubernetes:core:stable:v{minor}",
    )


_CUDA = "developer.download.nvidia.com/compute/cuda/repos"
REPOS: dict[str, Repo] = {
    r.id: r
    for r in (
        _k8s("1.36"),
        _k8s("1.35"),
        Repo(
            "cuda/debian12",
            f"{_CUDA}/debian12/x86_64",
            (f"{_CUDA}/debian12/x86_64/3bf863cc.pub",),
            origin="NVIDIA",
            label="NVIDIA CUDA",
        ),
        Repo(
            "cuda/ubuntu2204",
            f"{_CUDA}/ubuntu2204/x86_64",
            (f"{_CUDA}/ubuntu2204/x86_64/3bf863cc.pub",),
            origin="NVIDIA",
            label="NVIDIA CUDA",
            publishes="cuda/debian12",
        ),
        Repo(
            "cuda/ubuntu2404",
            f"{_CUDA}/ubuntu2404/x86_64",
            (f"{_CUDA}/ubuntu2404/x86_64/3bf863cc.pub",),
            origin="NVIDIA",
            label="NVIDIA CUDA",
            publishes="cuda/debian12",
        ),
        Repo(
            "libnvidia-container",
            "nvidia.github.io/libnvidia-container/stable/deb/amd64",
            ("nvidia.github.io/libnvidia-container/gpgkey",),
            origin="https://nvidia.github.io/libnvidia-container/stable/deb/amd64",
            label="https://nvidia.github.io/libnvidia-container/stable/deb/amd64",
        ),
        Repo(
            "docker/debian/bookworm",
            "download.docker.com/linux/debian",
            ("download.docker.com/linux/debian/gpg",),
            suite="bookworm",
            component="stable",
            origin="Docker",
            label="Docker CE",
        ),
        Repo("lab-kernel", "lab-kernel", ("lab-kernel/lab-key.asc",)),
        # updates published "later": no node's sources name it until a test adds it (a
        # newer kernel, a newer driver set, an unrelated update; see CONTRACT.md)
        Repo("lab-updates", "lab-updates", ("lab-updates/lab-key.asc",),
             origin="gpuk8s-lab-updates", label="gpuk8s-lab-updates"),
    )
}


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


# ---------------------------------------------------------------- upstream Debian packages
def _apt_opts(tmp: Path, sources: str) -> list[str]:
    (tmp / "sources.list").write_text(sources)
    for d in ("lists/partial", "archives/partial"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    return [
        "-q",
        "-o",
        f"Dir::Etc::sourcelist={tmp}/sources.list",
        "-o",
        "Dir::Etc::sourceparts=-",
        "-o",
        f"Dir::State::Lists={tmp}/lists",
        "-o",
        f"Dir::Cache::archives={tmp}/archives",
        "-o",
        "Dir::Cache::pkgcache=",
        "-o",
        "Dir::Cache::srcpkgcache=",
        "-o",
        "APT::Sandbox::User=root",
        "-o",
        "Debug::NoLocking=1",
    ]


def fetch_upstream_deb(package: str, suite: str) -> Path:
    """Download Debian's real `package` from `suite` (unstable|bookworm) once; cached for good.

    The cached .deb is reused until the cache is wiped, so builds stay reproducible even when sid
    moves on. The version that was downloaded is recorded in <cache>/downloads/<suite>/VERSIONS.
    """
    dest = cache_dir() / "downloads" / suite
    found = sorted(dest.glob(f"{package}_*_*.deb"))
    if found:
        return found[-1]
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lab-apt-") as t:
        tmp = Path(t)
        opts = _apt_opts(tmp, SID_LIST if suite in ("unstable", "sid") else BOOKWORM_LIST)
        _run(["apt-get", *opts, "update"])
        target = f"{package}/{'unstable' if suite == 'sid' else suite}"
        _run(["apt-get", *opts, "download", target], cwd=tmp)
        got = sorted(tmp.glob(f"{package}_*.deb"))
        if not got:
            raise RuntimeError(f"apt-get download {target} produced no .deb")
        final = dest / got[0].name
        shutil.move(str(got[0]), final)
    with open(dest / "VERSIONS", "a") as fh:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        fh.write(f"{package} {debs.deb_field(final, 'Version')} {stamp}\n")
    return final


# ---------------------------------------------------------------- key
def _gnupghome() -> Path:
    home = repos_dir() / "gnupg"
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)
    return home


def _gpg(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return _run(
        ["gpg", "--homedir", str(_gnupghome()), "--batch", "--yes", "--no-tty", *args], **kw
    )


#: the lab's signing key, committed (LAB ONLY: it signs nothing but the lab's own repos) so
#: that its fingerprint is known in advance: the lab inventory pins it like a mirror's key
LAB_KEY_FILE = Path(__file__).resolve().with_name("keys") / "lab-repo-signing-key.asc"


def ensure_key() -> str:
    """Import the lab signing key once; export lab-key.asc/.gpg; return its fingerprint."""
    out = (
        _gpg("--with-colons", "--list-secret-keys").stdout
        if (_gnupghome() / "pubring.kbx").exists()
        else ""
    )
    fprs = [line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:")]
    if fprs[:1] != [LAB_KEY_FINGERPRINT]:
        # a key generated by an older lab, or none: start over with the committed one
        shutil.rmtree(_gnupghome(), ignore_errors=True)
        for stale in ("lab-key.asc", "lab-key.gpg"):
            (repos_dir() / stale).unlink(missing_ok=True)
        _gpg("--pinentry-mode", "loopback", "--passphrase", "", "--import", str(LAB_KEY_FILE))
        out = _gpg("--with-colons", "--list-secret-keys").stdout
        fprs = [line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:")]
        if fprs[:1] != [LAB_KEY_FINGERPRINT]:
            raise RuntimeError(f"{LAB_KEY_FILE} holds {fprs}, not {LAB_KEY_FINGERPRINT}")
    fpr = fprs[0]
    asc, gpgbin = repos_dir() / "lab-key.asc", repos_dir() / "lab-key.gpg"
    if not asc.exists() or not gpgbin.exists():
        asc.write_text(_gpg("--armor", "--export", fpr).stdout)
        res = subprocess.run(
            ["gpg", "--homedir", str(_gnupghome()), "--batch", "--export", fpr],
            capture_output=True,
            check=True,
        )
        gpgbin.write_bytes(res.stdout)
    return fpr


# ---------------------------------------------------------------- indexes
def _ftparchive_release(directory: Path, repo: Repo, suite: str | None) -> str:
    opts = [
        "-o",
        f"APT::FTPArchive::Release::Origin={repo.origin}",
        "-o",
        f"APT::FTPArchive::Release::Label={repo.label}",
        "-o",
        "APT::FTPArchive::Release::Architectures=amd64",
    ]
    if suite:
        opts += [
            "-o",
            f"APT::FTPArchive::Release::Suite={suite}",
            "-o",
            f"APT::FTPArchive::Release::Codename={suite}",
            "-o",
            f"APT::FTPArchive::Release::Components={repo.component}",
        ]
    return _run(["apt-ftparchive", *opts, "release", "."], cwd=directory).stdout


def _sign(directory: Path, fpr: str) -> None:
    rel = directory / "Release"
    common = [
        "--local-user",
        fpr,
        "--digest-algo",
        "SHA512",
        "--pinentry-mode",
        "loopback",
        "--passphrase",
        "",
    ]
    _gpg(*common, "--clearsign", "-o", str(directory / "InRelease"), str(rel))
    _gpg(*common, "--armor", "--detach-sign", "-o", str(directory / "Release.gpg"), str(rel))


def _write_packages(index_dir: Path, scan_root: Path, scan_path: str) -> None:
    packages = _run(["apt-ftparchive", "packages", scan_path], cwd=scan_root).stdout
    index_dir.mkdir(parents=True, exist_ok=True)
    (index_dir / "Packages").write_text(packages)
    (index_dir / "Packages.gz").write_bytes(debs.gzip_bytes(packages.encode()))


def _publish(repo: Repo, debfiles: list[Path], fpr: str, key_asc: str) -> None:
    root = www_root() / repo.path
    stamp_data = json.dumps([LAYOUT_VERSION, fpr, repo.id, sorted(str(p) for p in debfiles)])
    stamp = hashlib.sha256(stamp_data.encode()).hexdigest()
    if (root / ".lab-stamp").is_file() and (root / ".lab-stamp").read_text() == stamp:
        return
    tmp = root.with_name(root.name + ".new")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    if repo.suite is None:
        pool = tmp
        for p in debfiles:
            os.link(p, pool / p.name) if _same_fs(p, pool) else shutil.copy2(p, pool / p.name)
        _write_packages(tmp, tmp, ".")
        (tmp / "Release").write_text(_ftparchive_release(tmp, repo, None))
        _sign(tmp, fpr)
    else:
        dist = tmp / "dists" / repo.suite
        pool = dist / "pool" / repo.component / "amd64"
        pool.mkdir(parents=True)
        for p in debfiles:
            os.link(p, pool / p.name) if _same_fs(p, pool) else shutil.copy2(p, pool / p.name)
        _write_packages(
            dist / repo.component / "binary-amd64", tmp, f"dists/{repo.suite}/pool/{repo.component}"
        )
        (dist / "Release").write_text(_ftparchive_release(dist, repo, repo.suite))
        _sign(dist, fpr)
    (tmp / ".lab-stamp").write_text(stamp)
    # keys live in the same tree so a rebuild keeps them
    old = root.with_name(root.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if root.exists():
        root.rename(old)
    tmp.rename(root)
    if old.exists():
        shutil.rmtree(old)
    for key in repo.keys:
        kp = www_root() / key
        kp.parent.mkdir(parents=True, exist_ok=True)
        kp.write_text(key_asc)


def _same_fs(a: Path, b: Path) -> bool:
    return a.stat().st_dev == b.stat().st_dev


@functools.cache
def _resolver() -> debs.FetchResolver:
    return debs.FetchResolver(fetch_upstream_deb, cache_dir() / "downloads" / "extracted")


def _real_tool(pkg: str, tool: str) -> Path:
    """/usr/bin/<tool> of Debian sid's package ``pkg``, downloaded and extracted once into the
    cache."""
    deb = fetch_upstream_deb(pkg, "unstable")
    root = cache_dir() / "downloads" / "extracted"
    resolver = debs.FetchResolver(lambda _pkg, _suite: deb, root)
    fake = debs.PackageDef(Path(f"real-{pkg}"), {"fetch": {tool: {"package": pkg,
                                                                   "suite": "unstable"}}})
    return resolver.tree(fake, tool) / "usr" / "bin" / tool


def real_kubectl() -> Path:
    """The REAL kubectl (Debian sid's `kubectl` package, built from the Kubernetes sources):
    the client the lab tests drive the API server stand-in with on the lab host (nodes get the
    same binary through the lab's kubectl package)."""
    return _real_tool("kubectl", "kubectl")


def real_etcd(tool: str = "etcd") -> Path:
    """The REAL etcd or etcdctl (Debian sid's etcd-server and etcd-client 3.5): the store of
    the in-host API server tests (nodes get the same binaries through the lab's kubelet
    package)."""
    return _real_tool({"etcd": "etcd-server", "etcdctl": "etcd-client"}[tool], tool)


def build_all(force: bool = False) -> Path:
    """Build every package (cached by content hash), publish and sign every repo.

    Return the www root."""
    t0 = time.monotonic()
    rdir = repos_dir()
    rdir.mkdir(parents=True, exist_ok=True)
    if force:
        for d in ("debs", "www"):
            shutil.rmtree(rdir / d, ignore_errors=True)
    fpr = ensure_key()
    key_asc = (rdir / "lab-key.asc").read_text()
    defs = debs.load_definitions()
    unknown = sorted({d.repo for d in defs} - set(REPOS))
    if unknown:
        raise debs.PackageError(f"unknown repo ids {unknown}; known: {sorted(REPOS)}")
    built = debs.build_all_debs(defs, rdir / "debs", _resolver())
    by_repo: dict[str, list[Path]] = {r: [] for r in REPOS}
    for spec, path in built:
        by_repo[spec.repo].append(path)
    www = www_root()
    www.mkdir(parents=True, exist_ok=True)
    for repo in REPOS.values():
        _publish(repo, by_repo[repo.publishes or repo.id], fpr, key_asc)
    (www / "lab-key.asc").write_text(key_asc)
    shutil.copyfile(rdir / "lab-key.gpg", www / "lab-key.gpg")
    manifest = {
        "fingerprint": fpr,
        "packages": [
            {"repo": s.repo, "name": s.name, "version": s.version, "file": str(p.relative_to(rdir))}
            for s, p in sorted(built, key=lambda sp: (sp[0].repo, sp[0].name, sp[0].version))
        ],
    }
    (rdir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    _log(f"lab repos ready in {www} ({len(built)} packages, {time.monotonic() - t0:.1f}s)")
    return www


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- settings
def mirror_settings(base_url: str = f"http://{DEFAULT_LISTEN}",
                    registry_url: str | None = None) -> dict[str, Any]:
    """Inventory variables that point gpuk8s at the lab repos served at base_url (and, with
    ``registry_url``, every image registry at the lab registry served there)."""
    b = base_url.rstrip("/")
    k8s = f"{b}/pkgs.k8s.io/core:/stable:/v{{{{ kubernetes_version }}}}/deb"
    nct = f"{b}/nvidia.github.io/libnvidia-container"
    return {
        "kubernetes_repo_url": f"{k8s}/",
        "kubernetes_repo_key_url": f"{k8s}/Release.key",
        "nvidia_cuda_repo_url": f"{b}/{_CUDA}/{{{{ nvidia_cuda_distro }}}}/x86_64/",
        "nvidia_cuda_repo_key_url": f"{b}/{_CUDA}/{{{{ nvidia_cuda_distro }}}}/x86_64/3bf863cc.pub",
        "nvidia_container_toolkit_repo_url": f"{nct}/stable/deb/amd64/",
        "nvidia_container_toolkit_repo_key_url": f"{nct}/gpgkey",
        "docker_repo_url": f"{b}/download.docker.com/linux/debian",
        "docker_repo_key_url": f"{b}/download.docker.com/linux/debian/gpg",
        **key_pins(),
        **({"registry_mirrors": registry_mirrors(registry_url)} if registry_url else {}),
    }


# ---------------------------------------------------------------- HTTP
class _Handler(http.server.SimpleHTTPRequestHandler):
    disable_nagle_algorithm = True  # no 40 ms delayed-ACK stall between headers and body

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write(f"{self.address_string()} {format % args}\n")

    def do_GET(self) -> None:
        # the upstream .list NVIDIA tells users to curl, pointing at this server
        if self.path.rstrip("/").endswith(
            "libnvidia-container/stable/deb/nvidia-container-toolkit.list"
        ):
            host = self.headers.get("Host", DEFAULT_LISTEN)
            base = f"http://{host}/nvidia.github.io/libnvidia-container"
            body = (
                f"deb {base}/stable/deb/$(ARCH) /\n#deb {base}/experimental/deb/$(ARCH) /\n"
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()


def _split(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host or "0.0.0.0", int(port)


def _serve_forever(listen: str, root: Path) -> None:
    handler = functools.partial(_Handler, directory=str(root))
    http.server.ThreadingHTTPServer.allow_reuse_address = True
    srv = http.server.ThreadingHTTPServer(_split(listen), handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()


def _pidfile() -> Path:
    return services_dir() / "repos-http.json"


def _running() -> dict[str, object] | None:
    try:
        info = json.loads(_pidfile().read_text())
    except (OSError, ValueError):
        return None
    pid = int(info["pid"])
    return info if net.pid_alive(pid) and net.runs(pid, "tests.lab.repos") else None


def _probe(listen: str, timeout: float = 1.0) -> bool:
    host, port = _split(listen)
    host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/lab-key.asc", timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def serve(listen: str = DEFAULT_LISTEN, background: bool = True) -> int | None:
    """Serve the www root on listen. background: a daemon process with a pid file in the
    services dir (returns its pid once it answers); else serve in this process until
    interrupted."""
    root = www_root()
    if not background:
        _serve_forever(listen, root)
        return None
    services_dir().mkdir(parents=True, exist_ok=True)
    with open(services_dir() / "repos-http.log", "ab") as log:  # the child keeps its own copy
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.lab.repos", "--serve-only", "--listen", listen],
            cwd=str(debs.REPO_ROOT),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            env=dict(os.environ),
        )
    _pidfile().write_text(json.dumps({"pid": proc.pid, "listen": listen, "root": str(root)}))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (services_dir() / "repos-http.log").read_text(errors="replace")[-800:]
            raise RuntimeError(f"lab repo server on {listen} exited ({proc.returncode}):\n{tail}")
        if _probe(listen, 0.5):
            return proc.pid
        time.sleep(0.1)
    raise RuntimeError(f"lab repo server on {listen} did not answer within 10s")


def ensure_served(listen: str = DEFAULT_LISTEN) -> int:
    """Build if needed and make sure a server for listen runs; return its pid."""
    info = _running()
    # patient with a live server: a busy host can be slow to answer, and a wrong "no" would
    # restart the server under the other lab instance's apt
    if info and info.get("listen") == listen and any(_probe(listen, 3.0) for _ in range(3)):
        return int(info["pid"])  # type: ignore[call-overload]
    if info:
        stop_serving()
    build_all()
    pid = serve(listen, background=True)
    assert pid is not None
    return pid


def stop_serving() -> bool:
    """Stop the background server of the pid file, if any. True if one was stopped."""
    info = _running()
    _pidfile().unlink(missing_ok=True)
    if not info:
        return False
    pid = int(info["pid"])  # type: ignore[call-overload]
    os.kill(pid, signal.SIGTERM)
    for _ in range(50):
        if not net.pid_alive(pid):
            break
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
    return True


def repos_task(listen: str = DEFAULT_LISTEN, force: bool = False) -> None:
    """Body of `invoke lab.repos --listen ADDR:PORT` (wire with @task in tests/lab/tasks.py):
    the package repos on ADDR:PORT and the lab registry on ADDR:PORT+1, with the inventory
    settings that use both."""
    from tests.lab import registry

    build_all(force=force)
    host, _, port = listen.rpartition(":")
    registry_addr = f"{host}:{int(port) + 1}"
    registry.start(registry_addr)
    print(
        yaml.safe_dump(mirror_settings(f"http://{listen}", f"http://{registry_addr}"),
                       sort_keys=False, width=1000),
        end="",
        flush=True,
    )
    _log(f"serving {www_root()} on http://{listen}/ and the lab registry on "
         f"http://{registry_addr}/ (Ctrl-C stops)")
    try:
        serve(listen, background=False)
    finally:
        if registry_addr != f"{registry.HOST_IP}:{registry.PORT}":
            registry.stop(registry_addr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.lab.repos",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--listen", default=DEFAULT_LISTEN, help="ADDR:PORT (default %(default)s)")
    ap.add_argument("--force", action="store_true", help="rebuild every package and repo")
    ap.add_argument(
        "--build-only", action="store_true", help="build and print the settings, do not serve"
    )
    ap.add_argument("--serve-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_only:
        serve(args.listen, background=False)
        return 0
    if args.build_only:
        build_all(force=args.force)
        print(
            yaml.safe_dump(mirror_settings(f"http://{args.listen}"), sort_keys=False, width=1000),
            end="",
        )
        return 0
    with contextlib.suppress(KeyboardInterrupt):
        repos_task(args.listen, args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
