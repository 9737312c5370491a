"""One helper per sink: every value from an inventory, a workload or a node passes through the
helper of the place it lands in, and nowhere else is such a value formatted by hand.

- :func:`shell`: a word in a POSIX shell command (quoted, never interpreted).
- :func:`node_name` / :func:`node_arg`: a Kubernetes node name (validated as the DNS-1123
  subdomain the kubelet requires anyway, then quoted; a name can never be an option).
- a scalar in a YAML manifest: the templates' ``| tojson`` filter (JSON, which YAML reads as the
  same scalar; a newline or ``---`` stays inside the string).
- :func:`apt_conf_string`: a quoted string in an apt.conf file (apt has no escape for ``"``,
  so a value that holds one, or any control character, is refused).
- :func:`registry_host`: a registry mirror's ``host[:port]``, which names its CA file on every
  node (a DNS name, an IPv4 or a bracketed IPv6 address, a numeric port; nothing else).
- :func:`haproxy_server`: a server address in haproxy.cfg (no quoting there: a DNS name, an IPv4
  address or an IPv6 address, nothing else).

Each validating helper raises :class:`UnsafeValue`, a :class:`Gpuk8sError` whose message names
the value, the sink and the fix.
"""

from __future__ import annotations

import ipaddress
import re
import shlex

from gpuk8s.errors import Gpuk8sError

#: RFC 1123 subdomain as Kubernetes checks node names (IsDNS1123Subdomain): at most 253
#: characters of lower-case labels joined by dots.
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class UnsafeValue(Gpuk8sError):
    """A value that cannot be used safely where it was going."""


def shell(value: str) -> str:
    """``value`` as one shell word."""
    return shlex.quote(value)


def node_name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid Kubernetes node name, or None when it is."""
    if not name:
        return "it is empty"
    if len(name) > 253:
        return f"it is {len(name)} characters long (at most 253)"
    if not DNS1123_SUBDOMAIN.fullmatch(name):
        return ("it is not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', "
                "starting and ending with a letter or digit)")
    return None


def node_name(name: str) -> str:
    """``name`` itself, once checked to be a valid Kubernetes node name."""
    problem = node_name_problem(name)
    if problem:
        raise UnsafeValue(f"node name {name!r} is refused: {problem}; give the host a valid "
                          "hostname (hostnamectl set-hostname gpu-01)")
    return name


def node_arg(name: str, prefix: str = "") -> str:
    """A validated node name as one shell word, e.g. ``node_arg(n, "node/")``."""
    return shell(prefix + node_name(name))


def unix_user(name: str) -> str:
    """``name`` itself, once checked to be a portable POSIX user name (useradd's rule)."""
    if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", name):
        raise UnsafeValue(f"user name {name!r} is refused: a login name is lower-case letters, "
                          "digits, '_' and '-', at most 32, not starting with a digit or '-'; "
                          "fix ansible_user in the inventory")
    return name


def apt_conf_string(value: str, what: str) -> str:
    """``value`` as a double-quoted apt.conf string; ``what`` names it in the error."""
    if '"' in value or _CONTROL.search(value):
        raise UnsafeValue(f"{what} {value!r} cannot be written to apt.conf: it holds a double "
                          "quote or a control character, which apt cannot escape; "
                          "remove them (percent-encode them in a URL)")
    return f'"{value}"'


#: a host name or IPv4 address, as it may stand in an apt.conf key (Acquire::http::Proxy::HOST)
APT_CONF_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*"
                           r"[A-Za-z0-9])?)*")


def apt_conf_host(host: str, what: str) -> str:
    """``host`` as the last part of an apt.conf key (apt has no quoting for keys)."""
    if not APT_CONF_HOST.fullmatch(host):
        raise UnsafeValue(f"{what}: {host!r} cannot be a key of apt.conf: apt matches host "
                          "names and IPv4 addresses (letters, digits, '-' and '.')")
    return host


def registry_host_problem(netloc: str) -> str | None:
    """Why ``netloc`` (a registry mirror URL's ``host[:port]``) is not a DNS name, an IPv4
    address or a bracketed IPv6 address with an optional numeric port; None when it is."""
    m = re.fullmatch(r"(\[[^\]]*\]|[^:\[\]]*)(?::([0-9]{1,5}))?", netloc)
    if not m:
        return "its port is not a number"
    host, port = m[1], m[2]
    if port is not None and not 1 <= int(port) <= 65535:
        return f"port {port} is not between 1 and 65535"
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return f"{host} is not an IPv6 address"
        return None
    if not APT_CONF_HOST.fullmatch(host) or len(host) > 253:
        return (f"host {host!r} is neither a DNS name nor an IP address (letters, digits, "
                "'-' and '.')")
    return None


def registry_host(netloc: str) -> str:
    """``netloc`` itself, once checked by :func:`registry_host_problem`: it names a file on
    every node (the mirror's CA certificate)."""
    problem = registry_host_problem(netloc)
    if problem:
        raise UnsafeValue(f"registry mirror host {netloc!r} is refused: {problem}; write the "
                          "mirror's URL as https://registry.example.lan:5000 in "
                          "registry_mirrors")
    return netloc


def url_has_secret(url: str) -> bool:
    """Whether ``url`` carries a password (``http://user:pass@host``)."""
    userinfo = url.partition("://")[2].partition("/")[0].rpartition("@")[0]
    return ":" in userinfo


def haproxy_server(address: str, port: int) -> str:
    """``address:port`` as a server address in haproxy.cfg, which has no quoting: a DNS name or
    IPv4 address as it is, an IPv6 address as ``ipv6@ADDR:PORT``; anything else is refused."""
    if APT_CONF_HOST.fullmatch(address):
        return f"{address}:{int(port)}"
    try:
        return f"ipv6@{ipaddress.IPv6Address(address)}:{int(port)}"
    except ValueError:
        raise UnsafeValue(f"address {address!r} cannot be a server in haproxy.cfg: it is neither "
                          "a DNS name, an IPv4 nor an IPv6 address; fix ansible_host in the "
                          "inventory") from None
