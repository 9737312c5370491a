# LAB STAND-IN: not the real kubelet. Test infrastructure for gpuk8s; never shipped to users.
"""The kubelet's side of pods that run for real (podrun.py runs them): the volumes and the
environment resolved from the API (ConfigMaps, Secrets, claims, projected ServiceAccount
tokens, the Services' variables), the spec podrun reads, its transient unit, and the pod status
built from what podrun reports.

Upstream sources read (kubernetes, a recent release's copy in the code index: the v1.35.0 tag
itself could not be fetched here): pkg/volume/projected/projected.go (collectData, SetUpAt),
pkg/volume/volume_linux.go (the fsGroup ownership change), pkg/volume/util/atomic_writer.go
(FileProjection.FsUser), pkg/kubelet/token/token_manager.go (requiresRefresh),
pkg/kubelet/kubelet_pods.go (getServiceEnvVarMap, makeEnvironmentVariables) and
pkg/kubelet/envvars/envvars.go (FromServices, makeLinkVariables)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

from . import nodeinfo
from .client import ApiError, Client
from .common import NO_SYSTEMD_ENV, P, parse_quantity, read, run, write
from .podrun import CNI

Obj = dict[str, Any]
STATE_DIR = "/run/gpuk8s-lab/pods"
PODS_DIR = "/var/lib/kubelet/pods"
#: where the lab host's shared folder appears in every node: the lab's NFS export (this host
#: has neither nfsd nor an NFS client), one folder per server and path under it
LAB_NFS_ROOT = "/var/lib/gpuk8s-lab/nfs"


class VolumeError(Exception):
    pass


#: a projected token is written again once it is this old (token_manager.go requiresRefresh:
#: past 80% of its expirationSeconds, or 24 h, whichever comes first; no jitter here)
TOKEN_MAX_AGE = 24 * 3600.0


def token_request(client: Client, pod: Obj, seconds: int = 3607, audience: str = "") -> str:
    """A TokenRequest for the pod's ServiceAccount bound to the pod, with the kubelet's
    credentials (the node authorizer lets a node ask for its pods' ServiceAccounts), as the
    kubelet's token manager asks for one (projected.go: audiences [audience] when one is
    given, else the API server's; boundObjectRef the pod). ApiError when it is refused."""
    md = pod["metadata"]
    sa = pod["spec"].get("serviceAccountName") or "default"
    spec: Obj = {"expirationSeconds": seconds, "boundObjectRef": {
        "apiVersion": "v1", "kind": "Pod", "name": md["name"], "uid": md["uid"]}}
    if audience:
        spec["audiences"] = [audience]
    got = client.request("POST", f"/api/v1/namespaces/{md['namespace']}/serviceaccounts/{sa}/"
                         "token", {"apiVersion": "authentication.k8s.io/v1",
                                   "kind": "TokenRequest", "spec": spec})
    token = ((got or {}).get("status") or {}).get("token") if isinstance(got, dict) else None
    if not token:
        raise ApiError(500, {"message": "the TokenRequest answered no token"})
    return str(token)


def fs_user(pod: Obj) -> int | None:
    """pkg/volume/util FsUserFrom: the runAsUser every init container and container runs as
    (the container's, else the pod's), when they all have one and it is the same; else
    None."""
    pod_sc = pod["spec"].get("securityContext") or {}
    users = set()
    for group in ("initContainers", "containers"):
        for c in pod["spec"].get(group) or []:
            uid = (c.get("securityContext") or {}).get("runAsUser", pod_sc.get("runAsUser"))
            if uid is None:
                return None
            users.add(int(uid))
    return users.pop() if len(users) == 1 else None


def fs_group(pod: Obj) -> int | None:
    got = (pod["spec"].get("securityContext") or {}).get("fsGroup")
    return None if got is None else int(got)


def _own(path: str, group: int | None) -> None:
    """volume_linux.go changeFilePermission over a read-only volume (a projected volume's
    GetAttributes().ReadOnly): every file and folder gets group ``group``, files mode | 0440,
    folders mode | 0440 | 0110 | setgid; symbolic links keep theirs."""
    if group is None:
        return
    top = P(path)
    entries = [top]
    for folder, dirs, files in os.walk(top):
        entries += [os.path.join(folder, n) for n in dirs + files]
    for entry in entries:
        os.lchown(entry, -1, group)
        if os.path.islink(entry):
            continue
        mode = os.stat(entry).st_mode & 0o7777
        os.chmod(entry, mode | 0o440 | (0o2110 if os.path.isdir(entry) else 0))


def _write_file(path: str, data: bytes, mode: int, user: int | None) -> None:
    """One file of a projected volume (atomic_writer.go: its mode, and its owner FsUser when
    the projection names one)."""
    write(path, data, mode)
    if user is not None:
        os.chown(P(path), user, -1)


def service_env_vars(svc: Obj) -> list[tuple[str, str]]:
    """envvars.go FromServices for one Service with a cluster IP: <NAME>_SERVICE_HOST,
    <NAME>_SERVICE_PORT (the first port), <NAME>_SERVICE_PORT_<PORT NAME> for each named port,
    and the Docker link variables (makeLinkVariables: <NAME>_PORT for the first port,
    <NAME>_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR] for each). Names: upper case, '-' -> '_'
    (makeEnvVariableName)."""
    spec = svc.get("spec") or {}
    ip, ports = str(spec.get("clusterIP") or ""), spec.get("ports") or []
    if not ip or ip == "None" or not ports:
        return []
    prefix = svc["metadata"]["name"].replace("-", "_").upper()
    out = [(f"{prefix}_SERVICE_HOST", ip), (f"{prefix}_SERVICE_PORT", str(ports[0]["port"]))]
    out += [(f"{prefix}_SERVICE_PORT_{p['name'].replace('-', '_').upper()}", str(p["port"]))
            for p in ports if p.get("name")]
    host = f"[{ip}]" if ":" in ip else ip  # net.JoinHostPort
    for i, p in enumerate(ports):
        proto = str(p.get("protocol") or "TCP")
        url = f"{proto.lower()}://{host}:{p['port']}"
        if i == 0:
            out.append((f"{prefix}_PORT", url))
        pp = f"{prefix}_PORT_{p['port']}_{proto.upper()}"
        out += [(pp, url), (f"{pp}_PROTO", proto.lower()), (f"{pp}_PORT", str(p["port"])),
                (f"{pp}_ADDR", ip)]
    return out


def unit_name(uid: str) -> str:
    return f"gpuk8s-lab-pod-{uid}"


def state_dir(uid: str) -> str:
    return f"{STATE_DIR}/{uid}"


class Resolver:
    """Reads what a pod refers to (ConfigMaps, Secrets, claims) through the API."""

    def __init__(self, client: Client, pod: Obj) -> None:
        self.client = client
        self.pod = pod
        self.ns = pod["metadata"]["namespace"]
        self._service_env: dict[str, str] | None = None

    def _get(self, kind: str, name: str) -> Obj | None:
        try:
            return self.client.get(f"/api/v1/namespaces/{self.ns}/{kind}/{name}")
        except ApiError as e:
            if e.code == 404:
                return None
            raise

    def data(self, kind: str, name: str, optional: bool = False) -> dict[str, bytes] | None:
        obj = self._get(kind, name)
        if obj is None:
            if optional:
                return {}
            return None
        out = {k: str(v).encode() for k, v in (obj.get("stringData") or {}).items()}
        if kind == "secrets":
            out.update({k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()})
        else:
            out.update({k: str(v).encode() for k, v in (obj.get("data") or {}).items()})
        return out

    def service_env(self) -> dict[str, str]:
        """kubelet_pods.go getServiceEnvVarMap: the variables of the Service "kubernetes" in
        the default namespace always, and, unless the pod sets enableServiceLinks false, of
        every Service of its own namespace (a same-named one there over the master's); only
        Services with a cluster IP. Listed once per pod start (the kubelet's Service
        informer)."""
        if self._service_env is None:
            links = self.pod["spec"].get("enableServiceLinks") is not False
            chosen: dict[str, Obj] = {}
            for svc in self.client.get("/api/v1/services").get("items") or []:
                md = svc["metadata"]
                if md.get("namespace") == "default" and md["name"] == "kubernetes":
                    chosen.setdefault(md["name"], svc)
                elif md.get("namespace") == self.ns and links:
                    chosen[md["name"]] = svc
            self._service_env = {k: v for svc in chosen.values()
                                 for k, v in service_env_vars(svc)}
        return self._service_env

    def field(self, path: str, node_ip: str = "") -> str:
        """A fieldRef's value (the downward API, pkg/fieldpath ExtractFieldPathAsString:
        a whole labels/annotations map as sorted key="value" lines)."""
        md, spec = self.pod["metadata"], self.pod["spec"]
        m = re.fullmatch(r"metadata\.(annotations|labels)\['([^']+)'\]", path)
        if m:
            return str((md.get(m.group(1)) or {}).get(m.group(2), ""))
        if path in ("metadata.labels", "metadata.annotations"):
            got = md.get(path.split(".")[1]) or {}
            return "\n".join(f"{k}={json.dumps(str(got[k]))}" for k in sorted(got))
        fields = {"metadata.name": md["name"], "metadata.namespace": self.ns,
                  "metadata.uid": md["uid"], "spec.nodeName": spec.get("nodeName"),
                  "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
                  "status.hostIP": node_ip}
        return str(fields.get(path) or "")

    def env(self, c: Obj, node_ip: str) -> dict[str, str]:
        """The container's environment (kubelet_pods.go makeEnvironmentVariables): envFrom,
        then env (explicit values and valueFrom), then the Services' variables
        (service_env) it does not set itself. Not played: $(VAR) expansion."""
        out: dict[str, str] = {}
        for src in c.get("envFrom") or []:
            ref = src.get("configMapRef") or src.get("secretRef") or {}
            kind = "configmaps" if "configMapRef" in src else "secrets"
            got = self.data(kind, ref.get("name", ""), bool(ref.get("optional")))
            if got is None:
                raise VolumeError(f'{kind[:-1]} "{ref.get("name")}" not found')
            out.update({src.get("prefix", "") + k: v.decode() for k, v in got.items()})
        for e in c.get("env") or []:
            if "value" in e or "valueFrom" not in e:
                out[e["name"]] = str(e.get("value", ""))
                continue
            vf = e["valueFrom"]
            if "fieldRef" in vf:
                out[e["name"]] = self.field(str(vf["fieldRef"].get("fieldPath", "")), node_ip)
                continue
            ref = vf.get("secretKeyRef") or vf.get("configMapKeyRef") or {}
            kind = "secrets" if "secretKeyRef" in vf else "configmaps"
            got = self.data(kind, ref.get("name", ""), bool(ref.get("optional")))
            if got is None or (ref.get("key") not in got and not ref.get("optional")):
                what = "secret" if kind == "secrets" else "configmap"
                raise VolumeError(f'couldn\'t find key {ref.get("key")} in {what} '
                                  f'{self.ns}/{ref.get("name")}' if got is not None else
                                  f'{what} "{ref.get("name")}" not found')
            if ref.get("key") in got:
                out[e["name"]] = got[ref["key"]].decode()
        for k, v in self.service_env().items():
            out.setdefault(k, v)
        return out

    def volume(self, v: Obj, base: str) -> str:
        """Make volume ``v`` on the node; the node path to bind into the containers."""
        name = v["name"]
        for kind, plural, plugin in (("configMap", "configmaps", "configmap"),
                                     ("secret", "secrets", "secret")):
            if kind not in v:
                continue
            src = v[kind]
            ref = src.get("name") or src.get("secretName", "")
            got = self.data(plural, ref, bool(src.get("optional")))
            if got is None:
                raise VolumeError(f'MountVolume.SetUp failed for volume "{name}" : '
                                  f'{kind.lower()} "{ref}" not found')
            path = f"{base}/volumes/kubernetes.io~{plugin}/{name}"
            shutil.rmtree(P(path), ignore_errors=True)
            items = src.get("items") or [{"key": k, "path": k} for k in sorted(got)]
            mode = int(src.get("defaultMode", 0o644))
            for item in items:
                if item["key"] in got:
                    write(f"{path}/{item['path']}", got[item["key"]], int(item.get("mode",
                                                                                   mode)))
            os.makedirs(P(path), exist_ok=True)
            return path
        if "emptyDir" in v:
            path = f"{base}/volumes/kubernetes.io~empty-dir/{name}"
            os.makedirs(P(path), exist_ok=True)
            os.chmod(P(path), 0o777)  # as the kubelet's: any user of the pod may write
            return path
        if "hostPath" in v:
            path = v["hostPath"]["path"]
            kind = v["hostPath"].get("type", "")
            if kind == "DirectoryOrCreate":
                os.makedirs(P(path), exist_ok=True)
            elif kind in ("Directory", "File") and not os.path.exists(P(path)):
                raise VolumeError(f'MountVolume.SetUp failed for volume "{name}" : hostPath '
                                  f"type check failed: {path} is not a "
                                  f"{kind.lower()}")
            return path
        if "persistentVolumeClaim" in v:
            return self.claim(name, v["persistentVolumeClaim"]["claimName"], base)
        if "projected" in v:
            return self.projected(name, v["projected"], base)
        kind = next((k for k in v if k != "name"), "?")
        raise VolumeError(f"LAB STAND-IN kubelet: volume type {kind} (volume {name!r}) is not "
                          "supported in the lab")

    def projected(self, name: str, src: Obj, base: str) -> str:
        """A projected volume (projected.go collectData, SetUpAt) in
        <pod dir>/volumes/kubernetes.io~projected/<name>/: its secret and configMap sources
        (items, optional), downwardAPI fieldRef items and serviceAccountToken (a TokenRequest
        bound to the pod, token_request) in one folder, each file with its item's mode, else
        defaultMode (0644); a token (mode 0600 when the pod has an fsGroup or a single
        runAsUser, then owned by that user: FileProjection.FsUser) and, with an fsGroup,
        every file and folder owned by that group and group-readable (_own: a token 0640).
        Any source failing fails the volume with every source's error (FailedMount,
        retried), nothing written."""
        path = f"{base}/volumes/kubernetes.io~projected/{name}"
        mode = int(src.get("defaultMode", 0o644))
        user, group = fs_user(self.pod), fs_group(self.pod)
        files: dict[str, tuple[bytes, int, int | None]] = {}
        errors: list[str] = []
        for source in src.get("sources") or []:
            for kind, plural in (("secret", "secrets"), ("configMap", "configmaps")):
                if kind not in source:
                    continue
                ref, optional = source[kind], bool(source[kind].get("optional"))
                got = self.data(plural, ref.get("name", ""), optional)
                if got is None:
                    errors.append(f'{kind.lower()} "{ref.get("name", "")}" not found')
                    continue
                for item in ref.get("items") or [{"key": k, "path": k} for k in sorted(got)]:
                    if item["key"] in got:
                        files[item["path"]] = (got[item["key"]], int(item.get("mode", mode)),
                                               None)
                    elif not optional:
                        errors.append("configmap references non-existent config key: "
                                      f"{item['key']}" if kind == "configMap" else
                                      f"references non-existent secret key: {item['key']}")
            if "downwardAPI" in source:
                for item in source["downwardAPI"].get("items") or []:
                    if "fieldRef" not in item:
                        errors.append(f"LAB STAND-IN kubelet: downwardAPI item {item.get('path')}"
                                      ": only fieldRef items are supported in the lab")
                        continue
                    value = self.field(str(item["fieldRef"].get("fieldPath", "")))
                    files[item["path"]] = (value.encode(), int(item.get("mode", mode)), None)
            if "serviceAccountToken" in source:
                tp = source["serviceAccountToken"]
                try:
                    token = token_request(self.client, self.pod,
                                          int(tp.get("expirationSeconds") or 3600),
                                          str(tp.get("audience") or ""))
                except ApiError as e:
                    errors.append(f"failed to fetch token: {e}")
                    continue
                files[tp["path"]] = (token.encode(),
                                     0o600 if user is not None or group is not None else mode,
                                     user)
            if not any(k in source for k in ("secret", "configMap", "downwardAPI",
                                             "serviceAccountToken")):
                kind = next(iter(source), "?")
                errors.append(f"LAB STAND-IN kubelet: projected source {kind} is not supported "
                              "in the lab")
        if errors:
            unique = list(dict.fromkeys(errors))  # utilerrors.NewAggregate
            raise VolumeError(f'MountVolume.SetUp failed for volume "{name}" : ' + (
                unique[0] if len(unique) == 1 else f"[{', '.join(unique)}]"))
        shutil.rmtree(P(path), ignore_errors=True)
        os.makedirs(P(path), exist_ok=True)
        for rel, (data, file_mode, owner) in files.items():
            _write_file(f"{path}/{rel}", data, file_mode, owner)
        _own(path, group)
        return path

    def claim(self, name: str, claim: str, base: str = "") -> str:
        pvc = self._get("persistentvolumeclaims", claim)
        if pvc is None:
            raise VolumeError(f'persistentvolumeclaim "{claim}" not found')
        pv_name = pvc.get("spec", {}).get("volumeName")
        if not pv_name or pvc.get("status", {}).get("phase") != "Bound":
            raise VolumeError(f'persistentvolumeclaim "{claim}" is not bound')
        try:
            pv = self.client.get(f"/api/v1/persistentvolumes/{pv_name}")
        except ApiError as e:
            raise VolumeError(f'persistentvolume "{pv_name}" not found') from e
        spec = pv.get("spec", {})
        if "hostPath" in spec:
            # the PV's hostPath goes through the same plugin as a pod's hostPath volume
            return self.volume({"name": pv_name, "hostPath": spec["hostPath"]}, base)
        if "nfs" in spec:
            server, path = spec["nfs"].get("server", ""), spec["nfs"].get("path", "/")
            if not os.path.isdir(P(LAB_NFS_ROOT)):
                raise VolumeError(f'MountVolume.SetUp failed for volume "{pv_name}" : mount '
                                  f"failed: exit status 32 (LAB STAND-IN: no shared folder "
                                  f"{LAB_NFS_ROOT} in this node)")
            local = f"{LAB_NFS_ROOT}/{server}/{path.strip('/')}"
            if not os.path.isdir(P(local)):
                raise VolumeError(nfs_mount_error(pv_name, server, path,
                                                  spec.get("mountOptions") or [], base))
            return local
        raise VolumeError(f"LAB STAND-IN kubelet: persistent volume {pv_name}: only nfs and "
                          "hostPath volumes are supported in the lab")


def refresh_tokens(client: Client, pod: Obj, now: float | None = None) -> list[str]:
    """The kubelet's token manager for a running pod: each serviceAccountToken file of its
    projected volumes older than 80% of its expirationSeconds (or 24 h) is written again with
    a new TokenRequest (requiresRefresh; the volume is set up again each sync upstream, the
    token manager answering from its cache until then). The file's age is its mtime, so a
    restarted kubelet keeps the schedule. Returns the files renewed; ApiError when a
    TokenRequest is refused (the old token stays)."""
    t = time.time() if now is None else now
    user, group = fs_user(pod), fs_group(pod)
    done = []
    for v in pod["spec"].get("volumes") or []:
        for source in (v.get("projected") or {}).get("sources") or []:
            tp = source.get("serviceAccountToken")
            if tp is None:
                continue
            path = f"{PODS_DIR}/{pod['metadata']['uid']}/volumes/kubernetes.io~projected/" \
                f"{v['name']}/{tp['path']}"
            seconds = int(tp.get("expirationSeconds") or 3600)
            try:
                age = t - os.stat(P(path)).st_mtime
            except OSError:
                continue  # not set up (yet): prepare writes it
            if age < min(0.8 * seconds, TOKEN_MAX_AGE):
                continue
            token = token_request(client, pod, seconds, str(tp.get("audience") or ""))
            mode = os.stat(P(path)).st_mode & 0o7777
            _write_file(path, token.encode(), mode, user)
            if group is not None:
                os.chown(P(path), -1, group)
            done.append(path)
    return done


def nfs_mount_error(pv_name: str, server: str, path: str, options: list[str], base: str) -> str:
    """The kubelet's FailedMount text for an NFS volume whose export the server does not have
    (the lab's export is the shared folder's S/P: missing, the real server's answer). From
    kubernetes v1.35.0: pkg/volume/util/operationexecutor/operation_generator.go
    (GenerateError("MountVolume.SetUp failed", err): 'MountVolume.SetUp failed for volume
    "<spec name>" : <err>'), pkg/volume/nfs/nfs.go (source "<server>:<path>", target
    .../volumes/kubernetes.io~nfs/<pv>, fstype nfs, the PV's mountOptions) and
    staging/src/k8s.io/mount-utils/mount_linux.go ("mount failed: %v\nMounting command:
    %s\nMounting arguments: %s\nOutput: %s", MakeMountArgs: -t FSTYPE [-o OPTS] SOURCE
    TARGET); the output is mount.nfs's (nfs-utils) for a path the server does not export,
    exit status 32 (mount(8)'s "mount failure")."""
    source = f"{server}:{path}"
    target = f"{base}/volumes/kubernetes.io~nfs/{pv_name}"
    args = ["-t", "nfs", *(["-o", ",".join(options)] if options else []), source, target]
    return (f'MountVolume.SetUp failed for volume "{pv_name}" : mount failed: exit status 32\n'
            f"Mounting command: mount\nMounting arguments: {' '.join(args)}\n"
            f"Output: mount.nfs: mounting {source} failed, reason given by server: No such "
            "file or directory\n")


def container_spec(c: Obj, env: dict[str, str], volumes: dict[str, str],
                   pod_sc: Obj | None = None) -> Obj:
    mounts = []
    for m in c.get("volumeMounts") or []:
        src = volumes[m["name"]]
        if m.get("subPath"):
            src = f"{src}/{m['subPath']}"
            os.makedirs(P(src), exist_ok=True)
        mounts.append({"src": P(src), "dst": m["mountPath"], "ro": bool(m.get("readOnly"))})
    limits = (c.get("resources") or {}).get("limits") or {}
    sc = c.get("securityContext") or {}
    # runAsUser/runAsGroup: the container's, else the pod's (the image's USER otherwise)
    uid = sc.get("runAsUser", (pod_sc or {}).get("runAsUser"))
    gid = sc.get("runAsGroup", (pod_sc or {}).get("runAsGroup"))
    return {"name": c["name"],
            "user": None if uid is None else f"{uid}:{gid if gid is not None else 0}",
            "image": c.get("image", ""),
            "imagePullPolicy": c.get("imagePullPolicy"),
            "command": c.get("command"), "args": c.get("args"), "env": env,
            "workingDir": c.get("workingDir"), "mounts": mounts,
            # the toolkit counts CAP_SYS_ADMIN as privileged (privileged.go@v1.20.0)
            "privileged": bool(sc.get("privileged")) or
            "SYS_ADMIN" in ((sc.get("capabilities") or {}).get("add") or []),
            "memory": int(parse_quantity(limits["memory"])) if "memory" in limits else None,
            "cpus": float(parse_quantity(limits["cpu"])) if "cpu" in limits else None}


def prepare(client: Client, pod: Obj, node_ip: str, gpus: list[str], gpu_runtime: bool,
            log_dir: str, kubelet_cfg: Obj) -> Obj:
    """podrun's spec for ``pod``: volumes made on the node, env resolved; VolumeError when
    something it names is missing (the pod stays ContainerCreating, as real)."""
    md, spec = pod["metadata"], pod["spec"]
    r = Resolver(client, pod)
    base = f"{PODS_DIR}/{md['uid']}"
    volumes = {v["name"]: r.volume(v, base) for v in spec.get("volumes") or []}
    groups: dict[str, list[Obj]] = {}
    for group in ("initContainers", "containers"):
        groups[group] = [container_spec(c, r.env(c, node_ip), volumes,
                                        spec.get("securityContext"))
                         for c in spec.get(group) or []]
    ports = [{"hostPort": p["hostPort"], "containerPort": p["containerPort"],
              "protocol": p.get("protocol", "TCP").lower()}
             for c in spec.get("containers") or [] for p in c.get("ports") or []
             if p.get("hostPort")]
    return {"uid": md["uid"], "name": md["name"], "namespace": md["namespace"],
            "hostNetwork": bool(spec.get("hostNetwork")), "nodeIP": node_ip,
            "restartPolicy": spec.get("restartPolicy", "Always"), "hostPorts": ports,
            "grace": spec.get("terminationGracePeriodSeconds", 30),
            "gpus": gpus, "gpuRuntime": gpu_runtime, "logDir": P(log_dir),
            "hostname": (spec.get("nodeName") if spec.get("hostNetwork") else
                         spec.get("hostname") or md["name"])[:63],
            "subdomain": spec.get("subdomain"), "dnsPolicy": spec.get("dnsPolicy",
                                                                      "ClusterFirst"),
            "clusterDNS": kubelet_cfg.get("clusterDNS") or [],
            "clusterDomain": kubelet_cfg.get("clusterDomain", "cluster.local"), **groups}


class NoRuntime(Exception):
    """Host unit tests (GPUK8S_LAB_ROOT): the spec is written, nothing can run."""


def start(uid: str, spec: Obj) -> None:
    d = state_dir(uid)
    os.makedirs(P(d), exist_ok=True)
    write(f"{d}/spec.json", json.dumps(spec))
    if os.environ.get("GPUK8S_LAB_ROOT"):
        raise NoRuntime(f"LAB STAND-IN kubelet: no container runtime under GPUK8S_LAB_ROOT "
                        f"(host unit tests); the pod's spec is {P(d)}/spec.json")
    libdir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, "-m", "k8s.podrun", P(d)]
    if os.environ.get(NO_SYSTEMD_ENV):
        with open(P(f"{d}/runner.log"), "ab") as log:
            proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": libdir},
                                    start_new_session=True, stdout=log, stderr=log)
        write(f"{d}/runner.pid", str(proc.pid))
        return
    run(["systemctl", "reset-failed", unit_name(uid)])
    run(["systemd-run", f"--unit={unit_name(uid)}", "--collect",
         f"--description=LAB STAND-IN pod {spec['namespace']}/{spec['name']}",
         "--property=KillMode=mixed",
         f"--property=TimeoutStopSec={int(spec['grace']) + 15}",
         f"--setenv=PYTHONPATH={libdir}", *cmd])


