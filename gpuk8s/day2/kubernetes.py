"""Kubernetes patch upgrades with kubeadm (``invoke upgrade --kubernetes 1.36.2``).

The order is the one kubeadm documents: the first control plane (kubeadm package, ``kubeadm
upgrade apply``, drain, kubelet and kubectl packages, kubelet restart, uncordon), the other
control planes one at a time (``kubeadm upgrade node`` upgrades their static pods), then the
workers ``serial`` at a time (kubeadm package, ``kubeadm upgrade node``, drain, kubelet and
kubectl, restart, uncordon). Every node is verified before the next one starts: Ready, its
kubelet reporting the new version, and on GPU nodes allocatable nvidia.com/gpu back at the GPU
count. The first node that fails stops the run; it stays cordoned, the rest are untouched.

Only patch releases of the inventory's ``kubernetes_version`` minor: a minor upgrade also moves
the pkgs.k8s.io repo and is not done here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from gpuk8s.backups import before_change
from gpuk8s.day2.steps import (
    ask_confirmation,
    chunks,
    gathered_session,
    node_name,
    run_batches,
    run_step,
)
from gpuk8s.drain import drain, uncordon
from gpuk8s.errors import Gpuk8sError, InventoryError
from gpuk8s.facts.kube import Cluster
from gpuk8s.facts.system import Packages
from gpuk8s.ops.apt import DEFAULT_APT, RESOLVE_HELPERS, Apt
from gpuk8s.ops.kube import KUBE_PACKAGES, KUBEADM_CONFIG, KUBEADM_PATCHES, KUBECTL
from gpuk8s.report import Reporter
from gpuk8s.session import DEFAULT_OPENER, Opener, Session
from gpuk8s.sinks import node_arg, shell

#: kubeadm regenerates the static pod manifests on upgrade: this node's patches (the API
#: server's bind address beside the local load balancer) must be given again, or they are lost
WITH_PATCHES = f'p=""; if [ -d {KUBEADM_PATCHES} ]; then p="--patches {KUBEADM_PATCHES}"; fi; '


def parse_target(version: str) -> str:
    """'1.36.2' or 'v1.36.2' -> '1.36.2'; anything else is a clear error."""
    m = re.fullmatch(r"v?(1\.\d+\.\d+)", version.strip())
    if not m:
        raise InventoryError(f"--kubernetes {version!r} is not a Kubernetes release",
                             fix="give major.minor.patch, e.g. --kubernetes 1.36.2")
    return m[1]


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _patch(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.lstrip("v").split("-")[0].split(".")[:3])


def check_inventory(session: Session, target: str) -> None:
    """The inventory must agree with the target: same minor, no pin on another version."""
    for name in dict.fromkeys([session.first_cp, *session.scope]):
        values = session.host(name).vars
        minor = str(values["kubernetes_version"])
        if minor != _minor(target):
            raise InventoryError(
                f"--kubernetes {target} is not a {minor} release (kubernetes_version of {name}, "
                f"{values.origin('kubernetes_version')}); gpuk8s upgrades patch releases within "
                "the inventory's minor (a minor upgrade also moves the pkgs.k8s.io repo, "
                "which gpuk8s does not do yet)",
                fix=f"pick a {minor}.x release, e.g. --kubernetes {minor}.{_patch(target)[2]}")
        pin = str(values["kubernetes_package_version"])
        if pin and not pin.startswith(target + "-"):
            raise InventoryError(
                f"{name}: kubernetes_package_version pins {pin} "
                f"({values.origin('kubernetes_package_version')}), so the next bootstrap would "
                f"put the packages back from {target}",
                fix=f'write kubernetes_package_version: "" (newest {minor} patch) or '
                f'"{target}-1.1", then run the upgrade')



def _resolve_and_install(names: Sequence[str], target: str, apt: Apt = DEFAULT_APT) -> str:
    """Script: find the newest package version of ``target`` with apt's resolver helper
    (refreshing the lists once), unhold, install, hold again; say what was installed. apt
    waits the host's apt_lock_timeout for the dpkg lock."""
    first = names[0]
    want = " ".join(f'{n}="$v"' for n in names)
    resolve = f"v=$(r {first} {shell(target + '-')})"
    return (
        f"set -e\n{RESOLVE_HELPERS}{resolve}\n"
        f'if [ -z "$v" ]; then {{ {apt.update()}; }} >/dev/null; {resolve}; fi\n'
        f'if [ -z "$v" ]; then echo "no {first} {target} in the configured repos; they offer:"; '
        f"apt-cache madison {first} | awk '{{print \"  \" $3}}' | head -n 5; exit 3; fi\n"
        f"apt-mark unhold {' '.join(names)} >/dev/null\n"
        f"{apt.cmd} --allow-change-held-packages install {want}\n"
        f"apt-mark hold {' '.join(names)} >/dev/null\n"
        f'echo "installed {" ".join(names)} $v"\n')


