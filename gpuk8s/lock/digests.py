"""Image digests from a registry's HTTP API (the OCI distribution spec): the digest an image's
tag resolves to, and for an index (multi-platform image) the manifest digest of each platform.

The digest is computed here over the bytes the registry sent, never taken from its
Docker-Content-Digest header alone: a lock's digest must be the content's own (image-spec
v1.1.0 descriptor.md, "Digests")."""

from __future__ import annotations

import hashlib
import json
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuk8s.images import registry_of
from gpuk8s.lock.aptindex import LockError
from gpuk8s.ops.registry import UPSTREAM, Mirror

INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
ACCEPT = ", ".join(INDEX_TYPES + MANIFEST_TYPES)


@dataclass(frozen=True)
class Reference:
    registry: str
    repository: str
    tag: str
    digest: str = ""

    @classmethod
    def parse(cls, image: str) -> Reference:
        registry = registry_of(image)
        rest = image[len(registry) + 1:] if image.startswith(registry + "/") else image
        rest, _, digest = rest.partition("@")
        name, _, tag = rest.rpartition(":") if ":" in rest.rpartition("/")[2] else (rest, "", "")
        if registry == "docker.io" and "/" not in name:
            name = f"library/{name}"
        if not re.fullmatch(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
                            r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*", name):
            raise LockError(f"{image}: {name!r} is not a repository name a registry takes")
        return cls(registry, name, tag or ("" if digest else "latest"), digest)


@dataclass(frozen=True)
class Resolved:
    digest: str
    media_type: str
    #: "os/arch[/variant]" -> manifest digest (an index's); empty for a single manifest
    platforms: Mapping[str, str]


#: (url, headers) -> (status, response headers, body); tests pass their own
Get = Callable[[str, Mapping[str, str]], tuple[int, Mapping[str, str], bytes]]


def ssl_context(mirror: Mirror | None) -> ssl.SSLContext:
    """How a mirror's certificate is checked: against its ca_file, not at all when it is
    ``insecure``, else against the system's CAs."""
    if mirror is not None and mirror.ca_file:
        return ssl.create_default_context(cafile=mirror.ca_file)
    if mirror is not None and mirror.insecure:
        return ssl._create_unverified_context()
    return ssl.create_default_context()


def opener(mirror: Mirror | None) -> Get:
    """A GET for this mirror (or the registry itself), its certificate checked as
    ssl_context says."""
    context = ssl_context(mirror)

    def get(url: str, headers: Mapping[str, str]) -> tuple[int, Mapping[str, str], bytes]:
        req = urllib.request.Request(url)
        for key, value in headers.items():  # a token never follows a redirect elsewhere
            if key.lower() == "authorization":
                req.add_unredirected_header(key, value)
            else:
                req.add_header(key, value)
        try:
            with urllib.request.urlopen(req, timeout=60, context=context) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers or {}), exc.read() or b""
        except (urllib.error.URLError, OSError) as exc:
            raise LockError(f"{url}: {getattr(exc, 'reason', exc)}") from None
    return get


def manifest_url(ref: Reference, mirror: Mirror | None, what: str) -> str:
    """Where containerd would ask for this manifest: through the mirror as hosts.toml sends it
    (a mirror URL with a path is the API root itself: override_path), else the registry."""
    if mirror is not None:
        path = urllib.parse.urlsplit(mirror.url).path.rstrip("/")
        root = mirror.url.rstrip("/") if path else mirror.url.rstrip("/") + "/v2"
    else:
        root = UPSTREAM.get(ref.registry, f"https://{ref.registry}") + "/v2"
    return f"{root}/{ref.repository}/manifests/{what}"


def _token(challenge: str, get: Get, ref: Reference) -> str:
    """An anonymous pull token for a Bearer challenge (the distribution token spec)."""
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = params.pop("realm", "")
    if not realm.startswith("https://"):
        raise LockError(f"{ref.registry}: the token realm {realm!r} is not https")
    params.setdefault("scope", f"repository:{ref.repository}:pull")
    status, _, body = get(realm + "?" + urllib.parse.urlencode(params), {})
    if status != 200:
        raise LockError(f"{ref.registry}: no anonymous pull token (HTTP {status}); a private "
                        "registry needs a mirror the lock can read")
    data = json.loads(body)
    return str(data.get("token") or data.get("access_token") or "")


def authed_get(ref: Reference, url: str, get: Get, headers: Mapping[str, str] | None = None
               ) -> tuple[Mapping[str, str], bytes]:
    """GET ``url`` of ``ref``'s registry, with an anonymous token when it asks for one; the
    response headers and body (an error naming the URL for anything but 200)."""
    sent = dict(headers or {})
    status, resp, body = get(url, sent)
    challenge = next((v for k, v in resp.items() if k.lower() == "www-authenticate"), "")
    if status == 401 and challenge.lower().startswith("bearer "):
        sent["Authorization"] = f"Bearer {_token(challenge[7:], get, ref)}"
        status, resp, body = get(url, sent)
    if status != 200:
        raise LockError(f"{ref.registry}/{ref.repository}: {url} answered HTTP {status}; is "
                        "the image mirrored there?")
    return resp, body


def fetch_manifest(ref: Reference, mirror: Mirror | None, what: str, get: Get
                   ) -> tuple[str, bytes]:
    """The manifest or index ``what`` (a tag or digest) names: its media type and bytes; by
    digest, the bytes must hash to it."""
    url = manifest_url(ref, mirror, what)
    resp, body = authed_get(ref, url, get, {"Accept": ACCEPT})
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    if what.startswith("sha256:") and digest != what:
        raise LockError(f"{url}: the registry sent content of digest {digest}, not {what}")
    try:
        media = str(json.loads(body).get("mediaType") or "")
    except (ValueError, AttributeError):
        raise LockError(f"{url} sent no JSON manifest") from None
    return media or next((v for k, v in resp.items() if k.lower() == "content-type"), ""), body


def resolve_image(image: str, mirror: Mirror | None = None, get: Get | None = None) -> Resolved:
    """The digest ``image`` resolves to (through ``mirror`` when given) and its platforms."""
    ref = Reference.parse(image)
    get = get or opener(mirror)
    url = manifest_url(ref, mirror, ref.digest or ref.tag)
    resp, body = authed_get(ref, url, get, {"Accept": ACCEPT})
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    if ref.digest and ref.digest != digest:
        raise LockError(f"{image}: the registry sent content of digest {digest}")
    try:
        doc: dict[str, Any] = json.loads(body)
    except ValueError:
        raise LockError(f"{image}: {url} sent no JSON manifest") from None
    media = str(doc.get("mediaType") or next(
        (v for k, v in resp.items() if k.lower() == "content-type"), ""))
    platforms: dict[str, str] = {}
    if media in INDEX_TYPES or "manifests" in doc:
        for desc in doc.get("manifests", []):
            plat = desc.get("platform") or {}
            if plat.get("os") == "unknown" or "vnd.docker.reference.type" in \
                    (desc.get("annotations") or {}):
                continue  # attestation manifests (buildkit's), not a platform
            key = "/".join(p for p in (plat.get("os"), plat.get("architecture"),
                                       plat.get("variant")) if p)
            platforms.setdefault(key or "unknown", str(desc.get("digest")))
    return Resolved(digest, media, platforms)
