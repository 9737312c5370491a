"""Registry mirrors: containerd's host configuration (one hosts.toml per registry under
/etc/containerd/certs.d/, read at every pull, so a change needs no restart) and Docker's
daemon.json keys, built from the inventory's ``registry_mirrors``."""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuk8s.errors import Gpuk8sError
from gpuk8s.facts.kube import CERTS_D, HOSTS_MARKER
from gpuk8s.sinks import registry_host

#: the first line of every hosts.toml gpuk8s writes: only those are ever removed
MARKER = HOSTS_MARKER
#: where a registry's own API lives when it is not https://<registry> (Docker Hub's)
UPSTREAM = {"docker.io": "https://registry-1.docker.io"}
DAEMON_JSON = "/etc/docker/daemon.json"


@dataclass(frozen=True)
class Mirror:
    url: str
    insecure: bool = False
    #: the CA certificate's path on the admin machine (copied to every node)
    ca_file: str | None = None

    @property
    def netloc(self) -> str:
        return urllib.parse.urlsplit(self.url).netloc


def mirrors(value: Mapping[str, Any]) -> dict[str, list[Mirror]]:
    """The inventory's registry_mirrors (already checked) as Mirror lists, registries sorted."""
    out: dict[str, list[Mirror]] = {}
    for registry in sorted(value):
        out[registry] = [Mirror(m.rstrip("/")) if isinstance(m, str) else
                         Mirror(str(m["url"]).rstrip("/"), bool(m.get("insecure", False)),
                                m.get("ca_file")) for m in value[registry]]
    return out


def hosts_dir(registry: str) -> str:
    return f"{CERTS_D}/{registry}"


def hosts_file(registry: str) -> str:
    return f"{hosts_dir(registry)}/hosts.toml"


def ca_path(registry: str, mirror: Mirror) -> str:
    """Where a mirror's CA certificate lives on a node, beside its registry's hosts.toml: named
    from the mirror's host and port once checked (sinks.registry_host), never from raw URL text."""
    return f"{hosts_dir(registry)}/{registry_host(mirror.netloc).replace(':', '_')}.crt"


#: one PEM block: its label and the whole block, BEGIN to END line (RFC 7468)
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n.*?-----END \1-----", re.S)
#: a CA file larger than this is not a CA file (Debian's whole bundle is about 220 KB)
CA_FILE_LIMIT = 1 << 20


class CaFileProblem(Gpuk8sError):
    """A ca_file that cannot be copied to the nodes: what is wrong (``problem``) and what to
    do (``fix``)."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}; {fix}")
        self.problem = problem
        self.fix = fix


def ca_certificates(data: bytes, source: str) -> bytes:
    """The CERTIFICATE blocks of the PEM text ``data`` (from ``source``, named in errors), each
    checked to parse as an X.509 certificate, and nothing else: the copy goes 0644 to every node
    and into ``plan --diff``. A private key anywhere in the file refuses it."""
    found = list(_PEM_BLOCK.finditer(data))
    if b"PRIVATE KEY" in data:
        labels = sorted({m[1].decode() for m in found if b"PRIVATE KEY" in m[1]})
        raise CaFileProblem(
            f"ca_file {source} holds a private key ({', '.join(labels) or 'PRIVATE KEY'}): "
            "gpuk8s copies ca_file to every node, readable by every user there, and shows it "
            "in plan --diff",
            "give a file that holds only the registry's CA certificate (openssl x509 -in "
            f"{source} -out ca.crt writes its first certificate alone) and keep the key on "
            "the registry")
    certs = [m for m in found if m[1] == b"CERTIFICATE"]
    if not certs:
        raise CaFileProblem(f"ca_file {source} holds no PEM certificate (-----BEGIN "
                            "CERTIFICATE-----)", "give the registry's CA certificate in PEM "
                            "(openssl x509 -inform der -in ca.der -out ca.pem converts DER)")
    from cryptography import x509

    for i, m in enumerate(certs, 1):
        try:
            x509.load_pem_x509_certificate(m[0])
        except ValueError as exc:
            raise CaFileProblem(f"ca_file {source}: certificate {i} of {len(certs)} is not a "
                                "valid X.509 certificate", "export the registry's CA "
                                "certificate again, in PEM") from exc
    return b"".join(m[0] + b"\n" for m in certs)


def read_ca_file(path: str) -> bytes:
    """The certificates of the CA file at ``path`` on this machine (see ca_certificates);
    CaFileProblem when it cannot be read or is not a CA file."""
    fix = ("give the absolute path of the registry's CA certificate (PEM) on this machine; "
           "gpuk8s copies it to every node")
    try:
        with open(os.path.expanduser(path), "rb") as fh:
            data = fh.read(CA_FILE_LIMIT + 1)
    except OSError as exc:
        raise CaFileProblem(f"cannot read ca_file {path}: {exc.strerror}", fix) from None
    if len(data) > CA_FILE_LIMIT:
        raise CaFileProblem(f"ca_file {path} is larger than {CA_FILE_LIMIT >> 20} MiB, which "
                            "no CA certificate file is", fix)
    return ca_certificates(data, path)


def read_ca(mirror: Mirror) -> bytes:
    """What a mirror's CA file on a node holds: the certificates of its ca_file, only."""
    assert mirror.ca_file is not None
    return read_ca_file(mirror.ca_file)