def wait_node(session: Session, node: str, gpus: int, timeout: int,
              kubelet: str | None = None) -> None:
    """After a node's restart: the API server answers, the node is Ready (with its kubelet at
    v``kubelet`` when given) and its ``gpus`` GPUs allocatable again."""
    cp = session.first_cp
    ref = node_arg(node, "node/")
    # the API server may be restarting (the control plane's kubelet just did): wait for it
    waits = [f"end=$(( $(date +%s) + {timeout} )); until {KUBECTL} get --raw /readyz "
             ">/dev/null 2>&1; do [ $(date +%s) -lt $end ] || { echo 'the API server did not "
             f"come back within {timeout}s'; exit 1; }}; sleep 1; done",
             f"{KUBECTL} wait --for=condition=Ready {ref} --timeout={timeout}s"]
    if kubelet:
        waits.append(f"{KUBECTL} wait --for=jsonpath='{{.status.nodeInfo.kubeletVersion}}'"
                     f"=v{kubelet} {ref} --timeout={timeout}s")
    if gpus:
        waits.append(f"{KUBECTL} wait --for=jsonpath='{{.status.allocatable.nvidia\\.com/gpu}}'"
                     f"={gpus} {ref} --timeout={timeout}s")
    run_step(session, cp, " && ".join(waits), f"verify {node}", timeout=3 * timeout + 60)


def upgrade_kubernetes(inventory: str | Path, version: str, *, limit: str | None = None,
                       serial: int = 1, drain_timeout: int = 300, yes: bool = False,
                       reporter: Reporter | None = None,
                       confirm: Callable[[str], bool] | None = None,
                       opener: Opener = DEFAULT_OPENER,
                       verify_timeout: int = 300, backup: bool = True) -> dict[str, Any]:
    """Upgrade the cluster to Kubernetes ``version`` (a patch release of the inventory's
    kubernetes_version): control plane first, then workers ``serial`` at a time."""
    target = parse_target(version)
    # --limit: only those hosts are contacted, plus the control plane (as for bootstrap)
    session = gathered_session(inventory, limit, "upgrade", reporter=reporter, opener=opener)
    with closing(session):
        rep = session.reporter
        check_inventory(session, target)
        cp = session.first_cp
        server = json.loads(run_step(session, cp, f"{KUBECTL} version -o json",
                                     "cluster version"))["serverVersion"]["gitVersion"]
        if _patch(server) > _patch(target):
            raise Gpuk8sError(f"the cluster runs {server}, newer than {target}: kubeadm does "
                              "not downgrade a control plane")
        wanted = set(session.scope)
        nodes = session.facts[cp][Cluster()].nodes
        todo: list[str] = []
        rep.phase(f"upgrade Kubernetes to v{target}: the control planes, then {serial} "
                  "worker(s) at a time")
        for h in dict.fromkeys([cp, *session.scope]):
            name = session.cluster["nodes"][h]["name"]
            kube = nodes.get(name)
            pkgs = session.facts[h][Packages(*KUBE_PACKAGES)]
            running = kube.kubelet_version if kube else "not joined"
            behind = (running != f"v{target}"
                      or any(not pkgs.get(p) or not pkgs[p].version.startswith(target + "-")
                             for p in KUBE_PACKAGES)
                      or (h == cp and server != f"v{target}"))
            if kube is None:
                behind = False  # not in the cluster: bootstrap joins it at the new version
            if behind and h in wanted:
                todo.append(h)
            mark = "+" if h in todo else ("-" if behind else "=")
            role = "control plane" if session.host(h).is_control_plane else "worker"
            extra = "" if h in todo or not behind else " (left out by --limit)"
            rep.print(f"  {mark} {h} ({role}): {running} -> v{target}{extra}")
        if cp not in todo and server != f"v{target}":
            raise Gpuk8sError(f"the control plane {cp} runs {server}; it must be upgraded "
                              "before any worker (a kubelet may not be newer than the API "
                              f"server): run without --limit, or with --limit {cp}")
        if not todo:
            rep.print("nothing to upgrade")
            return {"upgraded": [], "remaining": []}
        ask_confirmation(f"upgrade {len(todo)} node(s) to Kubernetes v{target}? [y/N] ", yes,
                         confirm)
        before_change(session, f"the upgrade to Kubernetes v{target}", backup)

        # the first control plane (upgrade apply), the others one at a time (upgrade node:
        # each restarts its API server while the rest serve the endpoint), then the workers
        others = [h for h in todo if h != cp and session.host(h).is_control_plane]
        batches = ([[cp]] if cp in todo else []) + [[h] for h in others] + chunks(
            [h for h in todo if h != cp and h not in others], serial)

        def one_batch(batch: Sequence[str]) -> Reporter:
            _upgrade_batch(session, batch, target, cp, drain_timeout, verify_timeout)
            return rep

        done = run_batches(todo, batches, one_batch, to=f"v{target}",
                           left="may be cordoned: inspect, then `kubectl uncordon`")
        session.runlog.write_report(upgraded=done, kubernetes=target)
        return {"upgraded": done, "remaining": []}


