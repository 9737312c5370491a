"""JupyterHub for the lab's users (``invoke deploy jupyterhub``): what the hub's manifest needs
beyond its values, computed from the inventory and the cluster.

- who: the inventory's ``lab_users`` (their namespaces made by bootstrap's tenancy phase) and
  admins, signed in by NativeAuthenticator;
- profiles: from what the nodes really offer (CPU only; 1..maxGpus whole GPUs; each MIG
  profile; a time-sliced share), GPU servers stopping themselves after ``gpuIdleTimeout``;
- HTTPS: a certificate for the proxy signed by the cluster CA on the control plane (renewed
  when its names change or it nears its end), or the admin's own Secret;
- the proxy's token: made on the control plane, never on this machine or a command line;
- objects outside the hub's namespace: the spawner ClusterRole and a RoleBinding to it in each
  user's namespace (the hub can run pods there and nowhere else), the home volumes (NFS, one
  per user, pre-bound to KubeSpawner's ``claim-<user>``) and the hub database's volume.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuk8s.inventory.model import Inventory
from gpuk8s.ops import Op, q
from gpuk8s.session import Session
from gpuk8s.sinks import shell
from gpuk8s.tenancy import admins as tenancy_admins
from gpuk8s.workloads.cluster import KUBECTL, NS_KINDS, Remote
from gpuk8s.workloads.rendering import stamp
from gpuk8s.workloads.values import WorkloadError, workloads_dir

NAME = "jupyterhub"
SPAWNER_ROLE = "gpuk8s-jupyterhub-spawner"
BINDING = "gpuk8s-jupyterhub"
HUB_SECRET = "hub"
TOKEN_KEY = "hub.config.ConfigurableHTTPProxy.auth_token"
TLS_SECRET = "proxy-public-tls"
HUB_DB_VOLUME = "jupyterhub-hub-db"
HOME_LABEL = "gpuk8s.io/jupyterhub-home"
#: the notebook image's user (docker-stacks: jovyan 1000, group users 100) and the hub's
NB_UID, NB_GID, HUB_UID = 1000, 100, 1000
CA = "/etc/kubernetes/pki"
#: renew the proxy's certificate when it has less than this left (seconds: 30 days)
RENEW_BEFORE = 30 * 24 * 3600
CERT_DAYS = 365
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]"
                   r"{0,61}[A-Za-z0-9])?)*")
_MIG = re.compile(r"nvidia\.com/mig-(\d+g\.\d+gb)")


def nfs_homes(values: Mapping[str, Any]) -> bool:
    """Whether the homes and the hub's database are gpuk8s's NFS volumes (not a class's)."""
    return bool(values["homes"]["enabled"]) and not values["homes"]["storageClassName"]


def home_volume(user: str) -> str:
    return f"jupyterhub-home-{user}"


def claim(user: str) -> str:
    """KubeSpawner's claim for the user's default server (pvc_name_template claim-{username})."""
    return f"claim-{user}"


# -- who ----------------------------------------------------------------------------------------
def people(session: Session) -> tuple[list[str], list[str]]:
    """The inventory's lab users and admins; a clear error when there are none."""
    users = session.host(session.first_cp).vars.get("lab_users") or {}
    if not users:
        raise WorkloadError(
            "jupyterhub signs in the inventory's lab_users, and it names none: add them (e.g. "
            "lab_users: {alice: {gpu_quota: 1, admin: true}, bob: {gpu_quota: 1}}), run invoke "
            "bootstrap (it makes each user's namespace and GPU quota), then deploy again")
    return sorted(users), tenancy_admins(users)


# -- profiles -----------------------------------------------------------------------------------
def gpu_offer(nodes: Mapping[str, Any]) -> dict[str, int]:
    """For each GPU resource (nvidia.com/...), the most one schedulable node has allocatable."""
    offer: dict[str, int] = {}
    for node in nodes.get("items") or []:
        if (node.get("spec") or {}).get("unschedulable"):
            continue
        for res, qty in ((node.get("status") or {}).get("allocatable") or {}).items():
            if res.startswith("nvidia.com/") and str(qty).isdigit() and int(qty) > 0:
                offer[res] = max(offer.get(res, 0), int(qty))
    return offer


def _idle_args(values: Mapping[str, Any]) -> list[str]:
    """jupyter_server's own idle shutdown (serverapp.py@v2.20.0 shutdown_no_activity_timeout:
    checked every 60 s, only with no kernel left; idle kernels culled by the kernel manager)."""
    t = int(values["gpuIdleTimeout"])
    if t <= 0:
        return []
    return [f"--ServerApp.shutdown_no_activity_timeout={t}",
            f"--MappingKernelManager.cull_idle_timeout={t}",
            f"--MappingKernelManager.cull_interval={max(10, min(60, t))}"]


def _gpu_profile(values: Mapping[str, Any], slug: str, name: str, description: str,
                 resource: str, count: int) -> dict[str, Any]:
    return {"display_name": name, "slug": slug, "description": description,
            "kubespawner_override": {
                "extra_resource_limits": {resource: str(count)},
                "extra_pod_config": {"runtimeClassName": values["runtimeClassName"]},
                "tolerations": list(values["tolerations"]),
                # the device plugin's NVIDIA_VISIBLE_DEVICES names the server's GPUs
                "environment": {},
                "args": _idle_args(values)}}


def profiles(values: Mapping[str, Any], offer: Mapping[str, int]) -> list[dict[str, Any]]:
    """KubeSpawner's profile_list for what the cluster offers (CPU only is the default)."""
    out: list[dict[str, Any]] = [{
        "display_name": "CPU only", "slug": "cpu", "default": True,
        "description": f"{values['cpu']} CPU, {values['memory']} memory, no GPU"}]
    whole = min(int(values["maxGpus"]), offer.get("nvidia.com/gpu", 0))
    for n in range(1, whole + 1):
        out.append(_gpu_profile(values, f"gpu-{n}", f"{n} GPU" + ("s" if n > 1 else ""),
                                f"{n} whole GPU{'s' if n > 1 else ''} (nvidia.com/gpu), counted "
                                "against your GPU quota", "nvidia.com/gpu", n))
    for res in sorted(offer):
        m = _MIG.fullmatch(res)
        if m:
            out.append(_gpu_profile(values, f"mig-{m.group(1).replace('.', '-')}",
                                    f"MIG {m.group(1)}", f"one MIG slice {m.group(1)} of a GPU "
                                    f"({res})", res, 1))
    if offer.get("nvidia.com/gpu.shared"):
        out.append(_gpu_profile(values, "gpu-shared", "Shared GPU (time-sliced)",
                                "a time-sliced share of a GPU (nvidia.com/gpu.shared): no "
                                "memory isolation from the other sharers", "nvidia.com/gpu.shared",
                                1))
    return out


def settings(values: Mapping[str, Any], users: Sequence[str], admins: Sequence[str],
             offer: Mapping[str, int]) -> dict[str, Any]:
    """gpuk8s.json: everything jupyterhub_config.py reads (data, never code)."""
    homes = values["homes"]
    return {"users": list(users), "admins": list(admins),
            "image": values["images"]["notebook"], "imagePullPolicy": values["imagePullPolicy"],
            "cpu": _cpus(str(values["cpu"])),
            "memory": _bytes(str(values["memory"])), "startTimeout": int(values["startTimeout"]),
            "serversPerUser": int(values["serversPerUser"]),
            "profiles": profiles(values, offer), "nodeSelector": dict(values["nodeSelector"]),
            "idleTimeout": int(values["idleTimeout"]), "cullEvery": int(values["cullEvery"]),
            "homes": {"enabled": bool(homes["enabled"]),
                      "storageClassName": homes["storageClassName"],
                      "accessMode": homes["accessMode"], "size": homes["size"]}}


def _cpus(text: str) -> float:
    """A CPU quantity (2, 0.5, 500m) as KubeSpawner's cpu_guarantee takes it."""
    try:
        return float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    except ValueError:
        raise WorkloadError(f"cpu {text!r} is not a CPU quantity: write e.g. 1, 0.5 or 500m"
                            ) from None


_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}