def active(uid: str) -> bool:
    if os.environ.get(NO_SYSTEMD_ENV):
        try:
            os.kill(int(read(f"{state_dir(uid)}/runner.pid") or ""), 0)
            return True
        except (ValueError, OSError):
            return False
    return nodeinfo.unit_active(unit_name(uid))


def stop(uid: str) -> bool:
    """The pod is gone from the API: ask its runner to stop (SIGTERM: its containers get
    their grace period) without waiting; once the runner has ended, its volumes and state
    go. True when nothing of the pod is left."""
    if active(uid):
        if os.environ.get(NO_SYSTEMD_ENV):
            os.kill(int(read(f"{state_dir(uid)}/runner.pid") or "0"), 15)
        else:
            run(["systemctl", "stop", "--no-block", unit_name(uid)])
        return False
    spec = saved_spec(uid)
    cni = CNI(uid)
    if spec and not spec.get("hostNetwork") and not os.environ.get("GPUK8S_LAB_ROOT") \
            and os.path.exists(cni.path):
        # the runner ended without giving the pod's network back (killed at the end of its
        # stop timeout): removed here, as containerd removes a stopped sandbox's network
        cni.delete(spec.get("hostPorts") or [])
    shutil.rmtree(P(state_dir(uid)), ignore_errors=True)
    shutil.rmtree(P(f"{PODS_DIR}/{uid}"), ignore_errors=True)
    return True


