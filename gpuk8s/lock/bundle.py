"""`invoke bundle --cluster`: everything an inventory's lock names, downloaded and checked, in
one folder (then one tarball) to carry across an air gap:

    cluster/gpuk8s.lock            the lock, as it was
    cluster/debs/<file>.deb        every .deb of every OS release (gpuk8s's sources and the OS
                                   archive), each checked against the lock's SHA256 and size
    cluster/images/                one OCI image layout (image-spec v1.1.0 image-layout.md):
                                   oci-layout, index.json (one entry per image, named by
                                   org.opencontainers.image.ref.name), blobs/sha256/<hex>
    cluster/bundle.json            what is in it, per OS release and image
    cluster/SHA256SUMS             every file above, for `sha256sum -c` and serve-bundle

A .deb of gpuk8s's sources is taken only if the source's signed index, read again now and
checked with gpgv against the key the lock pins, lists that version with that SHA256: an edited
lock cannot smuggle in a file. The OS archive's .debs are checked against the SHA256 the nodes'
apt read from their signed indexes when the lock was made. Every image blob is checked against
its digest, every manifest of an index fetched (the registry serve-bundle runs wants them all:
distribution's storage/manifestlisthandler.go@v2.8.2).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import ssl
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, TextIO

import yaml

from gpuk8s.images import registry_of
from gpuk8s.inventory import load_inventory
from gpuk8s.lock.aptindex import LockError, Source, read_index
from gpuk8s.lock.digests import (
    INDEX_TYPES,
    Get,
    Reference,
    _token,
    fetch_manifest,
    manifest_url,
    opener,
    ssl_context,
)
from gpuk8s.lockfile import lock_path
from gpuk8s.ops.registry import Mirror, mirrors
from gpuk8s.session import role_vars

CHUNK = 1 << 20
SUMS = "SHA256SUMS"


def _stream(resp: IO[bytes], dest: Path, sha256: str, size: int | None, what: str) -> None:
    """Write a response to ``dest`` (through a temporary file) only if it has that SHA256."""
    h = hashlib.sha256()
    got = 0
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as fh:
            while chunk := resp.read(CHUNK):
                h.update(chunk)
                got += len(chunk)
                fh.write(chunk)
        if h.hexdigest() != sha256 or (size is not None and got != size):
            raise LockError(f"{what}: downloaded SHA256 {h.hexdigest()} ({got} bytes) is not the "
                            f"lock's {sha256} ({size} bytes); the source changed since the lock "
                            "was made, or the transfer was tampered with")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _urlopen(url: str, headers: Mapping[str, str] | None = None, *, proxy: str = "",
             context: ssl.SSLContext | None = None) -> IO[bytes]:
    handlers: list[urllib.request.BaseHandler] = []
    if proxy:
        handlers.append(urllib.request.ProxyHandler({"http": proxy}))
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    req = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        resp: IO[bytes] = urllib.request.build_opener(*handlers).open(req, timeout=120)
        return resp
    except urllib.error.HTTPError as exc:
        raise LockError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise LockError(f"{url}: {getattr(exc, 'reason', exc)}") from None


def deb_url(source: Mapping[str, str], filename: str) -> str:
    """Where a source serves a Packages record's Filename: relative to the source URL for a
    flat repository, to the archive root (the same URL here) for a dists/ one."""
    base = source["url"] if source["url"].endswith("/") else source["url"] + "/"
    return base + filename.removeprefix("./")


#: a .deb file name the bundle takes (from a URL's last part or a lock's Filename): no
#: folders, no control characters, nothing SHA256SUMS or a shell could misread
DEB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+~%_:-]*\.deb")


def deb_name(url: str) -> str:
    """The file name a .deb gets in the bundle, from its URL; LockError for anything else."""
    name = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
    if not DEB_NAME.fullmatch(name):
        raise LockError(f"{url}: {name!r} is not a .deb file name the bundle takes")
    return name


def _signed(sources: Mapping[str, Mapping[str, str]], arch: str,
            fetch: Callable[[str], bytes] | None) -> set[tuple[str, str, str]]:
    """(package, version, SHA256) of every record of every source's signed index, read now."""
    listed: set[tuple[str, str, str]] = set()
    for name, src in sorted(sources.items()):
        source = Source(name, src["url"], src["suite"], src["components"], src["key_url"],
                        src["key_fingerprint"])
        index = read_index(source, arch, fetch) if fetch else read_index(source, arch)
        listed |= {(p["Package"], p["Version"], p.get("SHA256", "")) for p in index.packages}
    return listed


