"""The storage workload's NFS export (server on the first control plane, clients on the
nodes)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from gpuk8s.ops import Op, q
from gpuk8s.parallel import in_parallel
from gpuk8s.session import Session
from gpuk8s.transport import CommandResult
from gpuk8s.workloads.cluster import Remote
from gpuk8s.workloads.values import NFS_ANON_ID, RULES, WorkloadError, export_clients_problem


# -- storage (NFS) ------------------------------------------------------------------------------
def export_line(values: Mapping[str, Any], node_addresses: Sequence[str] = ()) -> str:
    """The /etc/exports.d line: nfs.path to nfs.exportClients, or, when that is "" (the
    default), to each cluster node's address, every client with nfs.exportOptions."""
    nfs = values["nfs"]
    for key in ("path", "exportClients", "exportOptions"):
        problem = RULES[f"nfs.{key}"](nfs[key])
        if problem:
            raise WorkloadError(f"nfs.{key} {nfs[key]!r} is refused: {problem}")
    if nfs["path"] == "/":
        raise WorkloadError("nfs.path '/' is refused for gpuk8s' own export (it would share "
                            "the control plane's whole file system); use a folder of its own, "
                            "e.g. --set nfs.path=/srv/gpuk8s")
    clients = re.split(r"[\s,]+", nfs["exportClients"].strip())
    if not nfs["exportClients"].strip():
        clients = list(dict.fromkeys(node_addresses))
        for address in clients:
            if export_clients_problem(address):
                raise WorkloadError(
                    f"the NFS export goes to the cluster nodes' addresses by default, but "
                    f"{address!r} (an inventory address) cannot be an /etc/exports client; "
                    "name the clients yourself, e.g. --set nfs.exportClients=10.88.0.0/24")
        if not clients:
            raise WorkloadError("no node addresses to export the NFS volume to; name the "
                                "clients, e.g. --set nfs.exportClients=10.88.0.0/24")
    return " ".join([nfs["path"], *(f"{c}({nfs['exportOptions']})" for c in clients)])


def _anon_ids(options: str) -> tuple[int, int]:
    found = dict(o.partition("=")[::2] for o in options.split(","))
    return (int(found.get("anonuid") or NFS_ANON_ID), int(found.get("anongid") or NFS_ANON_ID))


def nfs_server_script(values: Mapping[str, Any], node_addresses: Sequence[str] = ()) -> str:
    """Idempotent: nfs-kernel-server installed, the export folder and /etc/exports.d entry
    present, exportfs applied. Exit 3 with a message when the kernel has no NFS server.

    ``node_addresses``: the export's clients when nfs.exportClients is "" (the default)."""
    nfs = values["nfs"]
    line = export_line(values, node_addresses)
    path = q(nfs["path"])
    dirs = " ".join(f"{path}/{d}" for d in ("data", "checkpoints", "logs"))
    # Who writes: the TensorFlow and Jupyter images run as root (uid 0), and with root_squash
    # (the default) nfsd maps a pod's root to anonuid:anongid (65534 = nobody:nogroup unless
    # nfs.exportOptions says otherwise). So the three folders belong to that uid:gid, mode
    # 2770 (setgid: new entries keep the group): the pods' squashed root can write there,
    # other users on the server cannot read or write, and nobody on a client is root on the
    # share. A pod running as another uid needs that gid as a supplemental group. The export's
    # top folder stays root's. (The lab mounts no NFS; its nodes' kernel has no nfsd.)
    uid, gid = _anon_ids(nfs["exportOptions"])
    missing = q(f"{nfs['path']} not in exportfs -v")
    return f"""set -e
if ! grep -qw nfsd /proc/filesystems && ! modprobe nfsd 2>/dev/null; then
  echo "gpuk8s: this host's kernel has no NFS server (nfsd is neither in /proc/filesystems nor \
loadable); name an existing NFS server with --set nfs.server=ADDRESS --set nfs.path=EXPORT"
  exit 3
fi
if ! dpkg-query -W -f '${{Status}}' nfs-kernel-server 2>/dev/null | grep -q 'ok installed'; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nfs-kernel-server
  echo "changed: installed nfs-kernel-server"
fi
mkdir -p {dirs}
for d in {dirs}; do
  if [ "$(stat -c %u:%g:%a "$d")" != "{uid}:{gid}:2770" ]; then
    chown {uid}:{gid} "$d" && chmod 2770 "$d"
    echo "changed: $d owned by {uid}:{gid}, mode 2770"
  fi
done
mkdir -p /etc/exports.d
want={q(line)}
if [ "$(cat /etc/exports.d/gpuk8s.exports 2>/dev/null)" != "$want" ]; then
  printf '%s\\n' "$want" > /etc/exports.d/gpuk8s.exports
  echo "changed: /etc/exports.d/gpuk8s.exports"
fi
systemctl enable --now nfs-server >/dev/null 2>&1 || systemctl enable --now nfs-kernel-server
exportfs -ra
exportfs -v | awk '{{print $1}}' | grep -qxF -- {path} || {{ echo {missing}; exit 4; }}
"""


NFS_CLIENT_SCRIPT = """set -e
if ! dpkg-query -W -f '${Status}' nfs-common 2>/dev/null | grep -q 'ok installed'; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nfs-common
  echo "changed: installed nfs-common"
fi
command -v mount.nfs >/dev/null
"""


def _setup_nfs(session: Session, values: Mapping[str, Any]) -> str:
    """Export from the first control plane, clients everywhere; return the server address."""
    cp = session.first_cp
    rep = session.reporter
    nodes = [session.host(h).address for h in dict.fromkeys([cp, *session.scope])]
    result = Remote(session).run(nfs_server_script(values, nodes), timeout=600,
                                 what="nfs export")
    if not result.ok:
        raise WorkloadError(f"{cp}: NFS export failed (exit {result.exit_code}):\n"
                            + session.redact(result.stdout.strip()[-800:]))
    changes = [ln for ln in result.stdout.splitlines() if ln.startswith("changed:")]
    rep.print(f"  {cp}: NFS export {values['nfs']['path']} "
              + (", ".join(c[9:] for c in changes) if changes else "already in place"))
    if values["nfs"]["installClients"]:
        hosts = [h for h in session.scope if h in session.transports]

        def one(host: str) -> CommandResult:
            op = Op("storage | nfs client", (NFS_CLIENT_SCRIPT,), "+ nfs-common", timeout=600)
            rc, out = session.runner(host).run_now([op], keep_going=True)[0]
            return CommandResult(rc, out)

        failed = []
        for host, res in in_parallel(hosts, one).items():
            if not isinstance(res, CommandResult) or not res.ok:
                failed.append(f"{host}: {getattr(res, 'stdout', res)!s}"[-300:])
        if failed:
            raise WorkloadError("NFS client (nfs-common) install failed:\n  "
                                + "\n  ".join(session.redact(f) for f in failed))
        rep.print(f"  nfs-common on {len(hosts)} node(s)")
    return session.host(cp).address