def saved_spec(uid: str) -> Obj:
    """The spec start() gave the pod's runner ({} when there is none or it is unreadable)."""
    try:
        spec: Obj = json.loads(read(f"{state_dir(uid)}/spec.json") or "{}")
    except ValueError:
        return {}
    return spec


def checkpointed_gpus(uid: str) -> list[str]:
    """The GPUs a running pod was given (kept in its spec.json, as the kubelet checkpoints
    device allocations), so a restarted kubelet does not hand them out twice."""
    return list(saved_spec(uid).get("gpus") or [])


def report(uid: str) -> Obj | None:
    text = read(f"{state_dir(uid)}/status.json")
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def probe_ok(c: Obj, ip: str | None) -> bool:
    """The container's readinessProbe (tcpSocket or httpGet) against the pod IP."""
    probe = c.get("readinessProbe")
    if not probe:
        return True
    if not ip:
        return False
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
    target = probe.get("tcpSocket") or probe.get("httpGet") or {}
    port: Any = target.get("port")
    port = ports.get(port, port) if isinstance(port, str) else port
    try:
        if "tcpSocket" in probe:
            with socket.create_connection((ip, int(port)), timeout=1):
                return True
        if "httpGet" in probe:
            url = f"http://{ip}:{int(port)}{target.get('path', '/')}"
            with urllib.request.urlopen(url, timeout=1) as resp:
                return 200 <= resp.status < 400
    except (OSError, ValueError, TypeError):
        return False
    return True  # exec probes are not run in the lab: ready when running