def bundle_debs(lock: Mapping[str, Any], dest: Path, *, proxy: str = "",
                direct: Sequence[str] = (),
                fetch: Callable[[str], bytes] | None = None, out: TextIO | None = None
                ) -> dict[str, Any]:
    """Download every .deb of the lock into ``dest`` (checked); per release what it holds."""
    apt = lock["apt"]
    dest.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {}
    taken: dict[str, str] = {}
    for release, body in sorted(apt["releases"].items()):
        sources = body.get("sources")
        if not isinstance(sources, Mapping):
            raise LockError("the lock has no apt sources per OS release (an older `invoke "
                            "lock`): run `invoke lock` again")
        listed = _signed(sources, release.rsplit("-", 1)[1], fetch)
        files: dict[str, str] = {}
        # (name, version, url, size, sha256, may go through the proxy?): gpuk8s's sources as
        # `invoke lock` read them (directly); the OS archive directly too, or through apt_proxy
        # (as the nodes may fetch it) when this machine cannot reach it directly
        wanted: list[tuple[str, str, str, int, str, bool]] = []
        for name, pkg in sorted(body["packages"].items()):
            if (name, pkg["version"], pkg["sha256"]) not in listed:
                raise LockError(f"the lock pins {name} {pkg['version']} with SHA256 "
                                f"{pkg['sha256']}, which apt source {pkg['source']}'s signed "
                                "index does not list (now): the lock was edited or the "
                                "repository changed; run `invoke lock` again")
            url = deb_url(sources[pkg["source"]], pkg["filename"])
            wanted.append((name, pkg["version"], url, int(pkg["size"]), pkg["sha256"], False))
        os_archive = body.get("os_archive") or {}
        if not isinstance(os_archive, Mapping):
            raise LockError("the lock's os_archive is a list of names (an older `invoke lock`): "
                            "run `invoke lock` again")
        for name, pkg in sorted(os_archive.items()):
            wanted.append((name, pkg["version"], pkg["url"], int(pkg["size"]), pkg["sha256"],
                           urllib.parse.urlsplit(pkg["url"]).hostname not in direct))
        for name, version, url, size, sha, proxied in wanted:
            if not url.startswith(("http://", "https://")):
                raise LockError(f"{name} {version}: {url} is not an http or https URL")
            target = dest / deb_name(url)
            if target.name in taken and taken[target.name] != sha:
                raise LockError(f"{url}: another .deb of the same name ({target.name}) with "
                                f"another SHA256 is in the bundle already; two sources serve "
                                "different files under one name")
            taken[target.name] = sha
            if target.exists() and _sha256(target) == sha:
                files[name] = target.name
                continue
            ways = [""] + ([proxy] if proxied and proxy and url.startswith("http://") else [])
            for i, via in enumerate(ways):
                try:
                    with _urlopen(url, proxy=via) as resp:
                        _stream(resp, target, sha, size, f"{name} {version} ({url})")
                    break
                except LockError as exc:
                    if i == len(ways) - 1 or "SHA256" in str(exc):
                        raise
            files[name] = target.name
        summary[release] = files
        if out:
            out.write(f"bundle: {release}: {len(files)} .deb files\n")
    return summary


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _blob(ref: Reference, mirror: Mirror | None, digest: str, blobs: Path, get: Get,
          context: ssl.SSLContext | None) -> None:
    """One blob into the layout, streamed and checked (an anonymous token when asked)."""
    target = blobs / digest.split(":", 1)[1]
    if target.exists() and "sha256:" + _sha256(target) == digest:
        return
    url = manifest_url(ref, mirror, digest).replace("/manifests/", "/blobs/")
    handlers: list[urllib.request.BaseHandler] = []
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    fetcher = urllib.request.build_opener(*handlers)
    headers: dict[str, str] = {}
    for attempt in (1, 2):
        req = urllib.request.Request(url)
        for key, value in headers.items():  # never sent on to a redirect's storage host
            req.add_unredirected_header(key, value)
        try:
            with fetcher.open(req, timeout=120) as body:
                _stream(body, target, digest.split(":", 1)[1], None,
                        f"{ref.repository}@{digest}")
                return
        except urllib.error.HTTPError as exc:
            challenge = exc.headers.get("WWW-Authenticate", "") if exc.headers else ""
            if exc.code == 401 and attempt == 1 and challenge.lower().startswith("bearer "):
                headers["Authorization"] = f"Bearer {_token(challenge[7:], get, ref)}"
                continue
            raise LockError(f"{url}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise LockError(f"{url}: {getattr(exc, 'reason', exc)}") from None


def _children(media: str, body: bytes) -> Iterator[tuple[str, str]]:
    doc = json.loads(body)
    if media in INDEX_TYPES or "manifests" in doc:
        for desc in doc.get("manifests", []):
            yield "manifest", str(desc["digest"])
    else:
        yield "blob", str(doc["config"]["digest"])
        for layer in doc.get("layers", []):
            yield "blob", str(layer["digest"])


def bundle_images(lock: Mapping[str, Any], registry_mirrors: Mapping[str, Any], dest: Path,
                  *, out: TextIO | None = None) -> dict[str, Any]:
    """Every image of the lock, by its locked digest, into one OCI image layout at ``dest``."""
    blobs = dest / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    wanted = mirrors(registry_mirrors)
    entries = []
    summary: dict[str, Any] = {}
    for image, entry in sorted(lock["images"].items()):
        ref = Reference.parse(image)
        via = wanted.get(registry_of(image)) or wanted.get("_default") or []
        mirror = via[0] if via else None
        get = opener(mirror)
        context = ssl_context(mirror)
        top_media, top = fetch_manifest(ref, mirror, entry["digest"], get)
        (blobs / entry["digest"].split(":", 1)[1]).write_bytes(top)
        todo = [(top_media, top)]
        count = 0
        while todo:
            media, body = todo.pop()
            for kind, digest in _children(media, body):
                if kind == "manifest":
                    child_media, child = fetch_manifest(ref, mirror, digest, get)
                    (blobs / digest.split(":", 1)[1]).write_bytes(child)
                    todo.append((child_media, child))
                else:
                    _blob(ref, mirror, digest, blobs, get, context)
                    count += 1
        entries.append({"mediaType": top_media, "digest": entry["digest"], "size": len(top),
                        "annotations": {"org.opencontainers.image.ref.name": image}})
        summary[image] = entry["digest"]
        if out:
            out.write(f"bundle: {image}@{entry['digest'][:19]}… ({count} blobs)\n")
    (dest / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}\n')
    (dest / "index.json").write_text(json.dumps(
        {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
         "manifests": entries}, indent=1, sort_keys=True) + "\n")
    return summary


def write_sums(root: Path) -> Path:
    """SHA256SUMS of every file under ``root`` (sorted, as `sha256sum -c` reads it)."""
    lines = [f"{_sha256(p)}  {p.relative_to(root).as_posix()}\n"
             for p in sorted(root.rglob("*")) if p.is_file() and p.name != SUMS]
    (root / SUMS).write_text("".join(lines))
    return root / SUMS


def check_sums(root: Path) -> int:
    """Every file SHA256SUMS lists has its SHA256, and no other file is there; the count, or
    a LockError naming the first file that differs (with both checksums)."""
    sums = root / SUMS
    if not sums.is_file():
        raise LockError(f"{root}: no {SUMS}: not a cluster bundle (make one with `invoke "
                        "bundle --cluster`)")
    listed: dict[str, str] = {}
    for line in sums.read_text().splitlines():
        digest, _, rel = line.partition("  ")
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise LockError(f"{sums}: {rel!r} is not a path inside the bundle")
        listed[rel] = digest
    for rel, digest in sorted(listed.items()):
        path = root / rel
        if not path.is_file():
            raise LockError(f"{path}: listed in {SUMS} but missing")
        got = _sha256(path)
        if got != digest:
            raise LockError(f"{path}: SHA256 {got} is not the {digest} {SUMS} lists: the "
                            "bundle was changed after it was made; refusing it")
    extra = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                   if p.is_file() and p.name != SUMS
                   and p.relative_to(root).as_posix() not in listed)
    if extra:
        raise LockError(f"{root}: {extra[0]} is not listed in {SUMS}; refusing the bundle")
    return len(listed)


