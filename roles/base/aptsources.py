"""base's apt sources for an air-gapped cluster: the CA of an https mirror (apt_ca_file), and the
OS archive's own mirror (apt_os_mirror_url: what `invoke serve-bundle` prints) standing in for
the node's own OS sources, which are set aside, never deleted, while it does.

- apt_ca_file's certificates go to APT_CA_FILE, and APT_CA_CONF gives them to apt for each
  https host the apt sources name (``Acquire::https::<host>::CAInfo``), so the system's CAs
  still check every other https source; curl, which fetches the repositories' keys, gets the
  same file for those hosts (ops.apt.Apt.ca_hosts).
- apt_os_mirror_url is one more signed source (the key pinned by
  apt_os_mirror_key_fingerprint), added and refreshed before the node's own source files are
  renamed to ``<file>.gpuk8s-off``: apt ignores files of other extensions in sources.list.d
  (sources.list(5)), and /etc/apt/sources.list under another name is not read. Emptying
  apt_os_mirror_url puts them back and removes the mirror's source.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuk8s.cafile import read_ca_file
from gpuk8s.facts import Fact
from gpuk8s.facts.dpkg import SOURCES_OFF
from gpuk8s.facts.system import AptOsSources, Files
from gpuk8s.ops import Op, change, files, noop, q
from gpuk8s.ops.apt import APT_CA_CONF, APT_CA_FILE, ca_conf, https_hosts, repo
from gpuk8s.roles import HostContext

OS_LIST = "/etc/apt/sources.list.d/gpuk8s-os.list"
OS_KEYRING = "/etc/apt/keyrings/gpuk8s-os.gpg"


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [AptOsSources(), Files("+" + APT_CA_FILE, "+" + APT_CA_CONF, OS_LIST,
                                  "+" + OS_KEYRING)]


def ca_ops(ctx: HostContext) -> list[Op]:
    states = ctx.facts[Files("+" + APT_CA_FILE, "+" + APT_CA_CONF, OS_LIST, "+" + OS_KEYRING)]
    path = ctx.var("apt_ca_file")
    if not path:
        return [files.absent(states[APT_CA_CONF], "base | apt CA"),
                files.absent(states[APT_CA_FILE], "base | apt CA certificate")]
    hosts = https_hosts(ctx.vars)
    return [files.content(states[APT_CA_FILE], "base | apt CA certificate",
                          read_ca_file(path)),
            files.content(states[APT_CA_CONF], "base | apt CA",
                          ("// managed by gpuk8s: apt_ca_file checks these hosts\n"
                           + ca_conf(sorted(hosts))).encode())]


def mirror_ops(ctx: HostContext) -> list[Op]:
    """The OS archive's mirror in place of the node's own sources (or those put back)."""
    states = ctx.facts[Files("+" + APT_CA_FILE, "+" + APT_CA_CONF, OS_LIST, "+" + OS_KEYRING)]
    active, off = ctx.facts[AptOsSources()]
    url = ctx.var("apt_os_mirror_url")
    if not url:
        ops = [files.absent(states[OS_LIST], "base | OS archive mirror"),
               files.absent(states[OS_KEYRING], "base | OS archive mirror key")]
        if off:
            ops.insert(0, change("base | the node's own apt sources",
                                 "+ put back " + ", ".join(off) + " (apt_os_mirror_url is "
                                 "empty)", *(f"mv -f {q(p)} {q(p.removesuffix(SOURCES_OFF))}"
                                            for p in off)))
        return ops
    ops = [repo(states[OS_LIST], states[OS_KEYRING], "base | OS archive mirror", name="os-mirror",
                url=url, suite="/", components="", key_url=ctx.var("apt_os_mirror_key_url"),
                fingerprint=ctx.var("apt_os_mirror_key_fingerprint"),
                fingerprint_var="apt_os_mirror_key_fingerprint", apt=ctx.apt)]
    if active:
        ops.append(change("base | the node's own apt sources",
                          "+ set aside " + ", ".join(active) + f" (as *{SOURCES_OFF}: "
                          "apt_os_mirror_url stands in for them)",
                          *(f"mv -f {q(p)} {q(p + SOURCES_OFF)}" for p in active)))
    else:
        ops.append(noop("base | the node's own apt sources",
                        f"= set aside ({len(off)} file(s)): apt_os_mirror_url stands in"))
    return ops
