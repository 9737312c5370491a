"""base: dpkg health, apt proxy, swap off, kernel modules and sysctls Kubernetes needs."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

from gpuk8s.cafile import CaFileProblem, read_ca_file
from gpuk8s.checks import (
    Rule,
    VarProblem,
    check_fingerprint,
    check_sysctls,
    check_url,
    pinned_key,
    show,
)
from gpuk8s.facts import Fact
from gpuk8s.facts.system import DpkgHealth, Files, KernelModules, Packages, Sysctls, System
from gpuk8s.ops import Op, change, files, noop, q, warn
from gpuk8s.ops.apt import packages, proxy_conf
from gpuk8s.roles import HostContext
from gpuk8s.sinks import url_has_secret
from roles.base import aptsources

MODULES = ("overlay", "br_netfilter")
MODULES_FILE = "/etc/modules-load.d/k8s.conf"
SYSCTL_FILE = "/etc/sysctl.d/99-kubernetes.conf"
PROXY_FILE = "/etc/apt/apt.conf.d/90gpuk8s-proxy"
K8S_SYSCTLS = {
    "net.ipv4.ip_forward": "1",
    "net.bridge.bridge-nf-call-iptables": "1",
    "net.bridge.bridge-nf-call-ip6tables": "1",
}
BASE_PACKAGES = ("ca-certificates", "curl", "gnupg", "conntrack", "iptables")


def check_ca_file(name: str, value: str) -> VarProblem | None:
    """"" or the absolute path of a PEM file of CA certificates on this machine."""
    if value == "":
        return None
    if not os.path.isabs(os.path.expanduser(value)):
        return VarProblem(name, f"{name} must be an absolute path, got {show(value)}",
                          f"write {name}: /path/of/the/ca.crt (PEM, on this machine)")
    try:
        read_ca_file(value)
    except CaFileProblem as exc:
        return VarProblem(name, f"{name}: {exc.problem}", exc.fix)
    return None


#: this role's variables beyond their type (their defaults are in defaults.yaml)
RULES: dict[str, Rule] = {
    "base_sysctls": Rule(check_sysctls),
    "apt_os_mirror_key_fingerprint": Rule(check_fingerprint, across=pinned_key(
        "apt_os_mirror_key_url", "apt_os_mirror_key_fingerprint")),
    "apt_ca_file": Rule(check_ca_file),
    "apt_os_mirror_url": Rule(functools.partial(check_url, allow_empty=True)),
    "apt_os_mirror_key_url": Rule(functools.partial(check_url, allow_empty=True)),
}


def _sysctls(vars: Mapping[str, Any]) -> dict[str, str]:
    return {**K8S_SYSCTLS, **{k: str(v) for k, v in vars["base_sysctls"].items()}}


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [System(), DpkgHealth(), KernelModules(*MODULES), Sysctls(*_sysctls(vars)),
            Files(MODULES_FILE, SYSCTL_FILE, "+" + PROXY_FILE), Packages(*BASE_PACKAGES),
            *aptsources.facts(vars)]


def _repair_dpkg(reinstall: list[str], ctx: HostContext) -> Op:
    """Finish what an interrupted package run left: ``dpkg --configure -a`` applies dpkg's
    journal and configures what was unpacked. A package dpkg was killed in the middle of
    unpacking is half-installed: only a reinstall mends it (apt refuses every other install
    until then, and ``--configure -a`` stops at it, after applying the journal apt needs
    applied), so those are reinstalled from their repositories, then configured again."""
    op_id = "base | repair interrupted dpkg"
    if not reinstall:
        return change(op_id, "+ dpkg --configure -a (an earlier package run was interrupted)",
                      "dpkg --configure -a")
    names = " ".join(q(p) for p in reinstall)
    listed = ", ".join(reinstall)
    hint = (f"gpuk8s: apt could not reinstall {listed}; reinstall it by hand (apt-get install "
            f"--reinstall {listed}), or remove it (dpkg --remove --force-remove-reinstreq "
            f"{listed}), then run again")
    return change(
        op_id, f"+ dpkg --configure -a, reinstall {listed} (left half-installed by an "
        "interrupted package run)",
        "dpkg --configure -a || echo 'gpuk8s: dpkg --configure -a stopped at a package left "
        "half-installed; reinstalling it' >&2",
        ctx.apt.script(f"{ctx.apt.cmd} install --reinstall {names} "
                       f"|| {{ echo {q(hint)} >&2; exit 1; }}"),
        "dpkg --configure -a")


def plan(ctx: HostContext) -> list[Op]:
    f = ctx.facts
    sysinfo = f[System()]
    ops: list[Op] = []
    dpkg = f[DpkgHealth()]
    if dpkg["lock_holders"]:
        ops.append(warn("base | dpkg lock", f"! waiting for the dpkg lock (held by pid "
                        f"{', '.join(dpkg['lock_holders'])}): apt waits up to "
                        f"{ctx.var('apt_lock_timeout')} s (apt_lock_timeout), then fails"))
    if dpkg["interrupted"]:
        ops.append(_repair_dpkg(dpkg.get("reinstall", []), ctx))
    file_states = f[Files(MODULES_FILE, SYSCTL_FILE, "+" + PROXY_FILE)]
    # with package_cache on, every node's apt (the cache host's too) goes through the cache
    cache = ctx.cluster.get("package_cache_url")
    proxy = cache or ctx.var("apt_proxy")
    # apt sends https through the http proxy (CONNECT) unless told otherwise; the package
    # cache serves http only, so https sources go direct past it (or through apt_https_proxy)
    https = ctx.var("apt_https_proxy") or ("DIRECT" if cache else "")
    direct = ctx.var("apt_proxy_direct")
    if proxy or https:
        secret = url_has_secret(proxy) or url_has_secret(https)
        # a proxy with a password in it is for root's eyes only
        ops.append(files.content(file_states[PROXY_FILE], "base | apt proxy",
                                 (proxy_conf(proxy or "DIRECT", https, direct) + "\n").encode(),
                                 mode="0600" if secret else "0644", secret=secret))
    elif file_states[PROXY_FILE].exists:
        ops.append(files.absent(file_states[PROXY_FILE], "base | apt proxy"))
    # an https mirror's CA, then the OS archive's mirror (air-gapped: serve-bundle's), before
    # the first apt-get update
    ops += aptsources.ca_ops(ctx) + aptsources.mirror_ops(ctx)
    ops.append(packages(f[Packages(*BASE_PACKAGES)], "base | packages",
                        dict.fromkeys(BASE_PACKAGES, ""), update_first=True, apt=ctx.apt))
    if sysinfo.swap_active or sysinfo.swap_fstab:
        cmds = []
        if sysinfo.swap_active:
            cmds.append("swapoff -a")
        if sysinfo.swap_fstab:
            cmds.append("sed -i.gpuk8s-bak -E 's@^([^#].*[[:space:]]swap[[:space:]].*)$@# \\1"
                        "  # disabled by gpuk8s@' /etc/fstab")
        cmds.append("for u in $(systemctl list-units --type=swap --plain --no-legend "
                    "| awk '{print $1}'); do systemctl mask \"$u\"; done")
        ops.append(change("base | swap off", "+ swap off now and after reboot: "
                          + " ".join(sysinfo.swap_active + sysinfo.swap_fstab), *cmds))
    else:
        ops.append(noop("base | swap off", "= no swap active or in /etc/fstab"))
    ops.append(files.content(file_states[MODULES_FILE], "base | kernel modules persisted",
                             ("\n".join(MODULES) + "\n").encode()))
    present = f[KernelModules(*MODULES)]
    missing = [m for m in MODULES if not present.get(m)]
    in_container = sysinfo.in_container
    if not missing:
        ops.append(noop("base | kernel modules loaded", f"= {', '.join(MODULES)} present"))
    elif in_container:
        ops.append(warn("base | kernel modules loaded", f"! {', '.join(missing)} not present; "
                        f"this node is a {sysinfo.virt} container, so modules are the host "
                        "kernel's to load"))
    else:
        ops.append(change("base | kernel modules loaded", f"+ modprobe {' '.join(missing)}",
                          *(f"modprobe {m}" for m in missing)))
    wanted = _sysctls(ctx.vars)
    current = f[Sysctls(*wanted)]
    applicable = {k: v for k, v in wanted.items()
                  if k in current or not k.startswith("net.bridge.")}
    body = "".join(f"{k} = {v}\n" for k, v in wanted.items())
    ops.append(files.content(file_states[SYSCTL_FILE], "base | sysctls persisted",
                             ("# managed by gpuk8s\n" + body).encode()))
    # the kernel separates the numbers of a multi-value sysctl with tabs: compare the words
    stale = {k: v for k, v in applicable.items()
             if current.get(k, "").split() != v.split()}
    if stale:
        ops.append(change("base | sysctls applied", "+ sysctl " + " ".join(
            f"{k}={v}" for k, v in stale.items()),
            *(f"sysctl -q -w {q(f'{k}={v}')}" for k, v in stale.items())))
    else:
        ops.append(noop("base | sysctls applied", "= sysctls already set"))
    return ops