def cluster_bundle(inventory: str | Path, dest: Path, *, out: TextIO | None = None,
                   fetch: Callable[[str], bytes] | None = None) -> dict[str, Any]:
    """The cluster part of a bundle, in ``dest``/cluster: see the module's text."""
    path = lock_path(inventory)
    if not path.is_file():
        raise LockError(f"{path}: no lock beside the inventory; make it first with `invoke "
                        f"lock -i {inventory}` (on a machine that reaches the repositories)")
    text = path.read_text()
    lock = yaml.safe_load(text)
    inv = load_inventory(inventory)
    vars = role_vars(inv.control_planes[0]) if inv.control_planes else {}
    root = dest / "cluster"
    root.mkdir(parents=True, exist_ok=True)
    (root / "gpuk8s.lock").write_text(text)
    debs = bundle_debs(lock, root / "debs", proxy=str(vars.get("apt_proxy") or ""),
                       direct=list(vars.get("apt_proxy_direct") or ()), fetch=fetch, out=out)
    images = bundle_images(lock, vars.get("registry_mirrors") or {}, root / "images", out=out)
    manifest = {"lock_sha256": hashlib.sha256(text.encode()).hexdigest(), "releases": debs,
                "images": images}
    (root / "bundle.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    write_sums(root)
    return manifest


__all__ = ["bundle", "bundle_debs", "bundle_images", "check_sums", "cluster_bundle"]


def bundle(inventory: str | Path = "", *, cluster: bool = False, out: TextIO | None = None,
           **kwargs: Any) -> dict[str, Any]:
    """`invoke bundle [--cluster]`: the wheels bundle (gpuk8s.bundle), with ``cluster`` also
    everything the inventory's lock names (cluster_bundle), checked, in cluster/."""
    from gpuk8s import bundle as wheels

    if not cluster:
        return wheels.bundle(out=out, **kwargs)
    if not lock_path(inventory).is_file():  # before the wheels: fail fast, with the fix
        raise LockError(f"{lock_path(inventory)}: no lock beside the inventory; make it first "
                        f"with `invoke lock -i {inventory}` (on a machine that reaches the "
                        "repositories)")
    out = out or sys.stdout

    def add(dest: Path) -> list[str]:
        made = cluster_bundle(inventory, dest, out=out)
        debs = sorted({f for files in made["releases"].values() for f in files.values()})
        size = sum(p.stat().st_size for p in (dest / "cluster").rglob("*") if p.is_file())
        return [f"  cluster/: {len(debs)} .deb files for {', '.join(made['releases'])}, "
                f"{len(made['images'])} images (OCI layout), {size / 2**20:.1f} MiB, from "
                f"{lock_path(inventory).name}; serve it with `invoke serve-bundle`"]

    return wheels.bundle(out=out, extra=add, **kwargs)
