# LAB STAND-IN: not the real kubelet. Test infrastructure for gpuk8s; never shipped to users.
"""The kubelet's side of pods that run for real (podrun.py runs them): the volumes and the
environment resolved from the API (ConfigMaps, Secrets, claims), the spec podrun reads, its
transient unit, and the pod status built from what podrun reports."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import sys
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

    def env(self, c: Obj, node_ip: str) -> dict[str, str]:
        md = self.pod["metadata"]
        out: dict[str, str] = {}
        for src in c.get("envFrom") or []:
            ref = src.get("configMapRef") or src.get("secretRef") or {}
            kind = "configmaps" if "configMapRef" in src else "secrets"
            got = self.data(kind, ref.get("name", ""), bool(ref.get("optional")))
            if got is None:
                raise VolumeError(f'{kind[:-1]} "{ref.get("name")}" not found')
            out.update({src.get("prefix", "") + k: v.decode() for k, v in got.items()})
        fields = {"metadata.name": md["name"], "metadata.namespace": self.ns,
                  "metadata.uid": md["uid"], "spec.nodeName": self.pod["spec"].get("nodeName"),
                  "spec.serviceAccountName": self.pod["spec"].get("serviceAccountName",
                                                                   "default"),
                  "status.hostIP": node_ip}
        for e in c.get("env") or []:
            if "value" in e or "valueFrom" not in e:
                out[e["name"]] = str(e.get("value", ""))
                continue
            vf = e["valueFrom"]
            if "fieldRef" in vf:
                path = str(vf["fieldRef"].get("fieldPath", ""))
                m = re.fullmatch(r"metadata\.(annotations|labels)\['([^']+)'\]", path)
                out[e["name"]] = str((md.get(m.group(1)) or {}).get(m.group(2), "") if m
                                     else fields.get(path, ""))
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
        kind = next((k for k in v if k != "name"), "?")
        raise VolumeError(f"LAB STAND-IN kubelet: volume type {kind} (volume {name!r}) is not "
                          "supported in the lab")

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
