"""`invoke user-kubeconfig NAME`: credentials for one of the lab's users (lab_users), made on
the first control plane the way kubeadm documents for additional users: `kubeadm kubeconfig
user --client-name NAME --validity-period D --config <gpuk8s's kubeadm config>`, a client
certificate signed by the cluster CA whose CN is the user name and which carries no group
(cmd/kubeadm/app/cmd/kubeconfig.go@v1.36.0: --config and --client-name required,
--validity-period a Go duration, a warning past kubeadm's one-year certificate validity).

What the user may do is the tenancy role's RoleBindings: edit in their namespace and their
groups' namespaces, nothing cluster-wide. The certificate cannot be revoked (Kubernetes has no
certificate revocation), which is why it is short-lived by default: remove the user from
lab_users and bootstrap takes their RoleBindings away; the certificate then authenticates a
user who may do nothing."""

from __future__ import annotations

import difflib
import re
from contextlib import closing
from pathlib import Path

from gpuk8s.checks import check_duration
from gpuk8s.cluster_values import inventory_cluster
from gpuk8s.errors import Gpuk8sError
from gpuk8s.handoffs import save_kubeconfig
from gpuk8s.ops import Op
from gpuk8s.ops.kube import KUBEADM_CONFIG
from gpuk8s.report import Reporter
from gpuk8s.session import DEFAULT_OPENER, Opener, open_session
from gpuk8s.sinks import shell

#: kubeadm's CertificateValidity (cmd/kubeadm/app/constants: 365 days): past it kubeadm warns
KUBEADM_CERT_HOURS = 8760
_UNITS = {"ns": 1e-9 / 3600, "us": 1e-6 / 3600, "µs": 1e-6 / 3600, "ms": 1e-3 / 3600,
          "s": 1 / 3600, "m": 1 / 60, "h": 1.0}


def hours(duration: str) -> float:
    """A Go duration ("24h", "1h30m", "720h") in hours."""
    return sum(float(n) * _UNITS[u] for n, u in
               re.findall(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)", duration))


def user_kubeconfig(inventory: str | Path, name: str, *, validity: str = "24h",
                    reporter: Reporter | None = None,
                    opener: Opener = DEFAULT_OPENER) -> Path:
    """Write <inventory dir>/artifacts/users/<name>.conf (0600): ``name``'s kubeconfig, its
    context in the user's own namespace, valid for ``validity``."""
    problem = check_duration("--validity", validity)
    if problem or hours(validity) <= 0:
        raise Gpuk8sError(f"--validity {validity!r} is not a duration: write it as kubeadm "
                          "takes it, e.g. 24h, 168h (a week) or 2160h (90 days)")
    from gpuk8s.inventory import load_inventory

    inv = load_inventory(inventory)
    cp = inv.control_planes[0]
    users = cp.vars.get("lab_users") or {}
    if name not in users:
        near = difflib.get_close_matches(name, list(users), n=1, cutoff=0.6)
        known = f" (did you mean {near[0]}?)" if near else \
            f"; lab_users names: {', '.join(sorted(users))}" if users else \
            "; lab_users is empty"
        raise Gpuk8sError(f"{name!r} is not in lab_users of {inventory}{known}. Add the user "
                          "there (lab_users: {" + name + ": {gpu_quota: 1}}), run invoke "
                          "bootstrap, then ask again")
    session = open_session(inventory, limit=cp.name, sets=(), command="user-kubeconfig",
                           reporter=reporter, opener=opener)
    with closing(session):
        session.cluster.update(inventory_cluster(session.inventory, session.first_cp))
        command = (f"kubeadm kubeconfig user --config {KUBEADM_CONFIG} "
                   f"--client-name {shell(name)} --validity-period {shell(validity)}")
        op = Op("tenancy | user kubeconfig", (command,),
                f"+ a kubeconfig for {name}, valid {validity}", timeout=60, secret=True)
        rc, data = session.runner(session.first_cp).run_now([op], keep_going=True)[0]
        if rc != 0:
            # no key was printed: kubeadm writes the kubeconfig only once it has signed it
            last = session.redact(data.strip()).splitlines()[-1:] or [f"exit {rc}"]
            raise Gpuk8sError(f"{session.first_cp}: kubeadm kubeconfig user failed: "
                              f"{last[0]}. Is the cluster bootstrapped (invoke bootstrap)?")
        dest = save_kubeconfig(session, data, f"users/{name}.conf",
                               "kubeadm kubeconfig user",
                               "kubeadm kubeconfig user printed something else",
                               namespace=name)
        warn = (f"\n  warning: {validity} is longer than kubeadm's one-year certificate "
                "validity; the certificate cannot be revoked before it ends"
                if hours(validity) > KUBEADM_CERT_HOURS else "")
        session.reporter.print(
            f"kubeconfig for {name}: {dest} (0600), valid {validity}, namespace {name}\n"
            f"  give it to {name} privately; it allows what edit allows in {name}'s "
            f"namespaces and nothing else (kubectl --kubeconfig {dest} auth can-i --list)"
            + warn)
        return dest
