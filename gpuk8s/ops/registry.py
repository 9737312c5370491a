"""Registry mirrors: containerd's host configuration (one hosts.toml per registry under
/etc/containerd/certs.d/, read at every pull, so a change needs no restart) and Docker's
daemon.json keys, built from the inventory's ``registry_mirrors``."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuk8s.cafile import read_ca_file
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
