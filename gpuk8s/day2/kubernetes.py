"""Kubernetes upgrades with kubeadm (``invoke upgrade --kubernetes 1.37`` or ``1.36.2``).

A minor release (the newest patch of it) or a patch release, one minor at a time, as kubeadm
allows. The checks here come first, before any host changes: the target parses, the inventory
does not pin another release, kubeadm's skew rules hold (no downgrade, no skipped minor, no
kubelet left more than three minors behind, no worker before its control plane). The upgrade
itself is the runner's: gpuk8s.playbook.UPGRADE_PHASES with roles/kubernetes_upgrade, planned
and confirmed like a bootstrap, a backup before the first control plane changes, each node
drained, upgraded in kubeadm's order, waited for and uncordoned; the first node that fails
stops the run and stays cordoned.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuk8s.cluster_values import cluster_values
from gpuk8s.errors import Gpuk8sError, InventoryError
from gpuk8s.gather import gather
from gpuk8s.inventory import load_inventory
from gpuk8s.inventory.model import Inventory
from gpuk8s.ops.apt import source_line
from gpuk8s.ops.kube import KUBE_REPO_KEYRING, KUBECTL, release, release_prefix
from gpuk8s.playbook import UPGRADE_PHASES
from gpuk8s.report import Reporter
from gpuk8s.runner import converge
from gpuk8s.session import DEFAULT_OPENER, Opener, Session, context, open_session, run_step
from gpuk8s.sinks import shell

#: kubeadm's version skew policy: a kubelet may be up to three minors older than the API
#: server (kubernetes.io/releases/version-skew-policy, since 1.28)
KUBELET_SKEW = 3


def parse_target(version: str) -> str:
    """'1.37', '1.36.2' or with a 'v' -> '1.37' / '1.36.2'; anything else is a clear error."""
    m = re.fullmatch(r"v?(1\.\d+(?:\.\d+)?)", version.strip())
    if not m:
        raise InventoryError(f"--kubernetes {version!r} is not a Kubernetes release",
                             fix="give a minor (the newest patch of it) or a patch release, "
                             "e.g. --kubernetes 1.37 or --kubernetes 1.36.2")
    return m[1]


def _minor(version: str) -> str:
    return ".".join(version.lstrip("v").split(".")[:2])


def check_inventory(inventory: Inventory, target: str, hosts: list[str]) -> None:
    """No host's inventory pins a package release other than ``target``: the next bootstrap
    would move it back (the kubernetes role never downgrades a joined node, but says so)."""
    for name in hosts:
        values = inventory.hosts[name].vars
        pin = str(values["kubernetes_package_version"])
        if pin and not pin.startswith(release_prefix(target)):
            raise InventoryError(
                f"{name}: kubernetes_package_version pins {pin} "
                f"({values.origin('kubernetes_package_version')}), so bootstrap would keep "
                f"asking for it after the upgrade to {target}",
                fix=f'write kubernetes_package_version: "" (the newest {_minor(target)} patch) '
                'or the exact package release, then run the upgrade')


def check_skew(target: str, server: str, kubelets: Mapping[str, str],
               in_run: set[str]) -> None:
    """kubeadm's rules, before anything changes: ``server`` is the API server's gitVersion,
    ``kubelets`` each node's kubelet version, ``in_run`` the nodes this run upgrades."""
    want, have = release(target), release(server)
    if want < have[:len(want)]:
        raise InventoryError(f"the cluster runs {server}, newer than {target}: kubeadm does "
                             "not downgrade a control plane",
                             fix=f"give {_minor(server)} or a later release")
    if want[1] > have[1] + 1:
        step = f"{have[0]}.{have[1] + 1}"
        raise InventoryError(
            f"the cluster runs {server}; kubeadm upgrades one minor release at a time, so "
            f"{target} is out of reach in one step",
            fix=f"run `invoke upgrade --kubernetes {step}` first, then this one")
    behind = {n: v for n, v in kubelets.items() if n not in in_run
              and release(v)[:2] < (want[0], want[1] - KUBELET_SKEW)}
    if behind:
        listed = ", ".join(f"{n} ({v})" for n, v in sorted(behind.items()))
        raise InventoryError(
            f"a kubelet may be at most {KUBELET_SKEW} minors older than the API server; "
            f"after the upgrade to {target} these nodes, not in this run, would be too old: "
            f"{listed}", fix="include them in the run (drop --limit) or upgrade them first")


