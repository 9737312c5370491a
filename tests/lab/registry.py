"""The lab's OCI registry: Debian's docker-registry (the CNCF distribution registry 2.8, the
real program) on the lab bridge, HOST_IP:5000, storage in the lab cache (images pushed once
survive lab.down). lab.up starts it, lab.down stops it.

Lab images are pushed under upstream names (``library/busybox``...) through the registry's
own HTTP API, each labelled as a lab image (an OCI annotation and a file inside), so a node
pulling ``docker.io/library/busybox:<tag>`` through gpuk8s's registry_mirrors gets it from here.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import signal
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from .net import answers, pid_alive, port_open, read_pid
from .paths import HOST_IP, REGISTRY_PORT, REGISTRY_URL, LabError, cache_dir, services_dir

PORT = REGISTRY_PORT
URL = REGISTRY_URL
LAB_NOTE = "gpuk8s lab image, not the upstream image"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
LAYER_TAR_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG = """\
version: 0.1
log:
  level: warn
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: {data}
  delete:
    enabled: true
http:
  addr: {addr}
"""


def _paths(addr: str = f"{HOST_IP}:{PORT}") -> dict[str, Path]:
    run = services_dir() / "registry" / ("" if addr == f"{HOST_IP}:{PORT}" else
                                       addr.replace(":", "_"))
    return {"data": cache_dir() / "registry", "conf": run / "config.yml",
            "pidfile": run / "registry.pid", "log": run / "registry.log"}


def running(addr: str = f"{HOST_IP}:{PORT}") -> bool:
    pid = read_pid(_paths(addr)["pidfile"], "docker-registry")
    host, _, port = addr.rpartition(":")
    return pid is not None and answers(host, int(port))


def start(addr: str = f"{HOST_IP}:{PORT}", timeout: float = 20.0) -> None:
    """Start the registry on ``addr`` (the lab's: HOST_IP:5000) unless it already answers."""
    if running(addr):
        return
    p = _paths(addr)
    host, _, port = addr.rpartition(":")
    for d in (p["data"], p["conf"].parent):
        d.mkdir(parents=True, exist_ok=True)
    p["conf"].write_text(CONFIG.format(data=p["data"], addr=addr))
    binary = "/usr/bin/docker-registry"
    if not os.path.exists(binary):
        raise LabError("docker-registry is not installed: run scripts/setup (it installs "
                       "Debian's docker-registry package)")
    with open(p["log"], "ab") as log:
        proc = subprocess.Popen([binary, "serve", str(p["conf"])], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, start_new_session=True)
    p["pidfile"].write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if port_open(host, int(port)):
            return
        time.sleep(0.1)
    raise LabError(f"docker-registry did not listen on {addr}; see {p['log']}")


def stop(addr: str = f"{HOST_IP}:{PORT}") -> None:
    pidfile = _paths(addr)["pidfile"]
    pid = read_pid(pidfile, "docker-registry")
    pidfile.unlink(missing_ok=True)  # it lives in /run now: never a stale pid to kill later
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- pushing lab images
def _request(method: str, url: str, data: bytes | BinaryIO | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def has_blob(name: str, digest: str) -> bool:
    status, _, _ = _request("HEAD", f"{URL}/v2/{name}/blobs/{digest}")
    return status == 200


def _upload(name: str, digest: str, body: bytes | BinaryIO, size: int) -> None:
    """One monolithic upload (POST, then PUT of the whole blob); a file body is streamed."""
    status, headers, text = _request("POST", f"{URL}/v2/{name}/blobs/uploads/")
    if status != 202:
        raise LabError(f"registry refused an upload to {name}: {status} {text[:200]!r}")
    location = headers["Location"]
    sep = "&" if "?" in location else "?"
    status, _, text = _request("PUT", f"{location}{sep}digest={digest}", body,
                               {"Content-Type": "application/octet-stream",
                                "Content-Length": str(size)})
    if status != 201:
        raise LabError(f"registry refused blob {digest} of {name}: {status} {text[:200]!r}")


def _push_blob(name: str, data: bytes) -> str:
    digest = _digest(data)
    if not has_blob(name, digest):
        _upload(name, digest, data, len(data))
    return digest


def push_file(name: str, path: Path, digest: str) -> bool:
    """Upload the blob in ``path`` (``digest`` = its sha256) to ``name`` unless the registry
    has it there; whether it uploaded. The file is streamed, never read into memory."""
    if has_blob(name, digest):
        return False
    with path.open("rb") as body:
        _upload(name, digest, body, path.stat().st_size)
    return True


def layer(files: dict[str, tuple[bytes, int]]) -> bytes:
    """A gzipped tar layer of ``{path: (content, mode)}`` (directories made as needed)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(p).parent) for p in files} - {"."})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path, (content, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(content), mode
            tar.addfile(info, io.BytesIO(content))
    return gzip.compress(raw.getvalue(), mtime=0)


@dataclass(frozen=True)
class Layer:
    """A layer blob already in the registry: its descriptor and its diff_id (the digest of
    the uncompressed tar, which the image config lists)."""

    digest: str
    size: int
    diff_id: str
    media_type: str = LAYER_TAR_GZIP


def push(name: str, tag: str, layers: list[bytes], config: dict[str, Any]) -> str:
    """Push an OCI image (gzipped tar layers, image config) as ``name:tag``; its digest."""
    pushed = [Layer(_push_blob(name, blob), len(blob), _digest(gzip.decompress(blob)))
              for blob in layers]
    return push_manifest(name, tag, pushed, config)


def push_manifest(name: str, tag: str, layers: list[Layer], config: dict[str, Any],
                  description: str = LAB_NOTE) -> str:
    """Push the image config and the manifest of ``layers`` (blobs already in ``name``) as
    ``name:tag``, the manifest annotated with ``description``; the manifest's digest."""
    image_config = {"architecture": "amd64", "os": "linux", "config": config,
                    "rootfs": {"type": "layers", "diff_ids": [x.diff_id for x in layers]}}
    config_blob = json.dumps(image_config, sort_keys=True).encode()
    manifest: dict[str, Any] = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": _push_blob(name, config_blob), "size": len(config_blob)},
        "layers": [{"mediaType": x.media_type, "digest": x.digest, "size": x.size}
                   for x in layers],
        "annotations": {"org.opencontainers.image.description": description}}
    body = json.dumps(manifest, sort_keys=True).encode()
    status, _, text = _request("PUT", f"{URL}/v2/{name}/manifests/{tag}", body,
                               {"Content-Type": manifest["mediaType"]})
    if status != 201:
        raise LabError(f"registry refused manifest {name}:{tag}: {status} {text[:200]!r}")
    return _digest(body)


def push_busybox(tag: str = "gpuk8s-lab") -> str:
    """``library/busybox:<tag>``: Debian's static busybox and a note saying it is a lab image."""
    binary = Path("/bin/busybox")
    if not binary.exists():
        raise LabError("/bin/busybox is missing: run scripts/setup (busybox-static)")
    blob = layer({"bin/busybox": (binary.read_bytes(), 0o755),
                  "etc/gpuk8s-lab-image": (f"{LAB_NOTE}\n".encode(), 0o644)})
    return push("library/busybox", tag, [blob], {
        "Entrypoint": ["/bin/busybox"], "Cmd": ["sh"],
        "Labels": {"org.opencontainers.image.description": LAB_NOTE}})


PLACEHOLDER_NOTE = ("gpuk8s lab placeholder: the lab's stand-ins play this image's program; "
                    "it runs nothing")


def push_placeholder(image: str, platforms: tuple[str, ...] = ("linux/amd64", "linux/arm64")
                     ) -> str:
    """A LAB placeholder for an upstream image the lab's stand-ins play (kube-apiserver, the
    CNI's, the device plugin's...), so that tools that read images (`invoke lock`, a bundle)
    have one to read: an OCI index of one manifest per platform, each a layer holding only a
    note that names the image. Pushed under the name a mirror without a path is asked for
    (the reference without its registry), children first (distribution 2.8.2 refuses an index
    whose manifests are missing: storage/manifestlisthandler.go@v2.8.2). Its digest; nothing
    is pushed when the tag already exists."""
    from gpuk8s.lock.digests import Reference

    ref = Reference.parse(image)
    status, headers, _ = _request("HEAD", f"{URL}/v2/{ref.repository}/manifests/{ref.tag}",
                                  headers={"Accept": "application/vnd.oci.image.index.v1+json"})
    if status == 200:
        return headers.get("Docker-Content-Digest", "")
    children = []
    for platform in platforms:
        os_, arch = platform.split("/")
        note = f"{PLACEHOLDER_NOTE}\nimage: {image}\nplatform: {platform}\n".encode()
        blob = layer({"etc/gpuk8s-lab-image": (note, 0o644)})
        pushed = Layer(_push_blob(ref.repository, blob), len(blob),
                       _digest(gzip.decompress(blob)))
        config = {"architecture": arch, "os": os_, "config": {"Labels": {
            "org.opencontainers.image.description": PLACEHOLDER_NOTE}},
            "rootfs": {"type": "layers", "diff_ids": [pushed.diff_id]}}
        config_blob = json.dumps(config, sort_keys=True).encode()
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": _push_blob(ref.repository, config_blob),
                       "size": len(config_blob)},
            "layers": [{"mediaType": pushed.media_type, "digest": pushed.digest,
                        "size": pushed.size}],
            "annotations": {"org.opencontainers.image.description": PLACEHOLDER_NOTE}},
            sort_keys=True).encode()
        digest = _digest(manifest)
        status, _, text = _request("PUT", f"{URL}/v2/{ref.repository}/manifests/{digest}",
                                   manifest, {"Content-Type":
                                              "application/vnd.oci.image.manifest.v1+json"})
        if status != 201:
            raise LabError(f"registry refused {image} ({platform}): {status} {text[:200]!r}")
        children.append({"mediaType": "application/vnd.oci.image.manifest.v1+json",
                         "digest": digest, "size": len(manifest),
                         "platform": {"os": os_, "architecture": arch}})
    index = json.dumps({"schemaVersion": 2,
                        "mediaType": "application/vnd.oci.image.index.v1+json",
                        "manifests": children,
                        "annotations": {"org.opencontainers.image.description":
                                        PLACEHOLDER_NOTE}}, sort_keys=True).encode()
    status, _, text = _request("PUT", f"{URL}/v2/{ref.repository}/manifests/{ref.tag}", index,
                               {"Content-Type": "application/vnd.oci.image.index.v1+json"})
    if status != 201:
        raise LabError(f"registry refused the index of {image}: {status} {text[:200]!r}")
    return _digest(index)
