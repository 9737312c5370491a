"""package_cache: apt-cacher-ng on one host that every node's apt goes through, so a cluster of
N nodes downloads each upstream package (and each package index) once.

Ordering: this role runs in its own phase, ``package-cache``, before the node phase and only on
the cache host (``package_cache_host``, or the first control plane). The phase barrier means the
cache answers before any node is pointed at it: the base role (node phase) then writes every
node's apt proxy file, the cache host's own included, with the cache's URL instead of
``apt_proxy``. The cache itself fetches through ``apt_proxy`` when one is set (its ``Proxy:``
setting), and this role installs apt-cacher-ng through ``apt_proxy`` (or directly) whatever the
host's apt proxy file says, so a cache host whose proxy file points at a removed cache recovers.

Only http:// apt sources go through the cache (Debian's and Ubuntu's archives); https:// sources
(Docker, pkgs.k8s.io, NVIDIA) are fetched directly by each node (the base role writes
``Acquire::https::Proxy "DIRECT"``: apt would otherwise send them to the cache by CONNECT), or
through ``apt_https_proxy`` when one is set.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpuk8s.checks import Rule
from gpuk8s.facts import Fact
from gpuk8s.facts.system import Files, Packages, Services
from gpuk8s.ops import Op, change, files, noop
from gpuk8s.ops.apt import Apt, packages, proxy_conf
from gpuk8s.roles import HostContext
from gpuk8s.sinks import url_has_secret

PORT = 3142
CONF = "/etc/apt-cacher-ng/zz-gpuk8s.conf"
LOG = "/var/log/apt-cacher-ng/apt-cacher.log"
UNIT = "apt-cacher-ng"
#: wait for the cache to answer HTTP (an event, polled every 0.1 s), up to 30 s
WAIT = (f"for i in $(seq 1 300); do curl -s -o /dev/null --noproxy '*' "
        f"http://127.0.0.1:{PORT}/ && exit 0; sleep 0.1; done; "
        f"echo 'apt-cacher-ng does not answer on port {PORT}' >&2; exit 1")


#: this role's variables beyond their type (their defaults are in defaults.yaml)
RULES: dict[str, Rule] = {
    "package_cache": Rule(cluster_wide=True),
    "package_cache_host": Rule(cluster_wide=True),
}


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    if not vars["package_cache"]:
        return []
    return [Packages(UNIT), Files("+" + CONF), Services(UNIT)]


def bind_addresses(cache_url: str) -> list[str]:
    """Where the cache listens: loopback (the role's own readiness check, and the host's apt
    when it names 127.0.0.1) and the cache host's cluster address, the one every node's apt
    proxy file names (cluster_values.package_cache_url), never every interface (apt-cacher-ng's
    default). acng.conf@3.7.4 (Debian 12): "BindAddress: localhost 192.168.7.254 ...", a
    space-separated list; "Default: listens on all interfaces and protocols"."""
    host = urllib.parse.urlsplit(cache_url).hostname if cache_url else None
    if not host or host == "127.0.0.1":
        return ["127.0.0.1"]
    # an IPv6 literal as acng's [address]:port endpoint form (acng.conf@3.7.4)
    return ["127.0.0.1", f"[{host}]:{PORT}" if ":" in host else host]


def config(vars: Mapping[str, Any], cache_url: str = "") -> bytes:
    """acng reads every *.conf of /etc/apt-cacher-ng in order; this one comes last."""
    lines = ["# managed by gpuk8s (package_cache): the cluster's apt cache",
             f"Port: {PORT}",
             # not on every interface (security review 2, L4): the nodes' network only
             f"BindAddress: {' '.join(bind_addresses(cache_url))}"]
    if vars["apt_proxy"]:  # a URL without spaces or control characters (checked on load)
        lines.append(f"Proxy: {vars['apt_proxy']}")
    # log every transfer as it happens (bytes fetched from upstream are counted from this log)
    lines.append("UnbufferLogs: 1")
    return ("\n".join(lines) + "\n").encode()


def _through(ctx: HostContext) -> Apt:
    """apt for installing the cache itself: through ``apt_proxy`` (or directly, apt's DIRECT),
    whatever the host's apt proxy file says (it may name this very cache, not yet running)."""
    proxy = ctx.var("apt_proxy")
    return Apt.for_host(ctx.vars, conf=proxy_conf(proxy or "DIRECT", ctx.var("apt_https_proxy"),
                                                  ctx.var("apt_proxy_direct")))


def plan(ctx: HostContext) -> list[Op]:
    if not ctx.var("package_cache"):
        return []
    f = ctx.facts
    install = packages(f[Packages(UNIT)], "package_cache | apt-cacher-ng", {UNIT: ""},
                       apt=_through(ctx))
    ops = [replace(install, secret=url_has_secret(ctx.var("apt_proxy")))]
    secret = url_has_secret(ctx.var("apt_proxy"))  # then for apt-cacher-ng's eyes only
    ops.append(files.content(f[Files("+" + CONF)][CONF], "package_cache | config",
                             config(ctx.vars, str(ctx.cluster.get("package_cache_url") or "")),
                             notify=("restart apt-cacher-ng",),
                             owner=UNIT if secret else "root", mode="0600" if secret else "0644",
                             secret=secret))
    unit = f[Services(UNIT)][UNIT]
    if unit.active == "active" and unit.enabled == "enabled":
        ops.append(noop("package_cache | service", f"= {UNIT} running on port {PORT}"))
    else:
        ops.append(change("package_cache | service", f"+ enable and start {UNIT}",
                          f"systemctl enable --now {UNIT}", WAIT))
    return ops


HANDLERS = {
    "restart apt-cacher-ng": lambda ctx: change(
        "package_cache | restart apt-cacher-ng", f"restart {UNIT}",
        f"systemctl restart {UNIT}", WAIT),
}