def _bytes(text: str) -> int:
    """A memory quantity (4Gi, 512M, 1000000) in bytes: JupyterHub's memory traits take
    K/M/G/T suffixes only (jupyterhub/traitlets.py ByteSpecification), so it gets the number."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kMGTP]i?)?", text.strip())
    if not m or (m.group(2) or "") not in _UNITS:
        raise WorkloadError(f"memory {text!r} is not a memory quantity: write e.g. 4Gi or 512Mi")
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])


def config_py() -> str:
    return (workloads_dir() / NAME / "jupyterhub_config.py").read_text()


# -- HTTPS ----------------------------------------------------------------------------------------
def subject_alt_names(values: Mapping[str, Any], addresses: Sequence[str]) -> list[str]:
    """The proxy certificate's names: the Service's in-cluster names, every node address
    (proxy-public is a NodePort) and https.hosts, each checked."""
    ns = values["namespace"]
    names = ["proxy-public", f"proxy-public.{ns}.svc", f"proxy-public.{ns}.svc.cluster.local"]
    out = [f"DNS:{n}" for n in names]
    for host in [*addresses, *values["https"]["hosts"]]:
        host = str(host)
        try:
            out.append(f"IP:{ipaddress.ip_address(host)}")
            continue
        except ValueError:
            pass
        if len(host) > 253 or not _HOST.fullmatch(host):
            raise WorkloadError(f"https.hosts: {host!r} is neither an IP address nor a host "
                                "name; give names like hub.lab.example or addresses like "
                                "10.0.0.5")
        out.append(f"DNS:{host.lower()}")
    return list(dict.fromkeys(out))


#: a Secret made on the control plane (client-side, in $d/1.json: the key or token never on a
#: command line) labelled as the hub's and applied server-side (no last-applied annotation,
#: which would copy its data)
_LABEL_AND_APPLY = (f'$k label --local -f "$d/1.json" -o json app.kubernetes.io/managed-by=gpuk8s '
                    f'gpuk8s.io/workload={NAME} > "$d/2.json"\n'
                    '$k apply --server-side --force-conflicts --field-manager=gpuk8s '
                    '-f "$d/2.json" >/dev/null')


def tls_script(namespace: str, sans: Sequence[str]) -> str:
    """On the first control plane: Secret proxy-public-tls, a key made there and a certificate
    signed by the cluster CA for ``sans``; left alone while its names match and it has more
    than RENEW_BEFORE left. Prints "changed: ..." when it made one."""
    ns, want = shell(namespace), ",".join(sans)
    get = f"$k -n {ns} get secret {TLS_SECRET}"
    return f"""set -e
