"""Read an apt repository the way apt does, on the admin machine: the signed InRelease checked
with gpgv against the key the inventory pins, then the Packages index checked against the
SHA256 the signed Release lists, parsed into stanzas. Nothing is installed and the admin
machine's own apt is not touched.

apt's chain of trust, which this follows (apt-pkg/acquire-item.cc@2.6.1): InRelease signature
-> SHA256 of Packages -> SHA256 of each .deb (the lock records that last hash; `invoke bundle
--cluster` checks every .deb against it).
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import lzma
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpuk8s.errors import Gpuk8sError
from gpuk8s.ops.apt import keyring_fingerprints, normalize_fingerprint


class LockError(Gpuk8sError):
    """A repository, key or registry the lock reads is unreachable or not what it claims."""


#: fetches one URL's bytes (tests pass their own)
Fetch = Callable[[str], bytes]


def http_fetch(url: str, timeout: float = 60) -> bytes:
    """GET ``url`` (http or https; the admin machine's own proxy settings apply)."""
    if not url.startswith(("http://", "https://")):
        raise LockError(f"{url}: only http and https URLs can be read")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            data: bytes = resp.read()
            return data
    except urllib.error.HTTPError as exc:
        raise LockError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise LockError(f"{url}: {reason}; the lock is made on a machine that reaches the "
                        "repositories (or their mirrors)") from None


@dataclass(frozen=True)
class Source:
    """One apt source gpuk8s configures on a node (a repo op's meta)."""

    name: str
    url: str
    suite: str
    components: str
    key_url: str
    fingerprint: str = ""
    #: the inventory variables that set it: <variable>_url, _key_url, _key_fingerprint
    variable: str = ""

    def base(self) -> str:
        return self.url if self.url.endswith("/") else self.url + "/"

    def release_dir(self) -> str:
        """Where InRelease lives: the URL itself for a flat repository ("/"), else dists/."""
        if self.suite == "/":
            return self.base()
        return f"{self.base()}dists/{self.suite}/"


def dearmor(data: bytes) -> bytes:
    """An ASCII-armored OpenPGP block as binary (a binary key is returned as it is)."""
    text = data.decode("ascii", "replace")
    if "-----BEGIN PGP" not in text:
        return data
    lines = text.split("-----BEGIN PGP", 1)[1].splitlines()[1:]
    body: list[str] = []
    in_headers = True
    for line in lines:
        if line.startswith("-----END PGP"):
            break
        if in_headers:
            if not line.strip():
                in_headers = False
            elif ":" not in line:  # no armor headers at all
                in_headers = False
                body.append(line.strip())
            continue
        if line.startswith("="):  # the CRC-24 line
            continue
        body.append(line.strip())
    try:
        return base64.b64decode("".join(body), validate=True)
    except binascii.Error:
        raise LockError("the key is armored but not valid base64") from None


def pinned_key(source: Source, fetch: Fetch) -> tuple[bytes, str]:
    """The source's signing key (binary keyring) and its fingerprint, refused unless it is
    exactly the pinned key (when the inventory pins one)."""
    keyring = dearmor(fetch(source.key_url))
    fprs = keyring_fingerprints(keyring)
    want = normalize_fingerprint(source.fingerprint)
    if want and fprs != [want]:
        got = ", ".join(fprs) or "no key"
        raise LockError(f"apt source {source.name}: the key at {source.key_url} is {got}, not "
                        f"the pinned {want}; the lock trusts only the pinned key")
    if len(fprs) != 1:
        raise LockError(f"apt source {source.name}: the key at {source.key_url} holds "
                        f"{len(fprs)} keys; pin the one that signs the repository")
    return keyring, fprs[0]


def verify_inrelease(data: bytes, keyring: bytes, fingerprint: str, where: str) -> bytes:
    """The Release text of a clearsigned InRelease, after gpgv checked that ``fingerprint``
    (a primary key, or a subkey of it) signed it."""
    with tempfile.TemporaryDirectory(prefix="gpuk8s-lock-") as tmp:
        ring, signed, out = Path(tmp, "key.gpg"), Path(tmp, "InRelease"), Path(tmp, "Release")
        ring.write_bytes(keyring)
        signed.write_bytes(data)
        try:
            res = subprocess.run(["gpgv", "--status-fd", "1", "--keyring", str(ring),
                                  "--output", str(out), str(signed)],
                                 capture_output=True, text=True, timeout=60)
        except FileNotFoundError:
            raise LockError("gpgv is missing on this machine: apt install gpgv") from None
        valid = [line.split() for line in res.stdout.splitlines()
                 if line.startswith("[GNUPG:] VALIDSIG ")]
        # VALIDSIG <signing key fpr> ... <primary key fpr> (gnupg doc/DETAILS)
        if res.returncode != 0 or not any(v[-1] == fingerprint or v[2] == fingerprint
                                          for v in valid):
            why = (res.stderr.strip().splitlines() or ["no valid signature"])[-1]
            raise LockError(f"{where}: not signed by the pinned key {fingerprint} ({why})")
        return out.read_bytes()


def stanzas(text: str) -> Iterator[dict[str, str]]:
    """deb822 paragraphs (Release, Packages) as field -> value; continuation lines kept."""
    fields: dict[str, str] = {}
    last = ""
    for line in text.splitlines():
        if not line.strip():
            if fields:
                yield fields
            fields, last = {}, ""
        elif line[0] in " \t" and last:
            fields[last] += "\n" + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            last = key.strip()
            fields[last] = value.strip()
    if fields:
        yield fields


def release_hashes(release: str) -> dict[str, tuple[str, int]]:
    """path -> (sha256, size) from a Release file's SHA256 field."""
    head = next(stanzas(release), {})
    out = {}
    for line in head.get("SHA256", "").splitlines():
        parts = line.split()
        if len(parts) == 3:
            out[parts[2]] = (parts[0], int(parts[1]))
    if not out:
        raise LockError("the Release file lists no SHA256 hashes (apt refuses it too)")
    return out


_DECOMPRESS: dict[str, Callable[[bytes], bytes]] = {
    ".xz": lzma.decompress, ".gz": gzip.decompress, "": lambda b: b}


@dataclass(frozen=True)
class Index:
    """One source's packages for one architecture, checked against its signed Release."""

    source: Source
    fingerprint: str
    packages: tuple[dict[str, str], ...]
    #: the pinned key (binary keyring) the index was checked with
    keyring: bytes = b""


def read_index(source: Source, arch: str, fetch: Fetch = http_fetch) -> Index:
    """Fetch and check ``source``'s Packages index for ``arch`` (and "all")."""
    keyring, fingerprint = pinned_key(source, fetch)
    where = f"apt source {source.name} ({source.release_dir()}InRelease)"
    release = verify_inrelease(fetch(source.release_dir() + "InRelease"), keyring,
                               fingerprint, where).decode("utf-8", "replace")
    hashes = release_hashes(release)
    comps = source.components.split() if source.suite != "/" else [""]
    found: list[dict[str, str]] = []
    for comp in comps:
        stem = f"{comp}/binary-{arch}/Packages" if comp else "Packages"
        for ext, unpack in _DECOMPRESS.items():
            if stem + ext not in hashes:
                continue
            want, size = hashes[stem + ext]
            url = source.release_dir() + stem + ext
            data = fetch(url)
            got = hashlib.sha256(data).hexdigest()
            if got != want or len(data) != size:
                raise LockError(f"{url}: SHA256 {got} ({len(data)} bytes) is not the "
                                f"{want} ({size} bytes) its signed Release lists")
            found += stanzas(unpack(data).decode("utf-8", "replace"))
            break
        else:
            raise LockError(f"{where}: the signed Release lists no {stem} index")
    return Index(source, fingerprint, tuple(p for p in found
                                            if p.get("Architecture") in (arch, "all")),
                 keyring)