def _toml(text: str) -> str:
    """A TOML basic string. URLs and paths reach here checked (no quotes, backslashes or
    control characters); JSON's escaping is TOML's for what remains."""
    return json.dumps(text)


def hosts_toml(registry: str, wanted: list[Mirror]) -> bytes:
    """containerd's hosts.toml for one registry: its mirrors in order (pull and resolve), then
    the registry itself as the fallback (``server``; none for ``_default``)."""
    lines = [MARKER, f"# mirrors of {registry}, tried in order before the registry itself"]
    if registry != "_default":
        lines.append(f"server = {_toml(UPSTREAM.get(registry, f'https://{registry}'))}")
    for mirror in wanted:
        lines += ["", f"[host.{_toml(mirror.url)}]", '  capabilities = ["pull", "resolve"]']
        path = urllib.parse.urlsplit(mirror.url).path
        if path not in ("", "/"):
            # a path is the registry API root itself (Harbor's proxy projects: .../v2/<project>)
            lines.append("  override_path = true")
        if mirror.insecure:
            lines.append("  skip_verify = true")
        if mirror.ca_file:
            lines.append(f"  ca = {_toml(ca_path(registry, mirror))}")
    return ("\n".join(lines) + "\n").encode()


def docker_settings(wanted: Mapping[str, list[Mirror]]) -> dict[str, list[str]]:
    """daemon.json keys for Docker's own pulls: ``registry-mirrors`` (Docker uses it for Docker
    Hub only) and ``insecure-registries`` (mirrors over plain http or without verification)."""
    hub = [m.url for m in wanted.get("docker.io", [])]
    insecure = sorted({m.netloc for ms in wanted.values() for m in ms
                       if m.insecure or m.url.startswith("http://")})
    return {"registry-mirrors": hub, "insecure-registries": insecure}


def merged_daemon_json(current: bytes | None, settings: Mapping[str, list[str]]) -> bytes | None:
    """daemon.json with gpuk8s's keys set and every other key kept; None when the file on the
    host is not a JSON object (gpuk8s will not overwrite what it cannot read)."""
    data: dict[str, Any] = {}
    if current:
        try:
            loaded = json.loads(current)
        except ValueError:
            return None
        if not isinstance(loaded, dict):
            return None
        data = loaded
    for key, values in settings.items():
        if values:
            data[key] = values
        else:
            data.pop(key, None)
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()