k="{KUBECTL}"
want={q(want)}
have=$({get} -o jsonpath='{{.metadata.annotations.gpuk8s\\.io/sans}}' 2>/dev/null || true)
if [ "$have" = "$want" ] && {get} -o jsonpath='{{.data.tls\\.crt}}' | base64 -d \\
    | openssl x509 -noout -checkend {RENEW_BEFORE} >/dev/null 2>&1; then
  exit 0
fi
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
umask 077
openssl req -new -newkey rsa:2048 -nodes -keyout "$d/tls.key" -subj /CN=proxy-public \\
  -out "$d/req.csr" 2>/dev/null
printf 'subjectAltName=%s\\nextendedKeyUsage=serverAuth\\nkeyUsage=digitalSignature,\
keyEncipherment\\n' "$want" > "$d/ext"
openssl x509 -req -in "$d/req.csr" -CA {CA}/ca.crt -CAkey {CA}/ca.key \\
  -set_serial "0x$(openssl rand -hex 16)" -days {CERT_DAYS} -extfile "$d/ext" \\
  -out "$d/tls.crt" 2>/dev/null
cat {CA}/ca.crt >> "$d/tls.crt"
$k -n {ns} create secret tls {TLS_SECRET} --cert="$d/tls.crt" --key="$d/tls.key" \\
  --dry-run=client -o json > "$d/0.json"
$k annotate --local -f "$d/0.json" -o json "gpuk8s.io/sans=$want" > "$d/1.json"
{_LABEL_AND_APPLY}
echo "changed: certificate for $want"
"""


def hub_secret_script(namespace: str) -> str:
    """On the first control plane: Secret hub with the proxy's API token, made there once
    (from a 0600 file: never on a command line) and kept."""
    ns = shell(namespace)
    return f"""set -e