def offered(session: Session, target: str) -> str:
    """The newest kubeadm release of ``target`` in the target minor's package repo, asked on
    the first control plane before any node changes: apt reads that repo into a throwaway
    lists folder (the node's own sources, lists and caches are not touched), with the key
    bootstrap installed (pkgs.k8s.io signs every minor with the same key). A release the repo
    does not have is refused here, with what it has."""
    cp = session.first_cp
    gather(session, [cp])
    cluster_values(session)
    url = str(context(session, cp, "kubernetes").var("kubernetes_repo_url"))
    apt = ("-o Dir::Etc::SourceList=$d/list -o Dir::Etc::SourceParts=$d/parts "
           "-o Dir::State::Lists=$d/lists -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=")
    line = shell(source_line(url, "/", "", KUBE_REPO_KEYRING))
    script = (
        "d=$(mktemp -d) && trap 'rm -rf \"$d\"' EXIT && mkdir -p \"$d/lists/partial\" "
        f"\"$d/parts\" && printf '%s' {line} > \"$d/list\"\n"
        f"apt-get {apt} -q update >/dev/null 2>\"$d/err\" || {{ cat \"$d/err\" >&2; exit 2; }}\n"
        f"apt-cache {apt} madison kubeadm | awk '{{print $3}}'")
    versions = run_step(session, cp, script, f"kubeadm releases in {url}").split()
    matching = [v for v in versions if v.startswith(release_prefix(target))]
    if not matching:
        raise InventoryError(f"no kubeadm {target} in {url} (asked from {cp}); it offers: "
                             + (", ".join(versions[:6]) or "nothing"),
                             fix="pick one of those releases, or check kubernetes_repo_url")
    return max(matching, key=release)


def upgrade_kubernetes(inventory: str | Path, version: str, *, limit: str | None = None,
                       serial: int = 1, drain_timeout: int = 300, yes: bool = False,
                       reporter: Reporter | None = None,
                       confirm: Callable[[str], bool] | None = None,
                       opener: Opener = DEFAULT_OPENER, backup: bool = True) -> dict[str, Any]:
    """Upgrade the cluster to Kubernetes ``version`` (a minor: its newest patch; or a patch
    release): the control planes first, then the workers ``serial`` at a time."""
    target = parse_target(version)
    if serial < 1:
        raise InventoryError(f"--serial {serial}: upgrade at least one node at a time",
                             fix="--serial 1 (the default) or more")
    inv = load_inventory(inventory)
    # before the run's --set kubernetes_version: a pin of another minor would fail that first
    check_inventory(inv, target, list(inv.hosts))
    minor = _minor(target)
    sets = [f"kubernetes_version={minor}", f"kubernetes_upgrade_target={target}",
            f"upgrade_drain_timeout={int(drain_timeout)}"]
    session = open_session(inventory, limit=limit, sets=sets, command="upgrade",
                           reporter=reporter, opener=opener)
    with closing(session):
        rep = session.reporter
        cp = session.first_cp
        out = run_step(session, cp, f"{KUBECTL} version -o json && echo '## nodes' && "
                       f"{KUBECTL} get nodes -o json", "cluster version")
        version_text, _, nodes_text = out.partition("## nodes")
        server = json.loads(version_text)["serverVersion"]["gitVersion"]
        nodes = json.loads(nodes_text)["items"]
        kubelets = {n["metadata"]["name"]: n["status"]["nodeInfo"]["kubeletVersion"]
                    for n in nodes}
        # nodes are matched to hosts by address (kubeadm registers them with node-ip)
        addresses = {session.host(h).address for h in session.scope}
        in_run = {n["metadata"]["name"] for n in nodes
                  if any(a.get("address") in addresses
                         for a in n.get("status", {}).get("addresses") or [])}
        check_skew(target, server, kubelets, in_run)
        behind = release(server)[:len(release(target))] < release(target)
        if behind and cp not in session.scope:
            raise Gpuk8sError(f"the control plane {cp} runs {server}; it must be upgraded "
                              "before any worker (a kubelet may not be newer than the API "
                              f"server): run without --limit, or with --limit {cp}")
        newest = offered(session, target)
        rep.phase(f"upgrade Kubernetes from {server} to {target}"
                  + ("" if target.count(".") == 2 else f" (its newest patch: {newest})")
                  + f": the control planes one at a time, then {serial} worker(s) at a time")
        phases = tuple(replace(p, serial=serial) if p.hosts == "workers" else p
                       for p in UPGRADE_PHASES)
        session.runlog.extra.update(kubernetes=target, kubernetes_before=server)
        result = converge(session, yes=yes, confirm=confirm, backup=backup, phases=phases)
        if result.get("aborted"):
            return {"upgraded": [], "remaining": [], "aborted": True}
        others = [h for h in session.scope if h != cp]
        order = [cp, *[h for h in others if session.host(h).is_control_plane],
                 *[h for h in others if not session.host(h).is_control_plane]]
        done = [h for h in dict.fromkeys(order) if session.totals.get(h, {}).get("changed")]
        if not done:
            rep.print("nothing to upgrade")
        line = _inventory_line(inv, minor)
        if line:
            rep.print(line, style="yellow")
        return {"upgraded": done, "remaining": [], "inventory_change": line}


def _inventory_line(inv: Inventory, minor: str) -> str:
    """The one line to change when the inventory still names another minor ("": none)."""
    values = inv.control_planes[0].vars
    if str(values["kubernetes_version"]) == minor:
        return ""
    return (f'now write kubernetes_version: "{minor}" in '
            f"{values.origin('kubernetes_version')} (it says {values['kubernetes_version']}): "
            "until then, bootstrap and plan warn on every node and change none of its "
            "Kubernetes packages")
