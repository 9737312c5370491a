"""serve-bundle's registry: Debian's docker-registry (the CNCF distribution registry 2.8),
its storage filled from the bundle's OCI layout through its own HTTP API by a writable instance
on loopback, then run read-only (storage.maintenance.readonly, upload purging off) over TLS."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from gpuk8s.lock.aptindex import LockError
from gpuk8s.lock.digests import INDEX_TYPES, Reference

REGISTRY = "/usr/bin/docker-registry"


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
    for attempt in range(3):  # the port may be taken between the check and the bind
        port = _free_port()
        try:
            proc = _registry(state, f"127.0.0.1:{port}", False, None,
                             state / "registry-import.log")
            break
        except LockError:
            if attempt == 2:
                raise
    try:
        return import_images(root / "images", f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
