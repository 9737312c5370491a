"""apiserver_lb: the stable API endpoint of a cluster with several control planes, in
``control_plane_endpoint_mode: local_lb`` (the default there).

Every node, control planes included, runs HAProxy from the distribution's packages on
127.0.0.1:6443, forwarding to every control plane whose API server answers /readyz; the cluster's
``controlPlaneEndpoint`` is 127.0.0.1:6443, so kubelets, kube-proxy and kubectl on any node reach
whichever API servers are up, and a node joining as a control plane reaches the cluster before
its own API server exists. On control planes the API server binds its node's address only
(a kubeadm patch of the kube-apiserver manifest, written before `kubeadm init`/`join`), leaving
127.0.0.1:6443 to HAProxy.

Runs in the node phase, before the control plane phase: the endpoint answers (or will, as soon as
the first API server does) before kubeadm needs it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpuk8s.checks import Rule
from gpuk8s.facts import Fact
from gpuk8s.facts.system import Files, Packages, Services
from gpuk8s.ops import Op, change, files, noop
from gpuk8s.ops.apt import packages
from gpuk8s.ops.kube import KUBEADM_PATCHES
from gpuk8s.roles import HostContext
from gpuk8s.sinks import haproxy_server

UNIT = "haproxy"
CONF = "/etc/haproxy/haproxy.cfg"
PORT = 6443
BIND_PATCH = f"{KUBEADM_PATCHES}/kube-apiserver0+json.json"
MODES = ("auto", "local_lb", "external")

#: this role's variables beyond their type (their defaults are in defaults.yaml)
RULES: dict[str, Rule] = {
    "control_plane_endpoint_mode": Rule(choices=MODES, cluster_wide=True),
}


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [Packages(UNIT), Files("+" + CONF, "+" + BIND_PATCH), Services(UNIT)]


def local_lb(ctx: HostContext) -> bool:
    return bool(ctx.cluster.get("endpoint_mode") == "local_lb")


def config(ctx: HostContext) -> bytes:
    servers = [{"name": f"cp{i}", "address": haproxy_server(cp["address"], PORT)}
               for i, cp in enumerate(ctx.cluster["control_planes"], start=1)]
    return ctx.template("haproxy.cfg.j2", lb_port=PORT, lb_servers=servers)


def bind_patch(address: str) -> bytes:
    """kubeadm's JSON patch giving the API server ``--bind-address`` (its own node's address)."""
    return (json.dumps([{"op": "add", "path": "/spec/containers/0/command/-",
                         "value": f"--bind-address={address}"}], indent=1) + "\n").encode()


def plan(ctx: HostContext) -> list[Op]:
    if not local_lb(ctx):
        return []
    f = ctx.facts
    state = f[Files("+" + CONF, "+" + BIND_PATCH)]
    ops = [packages(f[Packages(UNIT)], "apiserver_lb | haproxy", {UNIT: ""}, apt=ctx.apt),
           files.content(state[CONF], "apiserver_lb | haproxy.cfg", config(ctx),
                         notify=("reload haproxy",))]
    unit = f[Services(UNIT)][UNIT]
    if unit.active == "active" and unit.enabled == "enabled":
        ops.append(noop("apiserver_lb | service", f"= {UNIT} on 127.0.0.1:{PORT}"))
    else:
        ops.append(change("apiserver_lb | service", f"+ enable and start {UNIT}",
                          f"haproxy -c -q -f {CONF}", f"systemctl enable -q {UNIT}",
                          f"systemctl restart {UNIT}"))
    mine = [cp for cp in ctx.cluster["control_planes"] if cp["host"] == ctx.host]
    if mine:
        ops.append(files.content(state[BIND_PATCH], "apiserver_lb | api server bind address",
                                 bind_patch(mine[0]["address"]), mode="0600"))
    return ops


HANDLERS = {
    "reload haproxy": lambda ctx: change(
        "apiserver_lb | reload haproxy", f"check {CONF}, reload {UNIT}",
        f"haproxy -c -q -f {CONF}", f"systemctl reload-or-restart {UNIT}"),
}