def _upgrade_batch(session: Session, batch: Sequence[str], target: str, cp: str,
                   drain_timeout: int, verify_timeout: int) -> None:
    rep = session.reporter
    names = {h: node_name(session, h) for h in batch}
    for h in batch:
        rep.print(f"  [{h}] kubeadm {target}")
        apt = Apt.for_host(session.host(h).vars)
        run_step(session, h, _resolve_and_install(["kubeadm"], target, apt),
                 f"{h}: kubeadm {target}", timeout=1800)
        if h == cp:
            rep.print(f"  [{h}] kubeadm upgrade apply v{target}")
            run_step(session, h, f"{WITH_PATCHES}kubeadm upgrade apply v{target} --yes $p",
                     f"kubeadm upgrade apply v{target}", timeout=900)
            # keep gpuk8s's copy of the kubeadm config in step with the cluster
            cfg = KUBEADM_CONFIG
            run_step(session, h, f"if [ -f {cfg} ]; then sed -i 's/^kubernetesVersion: .*/"
                     f"kubernetesVersion: \"v{target}\"/' {cfg}; fi", "kubeadm config version")
        else:
            rep.print(f"  [{h}] kubeadm upgrade node")
            run_step(session, h, f"{WITH_PATCHES}kubeadm upgrade node $p",
                     "kubeadm upgrade node", timeout=900)
    for h in batch:
        drain(session, names[h], drain_timeout)
    for h in batch:
        rep.print(f"  [{h}] kubelet, kubectl {target}; restart kubelet")
        run_step(session, h, _resolve_and_install(["kubelet", "kubectl"], target,
                                                  Apt.for_host(session.host(h).vars))
                 + "systemctl daemon-reload\nsystemctl restart kubelet\n",
                 f"{h}: kubelet {target}", timeout=1800)
    for h in batch:
        node = session.cluster["nodes"][h]
        # a tainted control plane's GPUs are not offered (no device plugin there)
        gpus = int(node["gpus"] or 0) if node.get("schedulable", True) else 0
        wait_node(session, names[h], gpus, verify_timeout, kubelet=target)
        uncordon(session, names[h])
        rep.print(f"  [{h}] Ready at v{target}" + (f", {gpus} GPU(s) allocatable" if gpus
                                                    else ""))
