"""cni: the pod network (flannel or calico) from pinned manifests in templates/cni/."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuk8s.errors import PlanError
from gpuk8s.facts import Fact
from gpuk8s.facts.kube import Cluster
from gpuk8s.ops import Op
from gpuk8s.ops.kube import apply
from gpuk8s.roles import HostContext


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [Cluster()]


def plan(ctx: HostContext) -> list[Op]:
    cni = ctx.var("cni")
    if cni == "calico":
        raise PlanError("cni: calico is not bundled yet: gpuk8s pins every manifest in "
                        "templates/cni/ and only flannel's is there so far; use cni: flannel")
    manifest = ctx.template(f"cni/{cni}.yaml.j2").decode()
    return [apply(ctx.facts[Cluster()], f"cni | {cni}", cni, manifest)]
