"""Steps every day-2 command shares: one script run on a host (logged, redacted, CommandFailed
on a non-zero exit), node names, confirmation, and upgrades batch by batch. The session with
facts they start from is gpuk8s.gather.gathered_session (accept starts from it too)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from gpuk8s.errors import Gpuk8sError, InventoryError
from gpuk8s.facts.kube import ADMIN_CONF, Cluster
from gpuk8s.ops.kube import KUBEADM_RESET, KUBECTL
from gpuk8s.report import Reporter
from gpuk8s.runner import confirmed
from gpuk8s.session import Session, run_step

#: what `kubeadm reset` leaves behind (its own notes say so), minus firewall rules: flushing
#: iptables on a box reached over SSH can cut the session, so rules are left to the next CNI.
#: Kubeconfigs go only where they are the copies of admin.conf gpuk8s installed (root's and
#: the SSH user's): a file a user wrote for another cluster differs and stays. They are compared
#: before the reset removes admin.conf, and found without following symlinks (find -P, a
#: regular file only): a user's ~/.kube that points elsewhere never makes root delete a file
#: outside /home/<user>/.kube/
_OURS = f"-type f -exec cmp -s {ADMIN_CONF} '{{}}' ';' -delete"
CLEANUP = f"""\
if [ -f {ADMIN_CONF} ]; then
  find /root -mindepth 2 -maxdepth 2 -path /root/.kube/config {_OURS}
  find /home -mindepth 3 -maxdepth 3 -path '/home/*/.kube/config' {_OURS}
fi
if command -v kubeadm >/dev/null 2>&1; then
  {KUBEADM_RESET}
fi
rm -rf /etc/cni/net.d/* /var/lib/cni /etc/kubernetes/gpuk8s
for link in cni0 flannel.1 vxlan.calico tunl0; do
  if ip link show "$link" >/dev/null 2>&1; then ip link delete "$link"; fi
done
if systemctl is-active --quiet containerd; then systemctl restart containerd; fi
"""


def node_name(session: Session, host: str) -> str:
    """The Kubernetes node name of an inventory host: its hostname when reachable, else the
    node whose InternalIP is the host's address, else the inventory name."""
    facts = session.facts.get(host)
    if facts is not None:
        return str(session.cluster["nodes"][host]["name"])
    cluster = session.facts[session.first_cp][Cluster()]
    address = session.host(host).address
    raw = run_step(session, session.first_cp, f"{KUBECTL} get nodes -o json", "list nodes")
    for item in json.loads(raw).get("items", []):
        for addr in item.get("status", {}).get("addresses", []):
            if addr.get("address") == address:
                return str(item["metadata"]["name"])
    return host if host in cluster.nodes else host.lower()


def check_one_host(inventory: str | Path, host: str) -> bool:
    """Whether ``host`` is a control plane (not the first); refuse unknown hosts and the first
    control plane, which speaks for the cluster."""
    from gpuk8s.inventory import load_inventory

    inv = load_inventory(inventory)
    if host not in inv.hosts:
        raise InventoryError(f"unknown host {host!r}", path=str(inv.path),
                             fix=f"known hosts: {', '.join(inv.hosts)}")
    if host == inv.control_planes[0].name:
        raise InventoryError(
            f"{host} is the first control plane (the one that ran kubeadm init and speaks for "
            "the cluster); this command works on workers and the other control planes",
            path=str(inv.path), fix="use `invoke reset` for the whole cluster, or list another "
            f"control plane first under control_plane and bootstrap before touching {host}")
    return inv.hosts[host].is_control_plane


def ask_confirmation(question: str, yes: bool, confirm: Callable[[str], bool] | None,
                     expected: str | None = None) -> None:
    """Go on with --yes or a confirmed ``question`` (runner.confirmed); else stop, an error."""
    if not yes and not confirmed(question, confirm, expected):
        raise Gpuk8sError("aborted: nothing was changed")


def chunks(hosts: Sequence[str], serial: int) -> list[list[str]]:
    """``hosts`` in batches of ``serial`` (at least 1)."""
    step = max(1, serial)
    return [list(hosts[i:i + step]) for i in range(0, len(hosts), step)]


def run_batches(todo: Sequence[str], batches: Sequence[Sequence[str]],
                one_batch: Callable[[Sequence[str]], Reporter], *, to: str,
                left: str) -> list[str]:
    """Upgrade batch after batch (``one_batch`` returns the reporter it used). The first
    failure stops the run with one error naming what was upgraded, what was not touched, and
    the state the failed batch is ``left`` in. Returns the upgraded hosts, in order."""
    done: list[str] = []
    for batch in batches:
        try:
            rep = one_batch(batch)
        except Gpuk8sError as exc:
            remaining = [h for h in todo if h not in done and h not in batch]
            raise Gpuk8sError(
                f"upgrade stopped at {', '.join(batch)}: {exc}\n  upgraded: "
                f"{', '.join(done) or 'none'}; untouched: {', '.join(remaining) or 'none'}"
                f"; {', '.join(batch)} {left}") from None
        done += batch
        rep.print(f"  upgraded {', '.join(batch)} to {to}")
    return done