k="{KUBECTL}"
if $k -n {ns} get secret {HUB_SECRET} -o name >/dev/null 2>&1; then exit 0; fi
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
umask 077
openssl rand -hex 32 | tr -d '\\n' > "$d/{TOKEN_KEY}"
$k -n {ns} create secret generic {HUB_SECRET} --from-file="$d/{TOKEN_KEY}" \\
  --dry-run=client -o json > "$d/1.json"
{_LABEL_AND_APPLY}
echo "changed: the proxy's token"
"""


# -- objects outside the hub's namespace ----------------------------------------------------------
def nfs_volume(name: str, values: Mapping[str, Any], server: str, path: str, size: str,
               claim_ns: str, claim_name: str, access: str) -> dict[str, Any]:
    nfs = values["homes"]["nfs"]
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": size}, "accessModes": [access],
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                     "mountOptions": list(nfs["mountOptions"]),
                     "nfs": {"server": server, "path": path},
                     "claimRef": {"namespace": claim_ns, "name": claim_name}}}


def outside_objects(values: Mapping[str, Any], users: Sequence[str], nfs_server: str
                    ) -> list[dict[str, Any]]:
    """The spawner ClusterRole, each user's RoleBinding to it, and the NFS volumes."""
    ns, homes = values["namespace"], values["homes"]
    rbac = "rbac.authorization.k8s.io"
    docs: list[dict[str, Any]] = [{
        "apiVersion": f"{rbac}/v1", "kind": "ClusterRole", "metadata": {"name": SPAWNER_ROLE},
        # what KubeSpawner 7.0.0 calls in a user's namespace (its pods and claims; the events
        # and pods reflectors list and watch there), as z2jh's hub Role (rbac.yaml@4.4.0)
        "rules": [{"apiGroups": [""], "resources": ["pods", "persistentvolumeclaims"],
                   "verbs": ["get", "watch", "list", "create", "delete"]},
                  {"apiGroups": [""], "resources": ["events"],
                   "verbs": ["get", "watch", "list"]}]}]
    for user in users:
        docs.append({
            "apiVersion": f"{rbac}/v1", "kind": "RoleBinding",
            "metadata": {"name": BINDING, "namespace": user},
            "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": SPAWNER_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": "hub", "namespace": ns}]})
    if nfs_homes(values):
        path = homes["nfs"]["path"].rstrip("/")
        docs.append(nfs_volume(HUB_DB_VOLUME, values, nfs_server, f"{path}/jupyterhub", "1Gi",
                               ns, "hub-db", "ReadWriteOnce"))
        for user in users:
            pv = nfs_volume(home_volume(user), values, nfs_server, f"{path}/homes/{user}",
                            homes["size"], user, claim(user), homes["accessMode"])
            pv["metadata"]["labels"] = {HOME_LABEL: user}
            docs.append(pv)
    return [stamp(d, NAME) for d in docs]


def check_outside(docs: Sequence[Mapping[str, Any]], namespace: str,
                  users: Sequence[str]) -> None:
    """Refuse anything but the objects outside_objects makes (applied as cluster-admin)."""
    allowed: set[tuple[str, str | None, str]] = {
        ("ClusterRole", None, SPAWNER_ROLE), ("PersistentVolume", None, HUB_DB_VOLUME)}
    allowed |= {("RoleBinding", u, BINDING) for u in users}
    allowed |= {("PersistentVolume", None, home_volume(u)) for u in users}
    for doc in docs:
        md = doc.get("metadata") or {}
        key = (doc.get("kind"), md.get("namespace"), md.get("name"))
        if key not in allowed:
            raise WorkloadError(f"jupyterhub: refused to apply {key[0]}/{key[2]} "
                                f"(namespace {key[1]}): not one of the hub's own objects")
        ref = (doc.get("spec") or {}).get("claimRef") or {}
        if ref and ref.get("namespace") not in (namespace, *users):
            raise WorkloadError(f"jupyterhub: refused to apply {key[0]}/{key[2]}: its claim "
                                f"is in namespace {ref.get('namespace')!r}")


def folders_script(path: str, users: Sequence[str]) -> str:
    """On the first control plane (its NFS export): the hub's folder and each user's home,
    made when missing, owned by the user the pods run as; existing ones are left alone."""
    p = path.rstrip("/")
    lines = ["set -e",
             f"[ -d {q(p)} ] || {{ echo {q(f'no folder {p}: deploy storage first (it exports it)')}"
             "; exit 3; }",
             f"[ -d {q(p + '/jupyterhub')} ] || {{ install -d -o {HUB_UID} -g {HUB_UID} -m 0700 "
             f"{q(p + '/jupyterhub')}; echo 'changed: hub folder'; }}",
             f"[ -d {q(p + '/homes')} ] || install -d -m 0755 {q(p + '/homes')}"]
    for user in users:
        home = q(f"{p}/homes/{user}")
        lines.append(f"[ -d {home} ] || {{ install -d -o {NB_UID} -g {NB_GID} -m 0700 {home}; "
                     f"echo {q(f'changed: home of {user}')}; }}")
    return "\n".join(lines) + "\n"


def on_control_plane(session: Session, remote: Remote, what: str, script: str, *,
                     secret: bool = False, timeout: int = 120) -> None:
    """One of the hub's scripts on the first control plane; its "changed: ..." lines printed,
    a failure raised with the end of its (redacted) output. ``secret``: the output is never
    logged (the scripts that handle the proxy's token and the certificate's key)."""
    op = Op(f"jupyterhub | {what}", (script,), f"+ {what}", timeout=timeout, secret=secret)
    rc, out = session.runner(remote.host).run_now([op], keep_going=True)[0]
    if rc != 0:
        raise WorkloadError(f"{remote.host}: jupyterhub {what} failed (exit {rc}): "
                            + session.redact(out.strip()[-500:]))
    for line in out.splitlines():
        if line.startswith("changed: "):
            session.reporter.print(f"  {remote.host}: {line[9:]}")


# -- deploy ---------------------------------------------------------------------------------------
@dataclass
class Prepared:
    """What deploy renders the hub with, and the objects it applies beside it."""

    context: dict[str, Any]
    outside: list[dict[str, Any]] = field(default_factory=list)
    users: list[str] = field(default_factory=list)
    url: str = ""


def prepare(session: Session, remote: Remote, values: Mapping[str, Any]) -> Prepared:
    """Read the users, the nodes' offer and the tenants' namespaces; make the proxy's token, its
    certificate and the NFS folders on the control plane; return the render context."""
    rep, ns = session.reporter, values["namespace"]
    users, admins = people(session)
    res = remote.probe({"nodes": "$k get nodes -o json",
                        "namespaces": "$k get namespaces -o name"})
    rc, out = res["nodes"]
    if rc != 0:
        raise WorkloadError(f"cannot list the nodes: {session.redact(out.strip()[-300:])}")
    offer = gpu_offer(json.loads(out[out.find("{"):]))
    have = {ln.removeprefix("namespace/") for ln in res["namespaces"][1].split()}
    missing = [u for u in users if u not in have]
    if missing:
        raise WorkloadError(
            f"no namespace for lab user(s) {', '.join(missing)}: run invoke bootstrap (its "
            "tenancy phase makes each user's namespace and quota), then deploy jupyterhub again")
    addresses = [h.address for h in session.inventory.hosts.values()]
    remote.apply([{"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": ns, "labels": {"app.kubernetes.io/managed-by": "gpuk8s"}}}])
    scripts = [("proxy token", hub_secret_script(ns))]
    if not values["https"]["secret"]:
        scripts.append(("certificate", tls_script(ns, subject_alt_names(values, addresses))))
    homes = values["homes"]
    server = homes["nfs"]["server"]
    if nfs_homes(values) and not server:
        server = session.host(session.first_cp).address
        scripts.append(("home folders", folders_script(homes["nfs"]["path"], users)))
    for what, script in scripts:
        on_control_plane(session, remote, what, script, secret=True)
    if nfs_homes(values) and homes["nfs"]["server"]:
        rep.print(f"  homes on {server}:{homes['nfs']['path']}/homes/<user> (that server's "
                  f"admin makes them, owned {NB_UID}:{NB_GID}, mode 0700)", style="dim")
    first = session.host(session.first_cp).address
    return _prepared(values, users, admins, offer, server,
                     f"https://{first}:{values['https']['nodePort']}/hub/")


def offline(values: Mapping[str, Any], inventory: Inventory) -> Prepared:
    """The render context from the inventory alone (deploy --render: no host contacted, so no
    node offer: the CPU profile only)."""
    cp = inventory.control_planes[0] if inventory.control_planes else None
    lab_users = (cp.vars.get("lab_users") if cp else None) or {}
    server = values["homes"]["nfs"]["server"] or (cp.address if cp else "CONTROL_PLANE")
    return _prepared(values, sorted(lab_users), tenancy_admins(lab_users), {}, server)


def _prepared(values: Mapping[str, Any], users: Sequence[str], admins: Sequence[str],
              offer: Mapping[str, int], server: str, url: str = "") -> Prepared:
    """The render context (gpuk8s.json and the fixed config, with the digest that restarts the
    hub when either changes) and the checked objects outside the hub's namespace."""
    hub_settings = json.dumps(settings(values, users, admins, offer), indent=1, sort_keys=True)
    py = config_py()
    outside = outside_objects(values, users, server)
    check_outside(outside, values["namespace"], users)
    return Prepared({"hub_config_py": py, "hub_settings": hub_settings,
                     "hub_config_digest": hashlib.sha256((py + hub_settings).encode())
                     .hexdigest()[:16], "tls_secret": values["https"]["secret"] or TLS_SECRET,
                     "hub_db_volume": HUB_DB_VOLUME}, outside, list(users), url)


def print_access(session: Session, values: Mapping[str, Any], prepared: Prepared) -> None:
    rep = session.reporter
    rep.print(f"  JupyterHub: {prepared.url}")
    rep.print(f"  users sign up once at {prepared.url}signup with a password of their own: "
              + ", ".join(prepared.users))
    if not values["https"]["secret"]:
        rep.print(f"  its certificate is signed by the cluster CA ({CA}/ca.crt on the control "
                  "plane): trust that CA in your browser", style="dim")


def undeploy_script(namespace: str, purge: bool, wait_s: int) -> str:
    """Stop every server (their pods in the users' namespaces), delete the hub's objects; with
    ``purge`` also the users' claims and every volume (the NFS folders are separate)."""
    sel, ns = shell(f"gpuk8s.io/workload={NAME}"), shell(namespace)
    # every namespaced kind workloads make; the hub's database claim only with purge
    kinds = ",".join(k for k in NS_KINDS.split(",")
                     if purge or k != "persistentvolumeclaims")
    lines = [f'k="{KUBECTL}"',
             f"$k delete pods -A -l {sel} --ignore-not-found --wait=false",
             f"$k delete {kinds} -n {ns} -l {sel} --ignore-not-found --wait=false",
             f"$k delete rolebindings -A -l {sel} --ignore-not-found",
             f"$k delete clusterroles -l {sel} --ignore-not-found"]
    if purge:
        lines += [f"$k delete persistentvolumeclaims -A -l {sel} --ignore-not-found --wait=false",
                  f"$k delete persistentvolumes -l {sel} --ignore-not-found --wait=false"]
    left = f"$k get pods -A -l {sel} -o name 2>/dev/null; " \
        f"$k get {kinds} -n {ns} -l {sel} -o name 2>/dev/null"
    if purge:
        left += f"; $k get persistentvolumeclaims -A -l {sel} -o name 2>/dev/null"
    lines += [f"i=0; while [ $i -lt {wait_s} ]; do",
              f'  left=$({left})',
              '  [ -z "$left" ] && exit 0; sleep 1; i=$((i+1)); done',
              f'echo "still present after {wait_s}s: $left"; exit 1']
    return "\n".join(lines) + "\n"


def purge_folders_script(path: str) -> str:
    p = path.rstrip("/")
    return (f"set -e\nfor d in {q(p + '/homes')} {q(p + '/jupyterhub')}; do\n"
            '  [ -e "$d" ] || continue\n  rm -rf -- "$d"\n  echo "changed: removed $d"\ndone\n')


def undeploy(session: Session, remote: Remote, values: Mapping[str, Any], *, purge: bool,
             timeout: int) -> int:
    """Remove the hub, its servers and RBAC; keep the homes and the hub's database (its users'
    passwords) unless ``purge``. The number of objects deleted."""
    rep, ns = session.reporter, values["namespace"]
    res = remote.run(undeploy_script(ns, purge, timeout), timeout=timeout + 120)
    for line in res.stdout.splitlines():
        rep.print(f"  {line}", style="dim")
    if not res.ok:
        raise WorkloadError("undeploy jupyterhub failed: "
                            + session.redact(res.stdout.strip()[-500:]))
    homes = values["homes"]
    if not purge:
        rep.print("  kept: the users' homes and the hub's database (their sign-ups); "
                  "undeploy jupyterhub --purge removes them")
    elif nfs_homes(values) and not homes["nfs"]["server"]:
        on_control_plane(session, remote, "purge folders",
                         purge_folders_script(homes["nfs"]["path"]), timeout=600)
    elif nfs_homes(values):
        rep.print(f"  the folders on {homes['nfs']['server']} stay ({homes['nfs']['path']}/"
                  "homes and .../jupyterhub): gpuk8s does not manage that server; remove "
                  "them there")
    return sum(1 for ln in res.stdout.splitlines() if ln.rstrip().endswith("deleted"))
