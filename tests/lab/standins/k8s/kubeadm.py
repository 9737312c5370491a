# LAB STAND-IN: not the real kubeadm. Test infrastructure for gpuk8s; never shipped to users.
"""kubeadm stand-in: version, config validate, init, join, token create/list, upgrade
(plan, apply, node), reset."""

from __future__ import annotations

import argparse
import base64
import contextlib
import hmac
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

from . import kubeconfig, nodeinfo, patches, pki
from .apiserver import jws_detached
from .client import ApiError, Client, Unreachable
from .common import (
    TOKEN_RE,
    P,
    format_duration,
    git_version,
    now,
    package_version,
    parse_duration,
    rand_token_part,
    read,
    run,
    ts,
    write,
    yaml_dump,
    yaml_load_all,
)
from .kubeadm_config import ConfigError, args_dict, decode, kubelet_defaults
from .store import Etcd, StoreError

Obj = dict[str, Any]
STACK = "To see the stack trace of this error execute with --v=5 or higher"
PKI = "/etc/kubernetes/pki"
MANIFESTS = "/etc/kubernetes/manifests"
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
#: lab-only: `kubeadm init` dies at the point this file names (see _fault)
FAULT_FILE = "/run/gpuk8s-lab/kubeadm-init-fault"
#: kubeadm's constants.EtcdAPICallTimeout and EtcdAPICallRetryInterval (its member add retries)
ETCD_API_CALL_TIMEOUT, ETCD_API_CALL_RETRY = 120.0, 0.5
KUBECONFIGS = ("admin.conf", "super-admin.conf", "kubelet.conf", "bootstrap-kubelet.conf",
               "controller-manager.conf", "scheduler.conf")



#: the files `init --upload-certs` shares with the control planes that join later
CONTROL_PLANE_SHARED = ("ca.crt", "ca.key", "sa.key", "sa.pub", "front-proxy-ca.crt",
                        "front-proxy-ca.key", "etcd/ca.crt", "etcd/ca.key")


def etcd_command(node: str, adv: str, members: dict[str, str], state: str) -> list[str]:
    """kubeadm's command for the stacked etcd of ``node`` (etcd's own flags: the kubelet runs the
    REAL etcd with them). ``members``: name -> peer address of every member, this one included;
    ``state``: "new" (init) or "existing" (a control plane joining)."""
    pki = f"{PKI}/etcd"
    cluster = ",".join(f"{n}=https://{a}:2380" for n, a in members.items())
    return ["etcd", f"--advertise-client-urls=https://{adv}:2379", f"--cert-file={pki}/server.crt",
            "--client-cert-auth=true", "--data-dir=/var/lib/etcd",
            "--experimental-watch-progress-notify-interval=5s",
            f"--initial-advertise-peer-urls=https://{adv}:2380", f"--initial-cluster={cluster}",
            *(["--initial-cluster-state=existing"] if state == "existing" else []),
            f"--key-file={pki}/server.key",
            f"--listen-client-urls=https://127.0.0.1:2379,https://{adv}:2379",
            "--listen-metrics-urls=http://127.0.0.1:2381", f"--listen-peer-urls=https://{adv}:2380",
            f"--name={node}", f"--peer-cert-file={pki}/peer.crt", "--peer-client-cert-auth=true",
            f"--peer-key-file={pki}/peer.key", f"--peer-trusted-ca-file={pki}/ca.crt",
            "--snapshot-count=10000", f"--trusted-ca-file={pki}/ca.crt"]

class Fail(Exception):
    """Printed to stderr followed by the stack-trace hint, exit 1."""

    def __init__(self, msg: str, hint: bool = True) -> None:
        super().__init__(msg)
        self.hint = hint


def out(line: str = "") -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# ------------------------------------------------------------------ preflight
class Preflight:
    def __init__(self, ignore: list[str]) -> None:
        self.ignore = {i.lower() for i in ignore}
        self.errors: list[str] = []

    def check(self, name: str, msg: str | None, warning: bool = False) -> None:
        if msg is None:
            return
        if warning or "all" in self.ignore or name.lower() in self.ignore:
            out(f"\t[WARNING {name}]: {msg}")
        else:
            self.errors.append(f"\t[ERROR {name}]: {msg}")

    def finish(self, phase: str = "preflight") -> None:
        if self.errors:
            raise Fail(f"error execution phase {phase}: [preflight] Some fatal errors occurred:\n"
                       + "\n".join(self.errors) + "\n[preflight] If you know what you are doing, "
                       "you can make a check non-fatal with `--ignore-preflight-errors=...`")


def port_in_use(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("0.0.0.0", port))
        return False
    except OSError:
        return True
    finally:
        s.close()


def dir_not_empty(path: str) -> bool:
    try:
        return bool(os.listdir(P(path)))
    except OSError:
        return False


def common_checks(pf: Preflight, cri_socket: str, kubelet_cfg: Obj) -> None:
    if os.geteuid() != 0:
        pf.check("IsPrivilegedUser", "user is not running as root")
    err = nodeinfo.cri_error(cri_socket)
    pf.check("CRI", f"container runtime is not running: {err}" if err else None)
    if shutil.which("kubelet") is None:
        pf.check("KubeletVersion", "couldn't get kubelet version: cannot execute 'kubelet "
                 "--version': exec: \"kubelet\": executable file not found in $PATH")
    elif run(["systemctl", "is-enabled", "--quiet", "kubelet.service"]).returncode != 0:
        pf.check("Service-Kubelet", "kubelet service is not enabled, please run 'systemctl "
                 "enable kubelet.service'", warning=True)
    if shutil.which("crictl") is None:
        pf.check("FileExisting-crictl", "crictl not found in system path")
    if shutil.which("conntrack") is None:
        pf.check("FileExisting-conntrack", "conntrack not found in system path")
    if nodeinfo.swap_on():
        if kubelet_cfg.get("failSwapOn", True) is not False:
            pf.check("Swap", "running with swap on is not supported. Please disable swap")
        else:
            pf.check("Swap", "swap is supported for cgroup v2 only. The kubelet must be properly "
                     "configured to use swap. Please refer to https://kubernetes.io/docs/"
                     "concepts/architecture/nodes/#swap-memory, or disable swap on the node",
                     warning=True)
    fwd = nodeinfo.sysctl("net.ipv4.ip_forward")
    if fwd is None:
        pf.check("FileContent--proc-sys-net-ipv4-ip_forward",
                 "/proc/sys/net/ipv4/ip_forward does not exist")
    elif fwd != "1":
        pf.check("FileContent--proc-sys-net-ipv4-ip_forward",
                 "/proc/sys/net/ipv4/ip_forward contents are not set to 1")
    if err is None:
        want = kubelet_cfg.get("cgroupDriver") or "systemd"
        have = nodeinfo.systemd_cgroup(nodeinfo.containerd_config())
        if have is not None and (want == "systemd") != have:
            rt = "systemd" if have else "cgroupfs"
            # Lab-named check: real kubeadm leaves this to the kubelet, which then fails.
            pf.check("CgroupDriver", f'the kubelet cgroupDriver "{want}" does not match the '
                     f'cgroup driver "{rt}" of the container runtime (containerd runc option '
                     f"SystemdCgroup = {str(have).lower()})")


# ------------------------------------------------------------------ helpers
def hostname_override(nr: Obj) -> str:
    return (nr.get("name") or nodeinfo.hostname()).lower()


def wait_http(url: str, timeout: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            import ssl

            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
                if r.status == 200:
                    return time.monotonic() - start
        except OSError:
            pass
        time.sleep(0.25)
    return None


def systemctl(*args: str) -> None:
    run(["systemctl", *args])


def kubelet_flags_env(cri: str, nr: Obj, extra: list[dict[str, str]] | None) -> str:
    flags = [f"--container-runtime-endpoint={cri}",
             "--pod-infra-container-image=registry.k8s.io/pause:3.10.1"]
    if nr.get("name"):
        flags.append(f"--hostname-override={nr['name']}")
    flags += [f"--{k}={v}" for k, v in args_dict(extra).items()]
    return f'KUBELET_KUBEADM_ARGS="{" ".join(flags)}"\n'


def static_pod(name: str, image: str, command: list[str], host_ip: str, port: int,
               scheme: str, probe_path: str) -> str:
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"labels": {"component": name, "tier": "control-plane"}, "name": name,
                     "namespace": "kube-system"},
        "spec": {"containers": [{
            "command": command, "image": image, "imagePullPolicy": "IfNotPresent",
            "livenessProbe": {"failureThreshold": 8, "httpGet": {
                "host": host_ip, "path": probe_path, "port": port, "scheme": scheme},
                "initialDelaySeconds": 10, "periodSeconds": 10, "timeoutSeconds": 15},
            "name": name, "resources": {"requests": {"cpu": "250m"}}}],
            "hostNetwork": True, "priority": 2000001000,
            "priorityClassName": "system-node-critical",
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}},
        "status": {}}
    return yaml_dump(pod)


class Kubeadm:
    def __init__(self, args: argparse.Namespace, version: str) -> None:
        self.args = args
        self.version = version
        self.gv = git_version(version)
        #: patches.directory of the Init/JoinConfiguration (or --patches)
        self.patches: str | None = args.patches

    def write_manifest(self, component: str, text: str) -> None:
        """Write a static Pod manifest with this node's patches applied (as kubeadm does)."""
        try:
            text, said = patches.apply(self.patches, component, text)
        except patches.PatchError as e:
            raise Fail(f"error execution phase control-plane: {e}") from e
        for line in said:
            out(line)
        write(f"{MANIFESTS}/{component}.yaml", text, 0o600)

    # -------------------------------------------------------------- config
    def load_config(self, required: bool = True) -> dict[str, Obj]:
        path = self.args.config
        if not path:
            if required:
                raise Fail("required flag(s) \"config\" not set")
            return {}
        text = read(path) if path.startswith("/") else None
        if text is None:
            try:
                with open(path) as f:
                    text = f.read()
            except OSError as e:
                raise Fail(f"unable to read config from \"{path}\" : open {path}: "
                           "no such file or directory") from e
        try:
            cfg = decode(text)
        except ConfigError as e:
            raise Fail(str(e)) from e
        for kind in ("InitConfiguration", "JoinConfiguration"):
            directory = ((cfg.get(kind) or {}).get("patches") or {}).get("directory")
            self.patches = directory or self.patches
        return cfg

    def cmd_config(self) -> None:
        if not self.args.args or self.args.args[0] != "validate":
            raise Fail(f"unknown command \"{' '.join(self.args.args)}\" for \"kubeadm config\"")
        cfg = self.load_config()
        self._check_k8s_version(cfg.get("ClusterConfiguration", {}))
        out("ok")

    def _check_k8s_version(self, cc: Obj) -> str:
        want = cc.get("kubernetesVersion") or self.gv
        try:
            wmaj, wmin = (int(x) for x in want.lstrip("v").split(".")[:2])
        except ValueError as e:
            raise Fail(f'couldn\'t parse Kubernetes version "{want}"') from e
        minor = int(self.gv[1:].split(".")[1])
        if wmaj != 1 or wmin > minor:
            raise Fail(f"this version of kubeadm only supports deploying clusters with the "
                       f"control plane version <= v1.{minor}.0. Current version: {want}")
        if wmin < minor - 1:
            raise Fail(f"this version of kubeadm only supports deploying clusters with the "
                       f"control plane version >= 1.{minor - 1}.0. Current version: {want}")
        return want if want.startswith("v") else "v" + want

    # -------------------------------------------------------------- init
    def cmd_init(self) -> None:
        if self.args.args[:1] == ["phase"]:
            self._init_phase(self.args.args[1:])
            return
        cfg = self.load_config()
        ic, cc = cfg.get("InitConfiguration", {}), cfg.get("ClusterConfiguration", {})
        _leaf_validity(cc)
        kc = kubelet_defaults(cfg.get("KubeletConfiguration"))
        nr = ic.get("nodeRegistration") or {}
        cri = nr.get("criSocket") or nodeinfo.CRI_SOCKET
        kc["containerRuntimeEndpoint"] = cri
        k8s_version = self._check_k8s_version(cc)
        node = hostname_override(nr)
        adv, port, endpoint = _api_endpoint(ic, cc)
        net = cc.get("networking") or {}
        svc_subnet = net.get("serviceSubnet") or "10.96.0.0/12"
        algo = cc.get("encryptionAlgorithm") or "RSA-2048"
        timeouts = ic.get("timeouts") or {}
        out(f"[init] Using Kubernetes version: {k8s_version}")
        out("[preflight] Running pre-flight checks")
        pf = Preflight(self._ignores(nr))
        for p in (port, 10259, 10257):
            pf.check(f"Port-{p}", f"Port {p} is in use" if port_in_use(p) else None)
        for comp in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd"):
            f = f"{MANIFESTS}/{comp}.yaml"
            pf.check("FileAvailable-" + f.replace("/", "-"),
                     f"{f} already exists" if os.path.exists(P(f)) else None)
        pf.check("Port-10250", "Port 10250 is in use" if port_in_use(10250) else None)
        pf.check("Port-2379", "Port 2379 is in use" if port_in_use(2379) else None)
        pf.check("Port-2380", "Port 2380 is in use" if port_in_use(2380) else None)
        pf.check("DirAvailable--var-lib-etcd",
                 "/var/lib/etcd is not empty" if dir_not_empty("/var/lib/etcd") else None)
        common_checks(pf, cri, kc)
        pf.finish()
        out("[preflight] Pulling images required for setting up a Kubernetes cluster")
        out("[preflight] This might take a minute or two, depending on the speed of your "
            "internet connection")
        out("[preflight] You can also perform this action beforehand using 'kubeadm config "
            "images pull'")

        # certs
        out(f'[certs] Using certificateDir folder "{PKI}"')
        ca_crt = f"{PKI}/ca.crt"
        os.makedirs(P(PKI + "/etcd"), exist_ok=True)
        # a CA, leaf or sa key already on disk is used, not made again (a restore puts a
        # backup's PKI back before init): runCAPhase/runCertPhase of
        # cmd/kubeadm/app/cmd/phases/init/certs.go and CreateServiceAccountKeyAndPublicKeyFiles
        # of cmd/kubeadm/app/phases/certs/certs.go (kubeadm v1.36)
        def ca(base: str, cn: str) -> None:
            if os.path.exists(P(f"{PKI}/{base}.crt")) and os.path.exists(P(f"{PKI}/{base}.key")):
                out(f"[certs] Using existing {base} certificate authority")
            else:
                out(f'[certs] Generating "{base}" certificate and key')
                pki.gen_ca(f"{PKI}/{base}.crt", f"{PKI}/{base}.key", cn, algorithm=algo)

        ca("ca", "kubernetes")

        def new_ca(leaf: str) -> None:  # each CA just before its first leaf, as kubeadm prints
            if leaf == "front-proxy-client":
                ca("front-proxy-ca", "front-proxy-ca")
            elif leaf == "etcd/server":
                ca("etcd/ca", "etcd-ca")

        self._node_certs(node, adv, endpoint, svc_subnet, cc, algo, new_ca)
        if os.path.exists(P(f"{PKI}/sa.key")):
            out('[certs] Using the existing "sa" key')
        else:
            out('[certs] Generating "sa" key and public key')
            pki.gen_key(f"{PKI}/sa.key", "RSA-2048")
        ca_pem = read(ca_crt) or ""

        # kubeconfigs
        out('[kubeconfig] Using kubeconfig folder "/etc/kubernetes"')
        server = f"https://{endpoint}"
        local = f"https://{adv}:{port}"
        for fn, cn, orgs, srv in (
                ("admin.conf", "kubernetes-admin", ["kubeadm:cluster-admins"], server),
                ("super-admin.conf", "kubernetes-super-admin", ["system:masters"], server),
                ("kubelet.conf", f"system:node:{node}", ["system:nodes"], local),
                ("controller-manager.conf", "system:kube-controller-manager", [], local),
                ("scheduler.conf", "system:kube-scheduler", [], local)):
            out(f'[kubeconfig] Writing "{fn}" kubeconfig file')
            self._write_client_kubeconfig(f"/etc/kubernetes/{fn}", srv, ca_pem, cn, orgs, algo)

        self._fault("after-kubeconfig")
        # manifests
        out(f'[etcd] Creating static Pod manifest for local etcd in "{MANIFESTS}"')
        self.write_manifest("etcd", static_pod(
            "etcd", "registry.k8s.io/etcd:3.6.5-0",
            etcd_command(node, adv, {node: adv}, "new"),
            "127.0.0.1", 2381, "HTTP", "/livez"))
        self._write_control_plane(cc, adv, port, k8s_version)

        self._kubelet_start(kc, cri, nr)
        out(f'[wait-control-plane] Waiting for the kubelet to boot up the control plane as '
            f'static Pods from directory "{MANIFESTS}"')
        self._wait_kubelet(timeouts)
        cp_timeout = parse_duration(timeouts.get("controlPlaneComponentHealthCheck", "4m0s"))
        out(f"[control-plane-check] Waiting for healthy control plane components. This can take "
            f"up to {format_duration(cp_timeout)}")
        out(f"[control-plane-check] Checking kube-apiserver at https://{adv}:{port}/livez")
        out("[control-plane-check] Checking kube-controller-manager at "
            "https://127.0.0.1:10257/healthz")
        out("[control-plane-check] Checking kube-scheduler at https://127.0.0.1:10259/livez")
        took = wait_http(f"https://{adv}:{port}/livez", cp_timeout)
        if took is None:
            raise Fail(f"[control-plane-check] kube-apiserver is not healthy after "
                       f"{format_duration(cp_timeout)}\n\nA control plane component may have "
                       "crashed or exited when started by the container runtime.\nTo "
                       "troubleshoot, list all containers using your preferred container "
                       "runtimes CLI.\nHere is one example how you may list all running "
                       "Kubernetes containers by using crictl:\n\t- 'crictl --runtime-endpoint "
                       f"{cri} ps -a | grep kube | grep -v pause'\n\tOnce you have found the "
                       "failing container, you can inspect its logs with:\n\t- 'crictl "
                       f"--runtime-endpoint {cri} logs CONTAINERID'\n\nerror execution phase "
                       "wait-control-plane: failed while waiting for the control plane to start: "
                       f'kube-apiserver check failed at https://{adv}:{port}/livez: Get '
                       f'"https://{adv}:{port}/livez?timeout=10s": dial tcp {adv}:{port}: '
                       "connect: connection refused")
        for comp in ("kube-controller-manager", "kube-scheduler", "kube-apiserver"):
            out(f"[control-plane-check] {comp} is healthy after {took:.9f}s")

        self._fault("before-upload-config")
        c = Client(kubeconfig.load(P("/etc/kubernetes/super-admin.conf")), agent="kubeadm",
                   retry_for=60)
        self._post_init(c, cfg, kc, node, ca_pem, server, endpoint)

    def _init_phase(self, args: list[str]) -> None:
        """`kubeadm init phase upload-config kubeadm|kubelet|all` and `kubeadm init phase
        control-plane apiserver|controller-manager|scheduler|all` (kubeadm's documented way to
        reconfigure a running cluster), each with --config."""
        phase, sub = [*args, "", ""][:2]
        if phase == "upload-certs":  # kubeadm init phase upload-certs --upload-certs
            if not self.args.upload_certs:
                out("[upload-certs] Skipping phase. Please see --upload-certs")
                return
            self._upload_certs(self._admin(), self.args.certificate_key or os.urandom(32).hex())
            return
        if phase not in ("upload-config", "control-plane"):
            raise Fail(f'unknown command "{phase}" for "kubeadm init phase"' if phase else
                       "missing subcommand; \"phase\" is not meant to be run on its own")
        names = {"upload-config": ("kubeadm", "kubelet"),
                 "control-plane": ("apiserver", "controller-manager", "scheduler")}[phase]
        if sub not in (*names, "all"):
            raise Fail(f'unknown command "{sub}" for "kubeadm init phase {phase}"' if sub else
                       f'missing subcommand; "{phase}" is not meant to be run on its own')
        chosen = names if sub == "all" else (sub,)
        cfg = self.load_config()
        ic, cc = cfg.get("InitConfiguration", {}), dict(cfg.get("ClusterConfiguration", {}))
        _leaf_validity(cc)
        k8s_version = self._check_k8s_version(cc)
        if phase == "control-plane":
            lae = ic.get("localAPIEndpoint") or {}
            adv = lae.get("advertiseAddress") or nodeinfo.ipv4()
            self._write_control_plane(cc, adv, int(lae.get("bindPort") or 6443), k8s_version,
                                      tuple(f"kube-{n}" for n in chosen))
            return
        c = self._admin()
        if "kubeadm" in chosen:
            cc.setdefault("apiVersion", "kubeadm.k8s.io/v1beta4")
            cc.setdefault("kind", "ClusterConfiguration")
            cc["kubernetesVersion"] = k8s_version
            out('[upload-config] Storing the configuration used in ConfigMap "kubeadm-config" in '
                'the "kube-system" Namespace')
            self._put_configmap(c, "kubeadm-config", {"ClusterConfiguration": yaml_dump(cc)})
        if "kubelet" in chosen:
            kc = kubelet_defaults(cfg.get("KubeletConfiguration"))
            kc.pop("containerRuntimeEndpoint", None)
            out('[kubelet] Creating a ConfigMap "kubelet-config" in namespace kube-system with the '
                "configuration for the kubelets in the cluster")
            self._put_configmap(c, "kubelet-config", {"kubelet": yaml_dump(kc)})

    @staticmethod
    def _put_configmap(c: Client, name: str, data: dict[str, str]) -> None:
        path = f"/api/v1/namespaces/kube-system/configmaps/{name}"
        try:
            cm = c.get(path)
        except ApiError:
            Kubeadm._create(c, "/api/v1/namespaces/kube-system/configmaps", {
                "metadata": {"name": name, "namespace": "kube-system"}, "data": data})
            return
        cm["data"] = data
        c.request("PUT", path, cm)

    def _write_control_plane(self, cc: Obj, adv: str, port: int, k8s_version: str,
                             components: tuple[str, ...] = CONTROL_PLANE) -> None:
        """The static pod manifests of ``components`` from the ClusterConfiguration (init and
        `kubeadm init phase control-plane`)."""
        net = cc.get("networking") or {}
        svc_subnet = net.get("serviceSubnet") or "10.96.0.0/12"
        args: dict[str, dict[str, str]] = {
            "kube-apiserver": {
                "advertise-address": adv, "allow-privileged": "true",
                "authorization-mode": "Node,RBAC", "client-ca-file": f"{PKI}/ca.crt",
                "enable-admission-plugins": "NodeRestriction",
                "enable-bootstrap-token-auth": "true",
                "etcd-cafile": f"{PKI}/etcd/ca.crt",
                "etcd-certfile": f"{PKI}/apiserver-etcd-client.crt",
                "etcd-keyfile": f"{PKI}/apiserver-etcd-client.key",
                "etcd-servers": "https://127.0.0.1:2379",
                "kubelet-client-certificate": f"{PKI}/apiserver-kubelet-client.crt",
                "kubelet-client-key": f"{PKI}/apiserver-kubelet-client.key",
                "kubelet-preferred-address-types": "InternalIP,ExternalIP,Hostname",
                "secure-port": str(port),
                "service-account-issuer": "https://kubernetes.default.svc.cluster.local",
                "service-account-key-file": f"{PKI}/sa.pub",
                "service-account-signing-key-file": f"{PKI}/sa.key",
                "service-cluster-ip-range": svc_subnet,
                "tls-cert-file": f"{PKI}/apiserver.crt",
                "tls-private-key-file": f"{PKI}/apiserver.key"},
            "kube-controller-manager": {
                "allocate-node-cidrs": "true" if net.get("podSubnet") else "false",
                "authentication-kubeconfig": "/etc/kubernetes/controller-manager.conf",
                "bind-address": "127.0.0.1", "cluster-signing-cert-file": f"{PKI}/ca.crt",
                "cluster-signing-key-file": f"{PKI}/ca.key",
                "kubeconfig": "/etc/kubernetes/controller-manager.conf",
                "service-cluster-ip-range": svc_subnet,
                "use-service-account-credentials": "true",
                **({"cluster-cidr": net["podSubnet"]} if net.get("podSubnet") else {})},
            "kube-scheduler": {
                "authentication-kubeconfig": "/etc/kubernetes/scheduler.conf",
                "bind-address": "127.0.0.1", "kubeconfig": "/etc/kubernetes/scheduler.conf",
                "leader-elect": "true"},
        }
        section = {"kube-apiserver": "apiServer", "kube-controller-manager": "controllerManager",
                   "kube-scheduler": "scheduler"}
        probe = {"kube-apiserver": (adv, port, "/livez"),
                 "kube-controller-manager": ("127.0.0.1", 10257, "/healthz"),
                 "kube-scheduler": ("127.0.0.1", 10259, "/livez")}
        out(f'[control-plane] Using manifest folder "{MANIFESTS}"')
        for comp in components:
            flags = args[comp]
            flags.update(args_dict((cc.get(section[comp]) or {}).get("extraArgs")))
            host, probe_port, path = probe[comp]
            out(f'[control-plane] Creating static Pod manifest for "{comp}"')
            self.write_manifest(comp, static_pod(
                comp, f"registry.k8s.io/{comp}:{k8s_version}",
                [comp, *(f"--{k}={v}" for k, v in sorted(flags.items()))],
                host, probe_port, "HTTPS", path))

    @staticmethod
    def _fault(point: str) -> None:
        """Lab-only fault injection: when FAULT_FILE names this point, remove the file (one
        shot) and die by SIGKILL, as a kubeadm killed there (Ctrl-C, a lost session) would."""
        if (read(FAULT_FILE) or "").strip() == point:
            os.unlink(P(FAULT_FILE))
            sys.stdout.flush()
            os.kill(os.getpid(), 9)

    def _write_client_kubeconfig(self, path: str, server: str, ca_pem: str, cn: str,
                                 orgs: list[str], algo: str) -> None:
        key = path + ".key.tmp"
        pki.gen_key(key, algo)
        cert = pki.sign_csr(pki.make_csr(key, cn, orgs), f"{PKI}/ca.crt", f"{PKI}/ca.key")
        key_pem = read(key) or ""
        os.unlink(P(key))
        write(path, kubeconfig.build(server, ca_pem, cn,
                                     cert_pem=cert, key_pem=key_pem), 0o600)

    def _ignores(self, nr: Obj) -> list[str]:
        ig = list(nr.get("ignorePreflightErrors") or [])
        for v in self.args.ignore_preflight_errors or []:
            ig += v.split(",")
        return ig

    def _kubelet_start(self, kc: Obj, cri: str, nr: Obj) -> None:
        out('[kubelet-start] Writing kubelet environment file with flags to file '
            '"/var/lib/kubelet/kubeadm-flags.env"')
        write("/var/lib/kubelet/kubeadm-flags.env",
              kubelet_flags_env(cri, nr, nr.get("kubeletExtraArgs")))
        out('[kubelet-start] Writing kubelet configuration to file "/var/lib/kubelet/config.yaml"')
        write("/var/lib/kubelet/config.yaml", yaml_dump(kc))
        out("[kubelet-start] Starting the kubelet")
        systemctl("restart", "kubelet")

    def _wait_kubelet(self, timeouts: Obj) -> None:
        t = parse_duration(timeouts.get("kubeletHealthCheck", "4m0s"))
        out(f"[kubelet-check] Waiting for a healthy kubelet at http://127.0.0.1:10248/healthz. "
            f"This can take up to {format_duration(t)}")
        took = wait_http("http://127.0.0.1:10248/healthz", t)
        if took is None:
            raise Fail(f"[kubelet-check] The kubelet is not healthy after {format_duration(t)}\n\n"
                       "Unfortunately, an error has occurred, likely caused by:\n\t- The kubelet "
                       "is not running\n\t- The kubelet is unhealthy due to a misconfiguration of "
                       "the node in some way (required cgroups disabled)\n\nIf you are on a "
                       "systemd-powered system, you can try to troubleshoot the error with the "
                       "following commands:\n\t- 'systemctl status kubelet'\n\t- 'journalctl "
                       "-xeu kubelet'\n\nerror execution phase wait-control-plane: failed while "
                       "waiting for the kubelet to start: The HTTP call equal to 'curl -sSL "
                       "http://127.0.0.1:10248/healthz' returned error: Get \"http://127.0.0.1:"
                       "10248/healthz\": dial tcp 127.0.0.1:10248: connect: connection refused")
        out(f"[kubelet-check] The kubelet is healthy after {took:.9f}s")

    def _post_init(self, c: Client, cfg: dict[str, Obj], kc: Obj, node: str, ca_pem: str,
                   server: str, endpoint: str) -> None:
        ic, cc = cfg.get("InitConfiguration", {}), dict(cfg.get("ClusterConfiguration", {}))
        cc.setdefault("apiVersion", "kubeadm.k8s.io/v1beta4")
        cc.setdefault("kind", "ClusterConfiguration")
        cc.setdefault("kubernetesVersion", self._check_k8s_version(cc))
        # kubeadm stores controlPlaneEndpoint as the config gives it ("" when none: then no
        # other control plane may join)
        out('[upload-config] Storing the configuration used in ConfigMap "kubeadm-config" in the '
            '"kube-system" Namespace')
        self._create(c, "/api/v1/namespaces/kube-system/configmaps", {
            "metadata": {"name": "kubeadm-config", "namespace": "kube-system"},
            "data": {"ClusterConfiguration": yaml_dump(cc)}})
        out('[kubelet] Creating a ConfigMap "kubelet-config" in namespace kube-system with the '
            "configuration for the kubelets in the cluster")
        shared_kc = {k: v for k, v in kc.items() if k not in ("containerRuntimeEndpoint",)}
        self._create(c, "/api/v1/namespaces/kube-system/configmaps", {
            "metadata": {"name": "kubelet-config", "namespace": "kube-system"},
            "data": {"kubelet": yaml_dump(shared_kc)}})
        cert_key = ic.get("certificateKey") or self.args.certificate_key or os.urandom(32).hex()
        if self.args.upload_certs:
            self._upload_certs(c, cert_key)
        else:
            out("[upload-certs] Skipping phase. Please see --upload-certs")
        out(f"[mark-control-plane] Marking the node {node} as control-plane by adding the labels:"
            " [node-role.kubernetes.io/control-plane node.kubernetes.io/exclude-from-external-"
            "load-balancers]")
        taints = (ic.get("nodeRegistration") or {}).get("taints")
        if taints is None:
            taints = [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]
        if taints:
            shown = " ".join(f"{t['key']}:{t['effect']}" for t in taints)
            out(f"[mark-control-plane] Marking the node {node} as control-plane by adding the "
                f"taints [{shown}]")
        self._mark_control_plane(c, node, taints)
        # bootstrap tokens
        tokens = ic.get("bootstrapTokens") or [{}]
        tok_strs = []
        for bt in tokens:
            tok = bt.get("token") or f"{rand_token_part(6)}.{rand_token_part(16)}"
            if not TOKEN_RE.match(tok):
                raise Fail(f'the bootstrap token "{tok}" was not of the form '
                           f'"\\A([a-z0-9]{{6}})\\.([a-z0-9]{{16}})\\z"')
            create_token_secret(c, tok, parse_duration(bt.get("ttl", "24h0m0s")),
                                bt.get("description", ""), bt.get("usages"), bt.get("groups"))
            tok_strs.append(tok)
        if not self.args.skip_token_print:
            out(f"[bootstrap-token] Using token: {tok_strs[0]}")
        for line in ("Configuring bootstrap tokens, cluster-info ConfigMap, RBAC Roles",
                     "Configured RBAC rules to allow Node Bootstrap tokens to get nodes",
                     "Configured RBAC rules to allow Node Bootstrap tokens to post CSRs in order "
                     "for nodes to get long term certificate credentials",
                     "Configured RBAC rules to allow the csrapprover controller automatically "
                     "approve CSRs from a Node Bootstrap Token",
                     "Configured RBAC rules to allow certificate rotation for all node client "
                     "certificates in the cluster",
                     'Creating the "cluster-info" ConfigMap in the "kube-public" namespace'):
            out(f"[bootstrap-token] {line}")
        self._create(c, "/apis/rbac.authorization.k8s.io/v1/clusterroles", {
            "metadata": {"name": "cluster-admin"},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                      {"nonResourceURLs": ["*"], "verbs": ["*"]}]})
        self._create(c, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "metadata": {"name": "kubeadm:cluster-admins"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                          "name": "kubeadm:cluster-admins"}]})
        self._create(c, "/api/v1/namespaces/kube-public/configmaps", {
            "metadata": {"name": "cluster-info", "namespace": "kube-public"},
            "data": {"kubeconfig": cluster_info_kubeconfig(server, ca_pem)}})
        out('[kubelet-finalize] Updating "/etc/kubernetes/kubelet.conf" to point to a rotatable '
            "kubelet client certificate and key")
        self._addons(c, cc)
        ca_hash = pki.ca_cert_hash(ca_pem)
        tok = "<value withheld>" if self.args.skip_token_print else tok_strs[0]
        out("\nYour Kubernetes control-plane has initialized successfully!\n")
        out("To start using your cluster, you need to run the following as a regular user:\n")
        out("  mkdir -p $HOME/.kube")
        out("  sudo cp -i /etc/kubernetes/admin.conf $HOME/.kube/config")
        out("  sudo chown $(id -u):$(id -g) $HOME/.kube/config\n")
        out("Alternatively, if you are the root user, you can run:\n")
        out("  export KUBECONFIG=/etc/kubernetes/admin.conf\n")
        out("You should now deploy a pod network to the cluster.")
        out('Run "kubectl apply -f [podnetwork].yaml" with one of the options listed at:')
        out("  https://kubernetes.io/docs/concepts/cluster-administration/addons/\n")
        if cc.get("controlPlaneEndpoint") and self.args.upload_certs:
            out("You can now join any number of control-plane nodes running the following "
                "command on each as root:\n")
            key = "<value withheld>" if self.args.skip_certificate_key_print else cert_key
            out(f"  kubeadm join {endpoint} --token {tok} \\\n\t--discovery-token-ca-cert-hash "
                f"{ca_hash} \\\n\t--control-plane --certificate-key {key}\n")
            out("Please note that the certificate-key gives access to cluster sensitive data, "
                "keep it secret!\nAs a safeguard, uploaded-certs will be deleted in two hours; "
                "If necessary, you can use\n\"kubeadm init phase upload-certs --upload-certs\" to "
                "reload certs afterward.\n")
        out("Then you can join any number of worker nodes by running the following on each as "
            "root:\n")
        out(f"kubeadm join {endpoint} --token {tok} \\\n\t--discovery-token-ca-cert-hash "
            f"{ca_hash} ")

    @staticmethod
    def _node_certs(node: str, adv: str, endpoint: str, svc_subnet: str, cc: Obj, algo: str,
                    before: Any = None) -> None:
        """This control plane's own certificates, signed by the cluster's CAs (init makes the
        CAs; a joining control plane downloads them). ``before(leaf)`` runs before each."""
        import ipaddress

        ca_crt, ca_key = f"{PKI}/ca.crt", f"{PKI}/ca.key"
        sans_dns = [node, "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local"]
        svc_ip = str(next(ipaddress.ip_network(svc_subnet, strict=False).hosts()))
        sans_ip = [svc_ip, adv]
        cp_host = endpoint.rsplit(":", 1)[0]
        extra = [s for s in (cc.get("apiServer") or {}).get("certSANs") or []]
        if cp_host not in sans_ip + sans_dns:
            extra.append(cp_host)
        hook = before or (lambda leaf: None)

        def fresh(base: str, ca: str) -> bool:
            """Whether ``base`` must be made: kubeadm keeps a certificate and key on disk that
            its CA signed ("Using existing ... on disk"), and fails on one it did not."""
            crt, key = P(f"{PKI}/{base}.crt"), P(f"{PKI}/{base}.key")
            if not (os.path.exists(crt) and os.path.exists(key)):
                return True
            check = subprocess.run(["openssl", "verify", "-CAfile", P(f"{PKI}/{ca}.crt"), crt],
                                   capture_output=True, text=True)
            if check.returncode != 0:
                raise Fail(f"error execution phase certs/{base.replace('/', '-')}: [certs] "
                           f"certificate {base} not signed by CA certificate {ca}: "
                           "x509: certificate signed by unknown authority")
            out(f"[certs] Using existing {base} certificate and key on disk")
            return False

        if fresh("apiserver", "ca"):
            out('[certs] Generating "apiserver" certificate and key')
            out(f"[certs] apiserver serving cert is signed for DNS names [{' '.join(sans_dns)}] "
                f"and IPs [{' '.join(sans_ip)}]")
            pki.issue(f"{PKI}/apiserver.crt", f"{PKI}/apiserver.key", ca_crt, ca_key,
                      "kube-apiserver", server=True, client=False,
                      sans=sans_dns + sans_ip + extra + ["127.0.0.1"], algorithm=algo)
        if fresh("apiserver-kubelet-client", "ca"):
            out('[certs] Generating "apiserver-kubelet-client" certificate and key')
            pki.issue(f"{PKI}/apiserver-kubelet-client.crt",
                      f"{PKI}/apiserver-kubelet-client.key", ca_crt, ca_key,
                      "kube-apiserver-kubelet-client", orgs=["kubeadm:cluster-admins"],
                      algorithm=algo)
        hook("front-proxy-client")
        if fresh("front-proxy-client", "front-proxy-ca"):
            out('[certs] Generating "front-proxy-client" certificate and key')
            pki.issue(f"{PKI}/front-proxy-client.crt", f"{PKI}/front-proxy-client.key",
                      f"{PKI}/front-proxy-ca.crt", f"{PKI}/front-proxy-ca.key",
                      "front-proxy-client", algorithm=algo)
        for leaf, server in (("server", True), ("peer", True), ("healthcheck-client", False)):
            hook(f"etcd/{leaf}")
            if not fresh(f"etcd/{leaf}", "etcd/ca"):
                continue
            out(f'[certs] Generating "etcd/{leaf}" certificate and key')
            if server:
                out(f"[certs] etcd/{leaf} serving cert is signed for DNS names [{node} localhost]"
                    f" and IPs [{adv} 127.0.0.1 ::1]")
            pki.issue(f"{PKI}/etcd/{leaf}.crt", f"{PKI}/etcd/{leaf}.key", f"{PKI}/etcd/ca.crt",
                      f"{PKI}/etcd/ca.key", node if server else "kube-etcd-healthcheck-client",
                      server=server, sans=[node, "localhost", adv, "127.0.0.1"] if server
                      else None, algorithm=algo)
        if fresh("apiserver-etcd-client", "etcd/ca"):
            out('[certs] Generating "apiserver-etcd-client" certificate and key')
            pki.issue(f"{PKI}/apiserver-etcd-client.crt", f"{PKI}/apiserver-etcd-client.key",
                      f"{PKI}/etcd/ca.crt", f"{PKI}/etcd/ca.key", "kube-apiserver-etcd-client",
                      algorithm=algo)

    def _prepare_control_plane(self, c: Client, node: str, adv: str, port: int,
                               key: str) -> Obj:
        """`join --control-plane`, before the kubelet starts: the shared certificates from
        kubeadm-certs, this node's own, its kubeconfigs and control plane manifests."""
        cm = c.get("/api/v1/namespaces/kube-system/configmaps/kubeadm-config")
        cc = (yaml_load_all(cm["data"]["ClusterConfiguration"]) or [{}])[0]
        endpoint = cc.get("controlPlaneEndpoint") or ""
        if not endpoint or not key:
            raise Fail("error execution phase preflight: \nOne or more conditions for hosting a "
                       "new control plane instance is not satisfied.\n\n" + (
                           "unable to add a new control plane instance to a cluster that "
                           "doesn't have a stable controlPlaneEndpoint address" if not endpoint
                           else "the certificate key is required (--certificate-key)") +
                       "\n\nPlease ensure that:\n* The cluster has a stable "
                       "controlPlaneEndpoint address.\n* The certificates that must be shared "
                       "among control plane instances are provided.\n")
        out("[preflight] Running pre-flight checks before initializing the new control plane "
            "instance")
        os.makedirs(P(PKI + "/etcd"), exist_ok=True)
        self._download_certs(c, key)
        out(f'[certs] Using certificateDir folder "{PKI}"')
        net = cc.get("networking") or {}
        algo = cc.get("encryptionAlgorithm") or "RSA-2048"
        self._node_certs(node, adv, endpoint, net.get("serviceSubnet") or "10.96.0.0/12", cc,
                         algo)
        out('[certs] Valid certificates and keys now exist in "/etc/kubernetes/pki"')
        out('[certs] Using the existing "sa" key')
        out('[kubeconfig] Generating kubeconfig files')
        out('[kubeconfig] Using kubeconfig folder "/etc/kubernetes"')
        ca_pem = read(f"{PKI}/ca.crt") or ""
        local = f"https://{adv}:{port}"
        for fn, cn, orgs, srv in (
                ("admin.conf", "kubernetes-admin", ["kubeadm:cluster-admins"],
                 f"https://{endpoint}"),
                ("controller-manager.conf", "system:kube-controller-manager", [], local),
                ("scheduler.conf", "system:kube-scheduler", [], local)):
            out(f'[kubeconfig] Writing "{fn}" kubeconfig file')
            self._write_client_kubeconfig(f"/etc/kubernetes/{fn}", srv, ca_pem, cn, orgs, algo)
        out(f'[control-plane] Using manifest folder "{MANIFESTS}"')
        self._write_control_plane(cc, adv, port, self._check_k8s_version(cc))
        return cc

    def _join_control_plane(self, node: str, adv: str, port: int, cc: Obj, nr: Obj,
                            timeouts: Obj) -> None:
        """`join --control-plane`, once the kubelet runs: this node's etcd member added through
        a running one (then its static pod written, as kubeadm does), the API server waited
        for, the node marked as a control plane."""
        admin = Client(kubeconfig.load(P("/etc/kubernetes/admin.conf")), agent="kubeadm",
                       retry_for=60)
        peers = []
        for n in admin.get("/api/v1/nodes?labelSelector=node-role.kubernetes.io/control-plane"
                           )["items"]:
            ip = next((a["address"] for a in n.get("status", {}).get("addresses") or []
                       if a.get("type") == "InternalIP"), None)
            if ip and n["metadata"]["name"] != node:
                peers.append(ip)
        etcd_pki = f"{PKI}/etcd"
        members: dict[str, str] = {}
        err = "no control plane node with an address"
        # as the real kubeadm: the add is tried again every 500 ms for 2 minutes (etcd refuses
        # it, "unhealthy cluster", until its leader has been connected to a quorum for 5 s,
        # e.g. just after the previous member joined); a peer URL already added is listed
        deadline = time.monotonic() + ETCD_API_CALL_TIMEOUT
        while not members and peers:
            for ip in peers:
                e = Etcd(f"https://{ip}:2379", P(f"{etcd_pki}/ca.crt"),
                         P(f"{etcd_pki}/healthcheck-client.crt"),
                         P(f"{etcd_pki}/healthcheck-client.key"))
                try:
                    added = e.call("/v3/cluster/member/add",
                                   {"peerURLs": [f"https://{adv}:2380"]})
                except StoreError as exc:
                    err = str(exc)
                    if "Peer URLs already exists" not in err:
                        continue
                    try:
                        added = e.call("/v3/cluster/member/list", {})
                    except StoreError as exc2:
                        err = str(exc2)
                        continue
                for m in added.get("members") or []:
                    peer = (m.get("peerURLs") or [""])[0]
                    name = m.get("name") or node
                    members[name] = peer.removeprefix("https://").rsplit(":", 1)[0]
                break
            if members or time.monotonic() >= deadline:
                break
            time.sleep(ETCD_API_CALL_RETRY)
        if not members:
            raise Fail("error execution phase control-plane-join/etcd: error creating local etcd "
                       f"static pod manifest file: etcdserver: unable to add member: {err}")
        out("[etcd] Announced new etcd member joining to the existing etcd cluster")
        out('[etcd] Creating static Pod manifest for "etcd"')
        self.write_manifest("etcd", static_pod(
            "etcd", "registry.k8s.io/etcd:3.6.5-0", etcd_command(node, adv, members, "existing"),
            "127.0.0.1", 2381, "HTTP", "/livez"))
        out("[etcd] Waiting for the new etcd member to join the cluster. This can take up to 40s")
        cp_timeout = parse_duration(timeouts.get("controlPlaneComponentHealthCheck", "4m0s"))
        if wait_http(f"https://{adv}:{port}/readyz", cp_timeout) is None:
            raise Fail("error execution phase control-plane-join/etcd: the API server on this "
                       f"node did not become ready in {format_duration(cp_timeout)}")
        out(f"[mark-control-plane] Marking the node {node} as control-plane by adding the labels:"
            " [node-role.kubernetes.io/control-plane node.kubernetes.io/exclude-from-external-"
            "load-balancers]")
        taints = nr.get("taints")
        if taints is None:
            taints = [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]
        self._mark_control_plane(admin, node, taints)
        out("\nThis node has joined the cluster and a new control plane instance was created:\n")
        out("* Certificate signing request was sent to apiserver and approval was received.")
        out("* The Kubelet was informed of the new secure connection details.")
        out("* Control plane label and taint were applied to the new node.")
        out("* The Kubernetes control plane instances scaled up.")
        out("* A new etcd member was added to the local/stacked etcd cluster.\n")
        out("To start administering your cluster from this node, you need to run the following "
            "as a regular user:\n")
        out("\tmkdir -p $HOME/.kube")
        out("\tsudo cp -i /etc/kubernetes/admin.conf $HOME/.kube/config")
        out("\tsudo chown $(id -u):$(id -g) $HOME/.kube/config\n")
        out("Run 'kubectl get nodes' to see this node join the cluster.\n")

    @staticmethod
    def _leave_etcd() -> None:
        """A stacked-etcd control plane's reset: its member removed from the etcd cluster
        through its own etcd (when other members remain), as kubeadm's remove-etcd-member
        phase does; a lone member just goes with /var/lib/etcd."""
        pki_ = f"{PKI}/etcd"
        e = Etcd("https://127.0.0.1:2379", P(f"{pki_}/ca.crt"),
                 P(f"{pki_}/healthcheck-client.crt"), P(f"{pki_}/healthcheck-client.key"),
                 timeout=5)
        try:
            members = e.call("/v3/cluster/member/list", {}).get("members") or []
            me = e.call("/v3/maintenance/status", {}).get("header", {}).get("member_id")
            if len(members) > 1 and me:
                e.call("/v3/cluster/member/remove", {"ID": me})
                out("[reset] Removed this node's member from the etcd cluster")
        except (StoreError, OSError, ValueError) as exc:
            sys.stderr.write(f"W1126 reset.go:124] [reset] Failed to remove etcd member: "
                             f"{exc}\n. Please manually remove this etcd member using "
                             "etcdctl\n")

    @staticmethod
    def _upload_certs(c: Client, key: str) -> None:
        """The cluster's CAs and service-account keys into Secret kube-system/kubeadm-certs,
        each encrypted with the certificate key as kubeadm does (pki.seal), owned by a bootstrap
        token that expires in two hours, so that the Secret goes with it."""
        if not re.fullmatch(r"[0-9a-f]{64}", key):
            raise Fail("error execution phase upload-certs: error uploading certs: error "
                       "decoding certificate key: encoding/hex: invalid byte")
        out('[upload-certs] Storing the certificates in Secret "kubeadm-certs" in the '
            '"kube-system" Namespace')
        data = {}
        for f in CONTROL_PLANE_SHARED:
            raw = (read(f"{PKI}/{f}") or "").encode()
            data[f.replace("/", "-")] = base64.b64encode(pki.seal(key, raw)).decode()
        tok = f"{rand_token_part(6)}.{rand_token_part(16)}"
        owner = create_token_secret(c, tok, 2 * 3600, "Proxy for managing TTL for the "
                                    "kubeadm-certs secret", ["authentication"], None)
        secret = {"metadata": {"name": "kubeadm-certs", "namespace": "kube-system",
                               "ownerReferences": [owner] if owner else []},
                  "type": "Opaque", "data": data}
        path = "/api/v1/namespaces/kube-system/secrets"
        try:
            c.request("POST", path, secret)
        except ApiError as e:
            if e.code != 409:
                raise
            c.request("PUT", f"{path}/kubeadm-certs", secret)
        out("[upload-certs] Using certificate key:")
        out(key)

    @staticmethod
    def _download_certs(c: Client, key: str) -> None:
        """`join --control-plane`: the shared certificates from kubeadm-certs, decrypted."""
        out('[download-certs] Downloading the certificates in Secret "kubeadm-certs" in the '
            '"kube-system" Namespace')
        try:
            sec = c.get("/api/v1/namespaces/kube-system/secrets/kubeadm-certs")
        except ApiError as e:
            raise Fail("error execution phase control-plane-prepare/download-certs: error "
                       "downloading certs: error downloading the secret: Secret "
                       '"kubeadm-certs" was not found in the "kube-system" Namespace. This Secret '
                       "might have expired. Please, run `kubeadm init phase upload-certs "
                       "--upload-certs` on a control plane to generate a new one") from e
        for f in CONTROL_PLANE_SHARED:
            blob = base64.b64decode((sec.get("data") or {}).get(f.replace("/", "-"), ""))
            try:
                raw = pki.unseal(key, blob)
            except pki.PKIError as e:
                raise Fail("error execution phase control-plane-prepare/download-certs: error "
                           "downloading certs: error decoding secret data with provided key: "
                           f"{e}") from e
            write(f"{PKI}/{f}", raw.decode(), 0o600 if f.endswith(".key") else 0o644)

    @staticmethod
    def _create(c: Client, path: str, obj: Obj) -> None:
        try:
            c.request("POST", path, obj)
        except ApiError as e:
            if e.code != 409:
                raise

    def _mark_control_plane(self, c: Client, node: str, taints: list[Obj]) -> None:
        deadline = time.monotonic() + 240
        while True:
            try:
                n = c.get(f"/api/v1/nodes/{node}")
                break
            except ApiError as e:
                if e.code != 404 or time.monotonic() > deadline:
                    raise Fail("error execution phase mark-control-plane: timed out waiting for "
                               f'the condition: nodes "{node}" not found') from e
                time.sleep(0.5)
        md = n["metadata"]
        md.setdefault("labels", {}).update({"node-role.kubernetes.io/control-plane": "",
                                            "node.kubernetes.io/exclude-from-external-load-"
                                            "balancers": ""})
        md.setdefault("annotations", {})["kubeadm.alpha.kubernetes.io/cri-socket"] = \
            nodeinfo.CRI_SOCKET
        spec = n.setdefault("spec", {})
        have = spec.get("taints") or []
        spec["taints"] = have + [t for t in taints if t not in have]
        c.request("PUT", f"/api/v1/nodes/{node}", n)

    def _addons(self, c: Client, cc: Obj) -> None:
        dns = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {
            "name": "coredns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
                     "template": {"metadata": {"labels": {"k8s-app": "kube-dns"}}, "spec": {
                         "priorityClassName": "system-cluster-critical",
                         "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"},
                                         {"key": "node-role.kubernetes.io/control-plane",
                                          "effect": "NoSchedule"}],
                         "containers": [{"name": "coredns",
                                         "image": "registry.k8s.io/coredns/coredns:v1.12.4",
                                         "args": ["-conf", "/etc/coredns/Corefile"],
                                         "resources": {"requests": {"cpu": "100m",
                                                                    "memory": "70Mi"},
                                                       "limits": {"memory": "170Mi"}}}]}}}}
        self._create(c, "/apis/apps/v1/namespaces/kube-system/deployments", dns)
        self._create(c, "/api/v1/namespaces/kube-system/services", {
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {
                "k8s-app": "kube-dns", "kubernetes.io/cluster-service": "true",
                "kubernetes.io/name": "CoreDNS"}},
            "spec": {"clusterIP": "10.96.0.10", "selector": {"k8s-app": "kube-dns"},
                     "ports": [{"name": "dns", "port": 53, "protocol": "UDP"},
                               {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]}})
        out("[addons] Applied essential addon: CoreDNS")
        proxy = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {
            "name": "kube-proxy", "namespace": "kube-system", "labels": {"k8s-app": "kube-proxy"}},
            "spec": {"selector": {"matchLabels": {"k8s-app": "kube-proxy"}},
                     "template": {"metadata": {"labels": {"k8s-app": "kube-proxy"}}, "spec": {
                         "hostNetwork": True, "priorityClassName": "system-node-critical",
                         "tolerations": [{"operator": "Exists"}],
                         "containers": [{"name": "kube-proxy", "image":
                                         f"registry.k8s.io/kube-proxy:{cc['kubernetesVersion']}",
                                         "command": ["/usr/local/bin/kube-proxy",
                                                     "--config=/var/lib/kube-proxy/config.conf",
                                                     "--hostname-override=$(NODE_NAME)"]}]}}}}
        self._create(c, "/apis/apps/v1/namespaces/kube-system/daemonsets", proxy)
        out("[addons] Applied essential addon: kube-proxy")

    # -------------------------------------------------------------- join
    def cmd_join(self) -> None:
        cfg = self.load_config(required=False)
        jc = cfg.get("JoinConfiguration")
        if self.args.config and jc is None:
            raise Fail("no JoinConfiguration kind was found in the YAML file")
        jc = jc or {}
        disc = jc.get("discovery") or {}
        bt = disc.get("bootstrapToken") or {}
        endpoint = bt.get("apiServerEndpoint") or (self.args.args[0] if self.args.args else "")
        token = bt.get("token") or self.args.discovery_token or self.args.token or ""
        hashes = bt.get("caCertHashes") or self.args.discovery_token_ca_cert_hash or []
        unsafe = bt.get("unsafeSkipCAVerification") or \
            self.args.discovery_token_unsafe_skip_ca_verification
        tls_token = disc.get("tlsBootstrapToken") or self.args.tls_bootstrap_token or token
        nr = jc.get("nodeRegistration") or {}
        cri = nr.get("criSocket") or self.args.cri_socket or nodeinfo.CRI_SOCKET
        timeouts = jc.get("timeouts") or {}
        if not endpoint:
            raise Fail("discovery.bootstrapToken.apiServerEndpoint: Invalid value: \"\": "
                       "the API server endpoint must be set")
        if not TOKEN_RE.match(token):
            raise Fail(f'discovery.bootstrapToken.token: Invalid value: "{token}": the bootstrap '
                       'token is invalid')
        if not hashes and not unsafe:
            raise Fail("discovery.bootstrapToken: Invalid value: \"\": using token-based "
                       "discovery without caCertHashes can be unsafe. Set "
                       "unsafeSkipCAVerification as true in your kubeadm config file or pass "
                       "--discovery-token-unsafe-skip-ca-verification flag to continue")
        cpj = jc.get("controlPlane")
        as_cp = cpj is not None or self.args.control_plane
        cpj = cpj or {}
        cert_key = cpj.get("certificateKey") or self.args.certificate_key or ""
        lae = cpj.get("localAPIEndpoint") or {}
        adv = lae.get("advertiseAddress") or self.args.apiserver_advertise_address or \
            nodeinfo.ipv4()
        port = int(lae.get("bindPort") or self.args.apiserver_bind_port or 6443)
        out("[preflight] Running pre-flight checks")
        pf = Preflight(self._ignores(nr))
        if as_cp:
            for p_ in (port, 10259, 10257, 2379, 2380):
                pf.check(f"Port-{p_}", f"Port {p_} is in use" if port_in_use(p_) else None)
            pf.check("DirAvailable--var-lib-etcd",
                     "/var/lib/etcd is not empty" if dir_not_empty("/var/lib/etcd") else None)
        pf.check("DirAvailable--etc-kubernetes-manifests", f"{MANIFESTS} is not empty"
                 if dir_not_empty(MANIFESTS) else None)
        for f in ("/etc/kubernetes/kubelet.conf", "/etc/kubernetes/bootstrap-kubelet.conf",
                  "/etc/kubernetes/pki/ca.crt"):
            pf.check("FileAvailable-" + f.replace("/", "-"),
                     f"{f} already exists" if os.path.exists(P(f)) else None)
        pf.check("Port-10250", "Port 10250 is in use" if port_in_use(10250) else None)
        common_checks(pf, cri, kubelet_defaults(None))
        pf.finish()

        ca_pem, server = self._discover(endpoint, token, hashes, unsafe, timeouts)
        creds = kubeconfig.Creds(server=server, ca_pem=ca_pem, token=tls_token)
        c = Client(creds, agent="kubeadm", retry_for=60)
        out('[preflight] Reading configuration from the "kubeadm-config" ConfigMap in namespace '
            '"kube-system"...')
        out("[preflight] Use 'kubeadm init phase upload-config kubeadm --config "
            "your-config-file' to re-upload it.")
        try:
            kcm = c.get("/api/v1/namespaces/kube-system/configmaps/kubelet-config")
        except ApiError as e:
            raise Fail(f"error execution phase kubelet-start: {e}") from e
        kc = kubelet_defaults((yaml_load_all(kcm["data"]["kubelet"]) or [{}])[0])
        kc["containerRuntimeEndpoint"] = cri
        node = hostname_override(nr)
        cc: Obj = {}
        if as_cp:
            cc = self._prepare_control_plane(c, node, adv, port, cert_key)
            _leaf_validity(cc)
        try:
            existing = c.get(f"/api/v1/nodes/{node}")
            ready = next((x["status"] for x in existing.get("status", {}).get("conditions") or []
                          if x["type"] == "Ready"), "Unknown")
            if ready == "True":
                raise Fail(f'error execution phase kubelet-start: a Node with name "{node}" and '
                           'status "Ready" already exists in the cluster. You must delete the '
                           "existing Node or change the name of this new joining Node")
        except ApiError:
            pass
        write(f"{PKI}/ca.crt", ca_pem)
        write("/etc/kubernetes/bootstrap-kubelet.conf",
              kubeconfig.build(server, ca_pem, "tls-bootstrap-token-user", token=tls_token,
                               cluster="kubernetes"), 0o600)
        out('[kubelet-start] Writing kubelet configuration to file "/var/lib/kubelet/config.yaml"')
        write("/var/lib/kubelet/config.yaml", yaml_dump(kc))
        out('[kubelet-start] Writing kubelet environment file with flags to file '
            '"/var/lib/kubelet/kubeadm-flags.env"')
        write("/var/lib/kubelet/kubeadm-flags.env",
              kubelet_flags_env(cri, nr, nr.get("kubeletExtraArgs")))
        # TLS bootstrap (the real kubelet does this with bootstrap-kubelet.conf; the stand-in
        # kubeadm does it on the kubelet's behalf so the kubelet stand-in stays small).
        key_path = "/var/lib/kubelet/pki/kubelet-client.key.tmp"
        pki.gen_key(key_path)
        csr = pki.make_csr(key_path, f"system:node:{node}", ["system:nodes"])
        name = f"csr-{rand_token_part(5)}"
        c.request("POST", "/apis/certificates.k8s.io/v1/certificatesigningrequests", {
            "metadata": {"name": name},
            "spec": {"request": base64.b64encode(csr.encode()).decode(),
                     "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
                     "usages": ["digital signature", "client auth"],
                     "groups": ["system:bootstrappers"],
                     "username": f"system:bootstrap:{token.split('.')[0]}"}})
        out("[kubelet-start] Starting the kubelet")
        tls_t = parse_duration(timeouts.get("tlsBootstrap", "5m0s"))
        deadline = time.monotonic() + tls_t
        cert = None
        while time.monotonic() < deadline:
            st = c.get(f"/apis/certificates.k8s.io/v1/certificatesigningrequests/{name}").get(
                "status", {})
            if st.get("certificate"):
                cert = base64.b64decode(st["certificate"]).decode()
                break
            if any(x.get("type") == "Denied" for x in st.get("conditions") or []):
                break
            time.sleep(0.3)
        if cert is None:
            raise Fail("error execution phase kubelet-start: timed out waiting for the condition")
        key_pem = read(key_path) or ""
        os.unlink(P(key_path))
        write("/var/lib/kubelet/pki/kubelet-client-current.pem", cert + key_pem, 0o600)
        write("/etc/kubernetes/kubelet.conf", kubeconfig.build(
            server, ca_pem, "default-auth",
            cert_file="/var/lib/kubelet/pki/kubelet-client-current.pem",
            key_file="/var/lib/kubelet/pki/kubelet-client-current.pem",
            cluster="default-cluster"), 0o600)
        os.unlink(P("/etc/kubernetes/bootstrap-kubelet.conf"))
        systemctl("restart", "kubelet")
        self._wait_kubelet(timeouts)
        out("[kubelet-start] Waiting for the kubelet to perform the TLS Bootstrap\n")
        if as_cp:
            self._join_control_plane(node, adv, port, cc, nr, timeouts)
            return
        out("This node has joined the cluster:")
        out("* Certificate signing request was sent to apiserver and a response was received.")
        out("* The Kubelet was informed of the new secure connection details.\n")
        out("Run 'kubectl get nodes' on the control-plane to see this node join the cluster.\n")

    def _discover(self, endpoint: str, token: str, hashes: list[str], unsafe: bool,
                  timeouts: Obj) -> tuple[str, str]:
        tid = token.split(".")[0]
        server = f"https://{endpoint}"
        c = Client(kubeconfig.Creds(server=server, insecure=True), timeout=10, agent="kubeadm")
        deadline = time.monotonic() + parse_duration(timeouts.get("discovery", "5m0s"))
        pre = "error execution phase preflight: couldn't validate the identity of the API Server: "
        last = ""
        while True:
            try:
                cm = c.get("/api/v1/namespaces/kube-public/configmaps/cluster-info")
                data = cm.get("data") or {}
                sig = data.get(f"jws-kubeconfig-{tid}")
                if sig:
                    break
                last = f'could not find a JWS signature in the cluster-info ConfigMap for token ' \
                       f'ID "{tid}"'
            except Unreachable as e:
                host, port = endpoint.rsplit(":", 1)
                last = (f'failed to request the cluster-info ConfigMap: Get "{server}/api/v1/'
                        f'namespaces/kube-public/configmaps/cluster-info?timeout=10s": dial tcp '
                        f"{host}:{port}: connect: "
                        f"{'connection refused' if e.refused else e}")
            except ApiError as e:
                last = f"failed to request the cluster-info ConfigMap: {e}"
            if time.monotonic() >= deadline:
                raise Fail(pre + last)
            time.sleep(1)
        kc_text = data.get("kubeconfig", "")
        if not hmac.compare_digest(jws_detached(kc_text, token), sig):
            raise Fail(pre + "failed to verify JWS signature of received cluster info object, "
                       "can't trust this API Server")
        cluster = ((yaml_load_all(kc_text) or [{}])[0].get("clusters") or [{}])[0].get(
            "cluster") or {}
        ca_pem = base64.b64decode(cluster.get("certificate-authority-data", "")).decode()
        creds = kubeconfig.Creds(server=cluster.get("server", server), ca_pem=ca_pem)
        actual = pki.ca_cert_hash(ca_pem)
        if not unsafe and actual.lower() not in [h.lower() for h in hashes]:
            raise Fail(pre + f'cluster CA found in cluster-info ConfigMap is invalid: none of the '
                       f'public keys "{actual}" are pinned')
        return ca_pem, creds.server

    # -------------------------------------------------------------- certs
    #: what `kubeadm certs renew all` renews, in its order, with the line it prints for each:
    #: (file under /etc/kubernetes, the CA under pki/, what it is)
    RENEWED = (
        ("admin.conf", "ca", "certificate embedded in the kubeconfig file for the admin to use "
         "and for kubeadm itself"),
        ("pki/apiserver.crt", "ca", "certificate for serving the Kubernetes API"),
        ("pki/apiserver-etcd-client.crt", "etcd/ca", "certificate the apiserver uses to access "
         "etcd"),
        ("pki/apiserver-kubelet-client.crt", "ca", "certificate for the API server to connect "
         "to kubelet"),
        ("controller-manager.conf", "ca", "certificate embedded in the kubeconfig file for the "
         "controller manager to use"),
        ("pki/etcd/healthcheck-client.crt", "etcd/ca", "certificate for liveness probes to "
         "healthcheck etcd"),
        ("pki/etcd/peer.crt", "etcd/ca", "certificate for etcd nodes to communicate with each "
         "other"),
        ("pki/etcd/server.crt", "etcd/ca", "certificate for serving etcd"),
        ("pki/front-proxy-client.crt", "front-proxy-ca", "certificate for the front proxy "
         "client"),
        ("scheduler.conf", "ca", "certificate embedded in the kubeconfig file for the scheduler "
         "manager to use"),
        ("super-admin.conf", "ca", "certificate embedded in the kubeconfig file for the "
         "super-admin"),
    )

    def cmd_certs(self) -> None:
        """`kubeadm certs renew all` (gpuk8s/day2/certs.py): every certificate of RENEWED
        that exists gets a new key and a certificate with the old one's attributes for a
        year, signed by its CA; a kubeconfig's embedded client certificate and key are
        replaced; nothing is restarted; a missing file is `MISSING! <what>`. The lines, their
        order (by name) and the new key per certificate: cmd/kubeadm/app/cmd/certs.go,
        phases/certs/renewal/manager.go (certToConfig: CN, O, SANs, usages),
        filerenewer.go (pkiutil.NewCertAndKey) and readwriter.go of Kubernetes (read at the
        newest stored versions, about v1.33: the v1.36 tag was out of reach; the header's
        second line as kubeadm v1.34 prints it). kubeadm's other certs subcommands (and
        renewing one certificate by name) are not played: nothing in gpuk8s runs them."""
        sub = self.args.args[:2]
        if sub != ["renew", "all"]:
            raise Fail(f'unknown command "{" ".join(self.args.args)}" for "kubeadm certs"')
        if self.args.config:  # the file's ClusterConfiguration, as for init
            cc = self.load_config().get("ClusterConfiguration", {})
        else:
            out('[renew] Reading configuration from the "kubeadm-config" ConfigMap in '
                'namespace "kube-system"...')
            out("[renew] Use 'kubeadm init phase upload-config kubeadm --config "
                "your-config-file' to re-upload it.")
            cm = self._admin().get("/api/v1/namespaces/kube-system/configmaps/kubeadm-config")
            cc = (yaml_load_all(cm["data"]["ClusterConfiguration"]) or [{}])[0]
        _leaf_validity(cc)
        out("")
        for rel, ca, what in self.RENEWED:
            path = f"/etc/kubernetes/{rel}"
            ca_crt, ca_key = f"{PKI}/{ca}.crt", f"{PKI}/{ca}.key"
            if not os.path.exists(P(path)):
                out(f"MISSING! {what}")
                continue
            if rel.endswith(".crt"):
                key = path[:-4] + ".key"
                write(path, pki.renew(read(path) or "", key, ca_crt, ca_key, _key_algo(key)))
            else:
                self._renew_kubeconfig(path, ca_crt, ca_key)
            out(f"{what} renewed")
        out("")
        out("Done renewing certificates. You must restart the kube-apiserver, "
            "kube-controller-manager, kube-scheduler and etcd, so that they can use the new "
            "certificates.")

    @staticmethod
    def _renew_kubeconfig(path: str, ca_crt: str, ca_key: str) -> None:
        cfg = yaml_load_all(read(path) or "")[0]
        for entry in cfg.get("users") or []:
            user = entry.get("user") or {}
            if not user.get("client-certificate-data"):
                continue
            old = base64.b64decode(user["client-certificate-data"]).decode()
            key = f"/etc/kubernetes/tmp/renew-{os.path.basename(path)}.key"
            try:
                cert = pki.renew(old, key, ca_crt, ca_key, "RSA-2048")
                key_pem = read(key) or ""
            finally:
                with contextlib.suppress(OSError):
                    os.remove(P(key))
            user["client-certificate-data"] = base64.b64encode(cert.encode()).decode()
            user["client-key-data"] = base64.b64encode(key_pem.encode()).decode()
        write(path, yaml_dump(cfg), 0o600)

    # -------------------------------------------------------------- token
    def _admin(self) -> Client:
        path = self.args.kubeconfig or "/etc/kubernetes/admin.conf"
        real = path if os.path.exists(path) else P(path)
        if not os.path.exists(real):
            raise Fail(f"failed to load admin kubeconfig: open {path}: no such file or directory")
        return Client(kubeconfig.load(real), agent="kubeadm", retry_for=60)

    def cmd_token(self) -> None:
        """`kubeadm token create` (handoffs.mint_join); kubeadm's other token subcommands are
        not played: nothing in gpuk8s runs them."""
        sub = self.args.args[0] if self.args.args else ""
        if sub != "create":
            raise Fail(f'unknown command "{sub}" for "kubeadm token"')
        try:
            self._token_create()
        except Unreachable as e:
            raise Fail(f"failed to create or update bootstrap token with name bootstrap-token: "
                       f"unable to create Secret: Post \"https://{e.hostport}/api/v1/namespaces/"
                       f"kube-system/secrets?timeout=10s\": dial tcp {e.hostport}: connect: "
                       "connection refused") from e

    def _token_create(self) -> None:
        c = self._admin()
        tok = self.args.args[1] if len(self.args.args) > 1 else \
            f"{rand_token_part(6)}.{rand_token_part(16)}"
        if not TOKEN_RE.match(tok):
            raise Fail(f'the bootstrap token "{tok}" was not of the form '
                       f'"\\A([a-z0-9]{{6}})\\.([a-z0-9]{{16}})\\z"')
        ttl = parse_duration(self.args.ttl or "24h0m0s")
        create_token_secret(c, tok, ttl, self.args.description or "", None, None)
        if not self.args.print_join_command:
            out(tok)
            return
        ca_hash = pki.ca_cert_hash(c.creds.ca_pem or "")
        hostport = c.creds.server.removeprefix("https://")
        out(f"kubeadm join {hostport} --token {tok} --discovery-token-ca-cert-hash {ca_hash} ")

    # -------------------------------------------------------------- kubeconfig user
    def cmd_kubeconfig(self) -> None:
        """`kubeadm kubeconfig user` (cmd/kubeadm/app/cmd/kubeconfig.go@v1.36.0): --config
        and --client-name required; the kubeconfig of a client certificate signed by the
        cluster CA (CN the client name, O each --org; its key of the config's
        encryptionAlgorithm), valid --validity-period (default
        8760h, a warning past it), for the config's controlPlaneEndpoint (else its local API
        endpoint), printed on stdout. LAB SIMPLIFICATION: openssl 3.0 signs for whole days,
        so a validity is rounded up to days (24h is exact)."""
        if self.args.args[:1] != ["user"]:
            raise Fail(f"unknown command \"{' '.join(self.args.args)}\" for \"kubeadm "
                       "kubeconfig\"")
        missing = [f for f, v in (("client-name", self.args.client_name),
                                  ("config", self.args.config)) if v is None]
        if missing:
            raise Fail("required flag(s) " + ", ".join(f'"{f}"' for f in missing) + " not set")
        if not self.args.config:  # --config= given empty
            raise Fail("the kubeadm configuration path cannot be empty")
        cfg = self.load_config()
        ic, cc = cfg.get("InitConfiguration", {}), cfg.get("ClusterConfiguration", {})
        period = self.args.validity_period or "8760h0m0s"
        try:
            seconds = parse_duration(period)
        except ValueError as e:
            raise Fail(f'invalid argument "{period}" for "--validity-period" flag: '
                       f'time: invalid duration "{period}"') from e
        if seconds > 8760 * 3600:
            sys.stderr.write(f"W{time.strftime('%m%d %H:%M:%S')} WARNING: the specified "
                             f"certificate validity period {period} is longer than the default "
                             "duration 8760h0m0s, this may increase security risks.\n")
        endpoint = _api_endpoint(ic, cc)[2]
        ca_dir = cc.get("certificatesDir") or PKI
        ca_pem = read(f"{ca_dir}/ca.crt")
        if ca_pem is None or read(f"{ca_dir}/ca.key") is None:
            raise Fail(f"couldn't create a kubeconfig; the CA files couldn't be loaded: failure "
                       f"loading ca certificate: couldn't load the certificate file "
                       f"{ca_dir}/ca.crt: open {ca_dir}/ca.crt: no such file or directory")
        key = f"/tmp/.kubeadm-user-{os.getpid()}.key"
        pki.gen_key(key, cc.get("encryptionAlgorithm") or "RSA-2048")
        try:
            cert = pki.sign_csr(pki.make_csr(key, self.args.client_name, self.args.org or []),
                                f"{ca_dir}/ca.crt", f"{ca_dir}/ca.key",
                                days=max(1, math.ceil(seconds / 86400)))
            key_pem = read(key) or ""
        finally:
            os.unlink(P(key))
        sys.stdout.write(kubeconfig.build(f"https://{endpoint}", ca_pem, self.args.client_name,
                                          cert_pem=cert, key_pem=key_pem,
                                          cluster=cc.get("clusterName") or "kubernetes"))

    # -------------------------------------------------------------- upgrade
    def cmd_upgrade(self) -> None:
        """`kubeadm upgrade apply` and `upgrade node [phase kubelet-config]` (day2.kubernetes,
        roles/kubelet); kubeadm's other upgrade subcommands are not played: nothing in gpuk8s
        runs them."""
        sub = self.args.args[0] if self.args.args else ""
        if sub not in ("apply", "node"):
            raise Fail(f'unknown command "{sub}" for "kubeadm upgrade"' if sub else
                       'missing subcommand; "upgrade" is not meant to be run on its own')
        admin = os.path.exists(P("/etc/kubernetes/admin.conf"))
        if sub != "node" and not admin:
            raise Fail("couldn't create a Kubernetes client from file "
                       '"/etc/kubernetes/admin.conf": failed to load admin kubeconfig: open '
                       "/etc/kubernetes/admin.conf: no such file or directory")
        if admin:
            c = self._admin()
        else:
            conf = P("/etc/kubernetes/kubelet.conf")
            if not os.path.exists(conf):
                raise Fail("couldn't create a Kubernetes client from file "
                           '"/etc/kubernetes/kubelet.conf": open /etc/kubernetes/kubelet.conf: '
                           "no such file or directory")
            c = Client(kubeconfig.load(conf), agent="kubeadm", retry_for=60)
        out('[upgrade] Reading configuration from the "kubeadm-config" ConfigMap in namespace '
            '"kube-system"...')
        out("[upgrade] Use 'kubeadm init phase upload-config kubeadm --config your-config-file' "
            "to re-upload it.")
        try:
            cm = c.get("/api/v1/namespaces/kube-system/configmaps/kubeadm-config")
        except (ApiError, Unreachable) as e:
            raise Fail(f"error execution phase preflight: unable to fetch the kubeadm-config "
                       f"ConfigMap: {e}") from e
        cc = (yaml_load_all(cm["data"]["ClusterConfiguration"]) or [{}])[0]
        cluster = cc.get("kubernetesVersion") or "v0.0.0"
        if sub == "apply":
            self._upgrade_apply(c, cm, cc, cluster)
        elif self.args.args[1:] == ["phase", "kubelet-config"]:
            self._upgrade_kubelet_config(c)
        elif len(self.args.args) > 1:
            raise Fail(f'unknown command "{" ".join(self.args.args[1:])}" for "kubeadm upgrade '
                       'node"')
        else:
            self._upgrade_node(c, cluster)

    @staticmethod
    def _semver(v: str) -> tuple[int, int, int]:
        try:
            a, b, c = (int(x) for x in v.lstrip("v").split("-")[0].split(".")[:3])
        except ValueError as e:
            raise Fail(f'couldn\'t parse Kubernetes version "{v}"') from e
        return a, b, c

    def _cp_health(self, c: Client) -> None:
        out("[upgrade] Running cluster health checks")
        nodes = c.get("/api/v1/nodes").get("items") or []
        not_ready = [n["metadata"]["name"] for n in nodes
                     if "node-role.kubernetes.io/control-plane" in n["metadata"].get("labels", {})
                     and not any(x["type"] == "Ready" and x["status"] == "True"
                                 for x in n.get("status", {}).get("conditions") or [])]
        pf = Preflight([x for arg in self.args.ignore_preflight_errors or []
                        for x in arg.split(",")])
        pf.check("ControlPlaneNodesReady", f"there are NotReady control-planes in the cluster: "
                 f"[{' '.join(not_ready)}]" if not_ready else None)
        pf.finish()

    def _upgrade_apply(self, c: Client, cm: Obj, cc: Obj, cluster: str) -> None:
        if len(self.args.args) < 2:
            raise Fail("missing version argument (ex.: kubeadm upgrade apply v1.36.2)")
        target = self.args.args[1]
        target = target if target.startswith("v") else "v" + target
        out("[upgrade/preflight] Running preflight checks")
        self._cp_health(c)
        out(f'[upgrade/preflight] You have chosen to upgrade the cluster version to "{target}"')
        out(f"[upgrade/versions] Cluster version: {cluster}")
        out(f"[upgrade/versions] kubeadm version: {self.gv}")
        new, have, mine = self._semver(target), self._semver(cluster), self._semver(self.gv)
        mandatory, skippable = [], []
        if new[1] > have[1] + 1:
            mandatory.append(f'Specified version to upgrade to "{target}" is too high; kubeadm '
                             "can upgrade only 1 minor version at a time")
        if new[:2] > mine[:2]:
            mandatory.append(f'Specified version to upgrade to "{target}" is at least one minor '
                             f'release higher than the kubeadm minor release ({new[1]} > '
                             f"{mine[1]}). Such an upgrade is not supported")
        elif new > mine:
            skippable.append(f'Specified version to upgrade to "{target}" is higher than the '
                             f'kubeadm version "{self.gv}". Upgrade kubeadm first using the tool '
                             "you used to install kubeadm")
        if new < have:
            skippable.append(f'Specified version to upgrade to "{target}" is equal to or lower '
                             f'than the cluster version "{cluster}". Downgrades are not '
                             "supported yet")
        if mandatory or (skippable and not self.args.force):
            errs = "\n".join(f"\t- {e}" for e in mandatory + skippable)
            hint = "" if mandatory else "\n\nCan be bypassed if you pass the --force flag"
            raise Fail("error execution phase preflight: the version argument is invalid due to "
                       f"these errors:\n\n{errs}{hint}")
        if not self.args.yes:
            sys.stdout.write("[upgrade] Are you sure you want to proceed? [y/N]: ")
            sys.stdout.flush()
            if sys.stdin.readline().strip().lower() not in ("y", "yes"):
                raise Fail("error execution phase preflight: won't proceed; the user didn't "
                           "answer (Y|y) in order to continue")
        out(f'[upgrade/control-plane] Upgrading your static Pod-hosted control plane to version '
            f'"{target}" (timeout: 5m0s)...')
        self._upgrade_static_pods(target)
        wait = parse_duration("5m0s")
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:  # the kubelet restarts kube-apiserver at the new tag
            with contextlib.suppress(ApiError, Unreachable, OSError, ValueError):
                if c.get("/version").get("gitVersion") == target:
                    break
            time.sleep(0.5)
        else:
            raise Fail(f'error execution phase control-plane: couldn\'t upgrade control plane. '
                       f'kubeadm has tried to recover everything into the earlier state. Errors '
                       f'faced: timed out waiting for the condition: kube-apiserver did not '
                       f'come up at "{target}"')
        out('[apiclient] Found 1 Pods for label selector component=kube-apiserver')
        out('[upgrade/staticpods] Component "kube-apiserver" upgraded successfully!')
        out("[upgrade/control-plane] The control plane instance for this node was successfully "
            "upgraded!")
        cc["kubernetesVersion"] = target
        cm["data"]["ClusterConfiguration"] = yaml_dump(cc)
        c.request("PUT", "/api/v1/namespaces/kube-system/configmaps/kubeadm-config", cm)
        out('[upload-config] Storing the configuration used in ConfigMap "kubeadm-config" in the '
            '"kube-system" Namespace')
        out("[upgrade/kubeconfig] The kubeconfig files for this node were successfully upgraded!")
        out("[upgrade/kubelet-config] The kubelet configuration for this node was successfully "
            "upgraded!")
        with contextlib.suppress(ApiError):
            ds = c.get("/apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy")
            for ctr in ds["spec"]["template"]["spec"]["containers"]:
                ctr["image"] = f"registry.k8s.io/kube-proxy:{target}"
            c.request("PUT", "/apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy", ds)
        out("[addons] Applied essential addon: CoreDNS")
        out("[addons] Applied essential addon: kube-proxy")
        out(f'\n[upgrade] SUCCESS! A control plane node of your cluster was upgraded to '
            f'"{target}".\n')
        out("[upgrade] Now please proceed with upgrading the rest of the nodes by following the "
            "right order.")

    def _upgrade_static_pods(self, target: str) -> None:
        stamp = time.strftime("%Y-%m-%d-%H-%M-%S")
        backup = f"/etc/kubernetes/tmp/kubeadm-backup-manifests-{stamp}"
        for comp in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
            path = f"{MANIFESTS}/{comp}.yaml"
            text = read(path)
            if text is None:
                raise Fail(f"error execution phase control-plane: couldn't upgrade control plane: "
                           f"the static Pod manifest {path} is missing")
            pod = yaml_load_all(text)[0]
            out(f'[upgrade/staticpods] Preparing for "{comp}" upgrade')
            write(f"{backup}/{comp}.yaml", text, 0o600)
            pod["spec"]["containers"][0]["image"] = f"registry.k8s.io/{comp}:{target}"
            out(f'[upgrade/staticpods] Moving new manifest to "{path}" and backing up old '
                f'manifest to "{backup}/{comp}.yaml"')
            write(path, yaml_dump(pod), 0o600)
            if comp != "kube-apiserver":
                out(f'[upgrade/staticpods] Component "{comp}" upgraded successfully!')

    def _upgrade_node(self, c: Client, cluster: str) -> None:
        out("[upgrade/preflight] Running pre-flight checks")
        is_cp = os.path.exists(P(f"{MANIFESTS}/kube-apiserver.yaml"))
        if is_cp:
            self._upgrade_static_pods(cluster)
        else:
            out("[upgrade/preflight] Skipping prepull. Not a control plane node.")
            out("[upgrade/control-plane] Skipping phase. Not a control plane node.")
            out("[upgrade/kubeconfig] Skipping phase. Not a control plane node.")
        self._upgrade_kubelet_config(c)
        if not is_cp:
            out("[upgrade/addon] Skipping the addon/coredns phase. Not a control plane node.")
            out("[upgrade/addon] Skipping the addon/kube-proxy phase. Not a control plane node.")

    @staticmethod
    def _upgrade_kubelet_config(c: Client) -> None:
        """`kubeadm upgrade node`'s kubelet-config phase: /var/lib/kubelet/config.yaml from the
        kubelet-config ConfigMap (the node keeps its own runtime endpoint)."""
        try:
            kcm = c.get("/api/v1/namespaces/kube-system/configmaps/kubelet-config")
        except ApiError as e:
            raise Fail(f"error execution phase kubelet-config: {e}") from e
        local = (yaml_load_all(read("/var/lib/kubelet/config.yaml") or "") or [{}])[0]
        kc = kubelet_defaults((yaml_load_all(kcm["data"]["kubelet"]) or [{}])[0])
        kc["containerRuntimeEndpoint"] = local.get("containerRuntimeEndpoint") or \
            nodeinfo.CRI_SOCKET
        backup = f"/etc/kubernetes/tmp/kubeadm-kubelet-config{os.getpid()}"
        out(f"[upgrade] Backing up kubelet config file to {backup}/config.yaml")
        write(f"{backup}/config.yaml", read("/var/lib/kubelet/config.yaml") or "")
        out('[kubelet-start] Writing kubelet configuration to file "/var/lib/kubelet/config.yaml"')
        write("/var/lib/kubelet/config.yaml", yaml_dump(kc))
        out("[upgrade/kubelet-config] The kubelet configuration for this node was successfully "
            "upgraded!")

    # -------------------------------------------------------------- reset
    def cmd_reset(self) -> None:
        if not self.args.force:
            sys.stdout.write("W1126 reset.go:141] [reset] WARNING: Changes made to this host by "
                             "'kubeadm init' or 'kubeadm join' will be reverted.\n[reset] Are you "
                             "sure you want to proceed? [y/N]: ")
            sys.stdout.flush()
            if sys.stdin.readline().strip().lower() not in ("y", "yes"):
                raise Fail("won't proceed; the user didn't answer (Y|y) in order to continue")
        out("[preflight] Running pre-flight checks")
        is_cp = os.path.exists(P(f"{MANIFESTS}/etcd.yaml"))
        if not is_cp:
            out("[reset] No etcd config found. Assuming external etcd")
            out("[reset] Please, manually reset etcd to prevent further issues")
        if is_cp:
            self._leave_etcd()
        out("[reset] Stopping the kubelet service")
        systemctl("stop", "kubelet")
        # the real reset removes all Kubernetes containers through the CRI
        systemctl("stop", "kube-apiserver-standin")
        systemctl("stop", "etcd-static-pod")
        out('[reset] Unmounting mounted directories in "/var/lib/kubelet"')
        if is_cp or dir_not_empty("/var/lib/etcd"):
            _empty_dir("/var/lib/etcd")
            out("[reset] Deleted contents of the etcd data directory: /var/lib/etcd")
        dirs = [MANIFESTS, "/var/lib/kubelet", PKI]
        out(f"[reset] Deleting contents of directories: [{' '.join(dirs)}]")
        for d in dirs:
            _empty_dir(d)
        files = [f"/etc/kubernetes/{f}" for f in KUBECONFIGS]
        out(f"[reset] Deleting files: [{' '.join(files)}]")
        for f in files:
            with contextlib.suppress(OSError):
                os.unlink(P(f))
        out("\nThe reset process does not perform cleanup of CNI plugin configuration,\n"
            "network filtering rules and kubeconfig files.\n\n"
            "For information on how to perform this cleanup manually, please see:\n"
            "    https://k8s.io/docs/reference/setup-tools/kubeadm/kubeadm-reset/\n")
        out("The reset process does not clean CNI configuration. To do so, you must remove "
            "/etc/cni/net.d\n")
        out('The reset process does not reset or clean up iptables rules or IPVS tables.\n'
            'If you wish to reset iptables, you must do so manually by using the "iptables" '
            "command.\n\nIf your cluster was setup to utilize IPVS, run ipvsadm --clear (or "
            "similar)\nto reset your system's IPVS tables.\n")
        out("The reset process does not clean your kubeconfig files and you must remove them "
            "manually.\nPlease, check the contents of the $HOME/.kube/config file.")


def _empty_dir(path: str) -> None:
    real = P(path)
    if not os.path.isdir(real):
        return
    for e in os.listdir(real):
        p = os.path.join(real, e)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(p)


def cluster_info_kubeconfig(server: str, ca_pem: str) -> str:
    return yaml_dump({"apiVersion": "v1", "clusters": [{"cluster": {
        "certificate-authority-data": base64.b64encode(ca_pem.encode()).decode(),
        "server": server}, "name": ""}], "contexts": None, "current-context": "", "kind": "Config",
        "preferences": {}, "users": None})


def create_token_secret(c: Client, tok: str, ttl: float, description: str,
                        usages: list[str] | None, groups: list[str] | None) -> Obj | None:
    """Create (or replace) the token's Secret; its ownerReference (for objects that must go
    when the token expires), None when the server did not say its uid."""
    tid, secret = tok.split(".")
    data = {"token-id": tid, "token-secret": secret}
    if description:
        data["description"] = description
    if ttl > 0:
        exp = now().timestamp() + ttl
        import datetime as dt

        data["expiration"] = ts(dt.datetime.fromtimestamp(int(exp), dt.UTC))
    for u in usages or ["signing", "authentication"]:
        data[f"usage-bootstrap-{u}"] = "true"
    data["auth-extra-groups"] = ",".join(groups or
                                         ["system:bootstrappers:kubeadm:default-node-token"])
    obj = {"metadata": {"name": f"bootstrap-token-{tid}", "namespace": "kube-system"},
           "type": "bootstrap.kubernetes.io/token",
           "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}
    try:
        made = c.request("POST", "/api/v1/namespaces/kube-system/secrets", obj)
    except ApiError as e:
        if e.code != 409:
            raise
        made = c.request("PUT", f"/api/v1/namespaces/kube-system/secrets/bootstrap-token-{tid}",
                         obj)
    uid = ((made or {}).get("metadata") or {}).get("uid") if isinstance(made, dict) else None
    return {"apiVersion": "v1", "kind": "Secret", "name": f"bootstrap-token-{tid}",
            "uid": uid, "controller": True, "blockOwnerDeletion": True} if uid else None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubeadm", add_help=False)
    p.add_argument("cmd", nargs="?")
    p.add_argument("args", nargs="*")
    p.add_argument("--config")
    p.add_argument("--skip-token-print", action="store_true")
    p.add_argument("--skip-certificate-key-print", action="store_true")
    p.add_argument("--upload-certs", action="store_true")
    p.add_argument("--control-plane", action="store_true")
    p.add_argument("--apiserver-advertise-address")
    p.add_argument("--apiserver-bind-port")
    p.add_argument("--certificate-key")
    p.add_argument("--patches")
    p.add_argument("--token")
    p.add_argument("--discovery-token")
    p.add_argument("--tls-bootstrap-token")
    p.add_argument("--discovery-token-ca-cert-hash", action="append")
    p.add_argument("--discovery-token-unsafe-skip-ca-verification", action="store_true")
    p.add_argument("--cri-socket")
    p.add_argument("--ignore-preflight-errors", action="append")
    p.add_argument("--ttl")
    p.add_argument("--description")
    p.add_argument("--print-join-command", action="store_true")
    p.add_argument("--kubeconfig")
    p.add_argument("-f", "--force", action="store_true")
    p.add_argument("-y", "--yes", action="store_true")
    p.add_argument("--v")
    p.add_argument("--cleanup-tmp-dir", action="store_true")
    p.add_argument("--client-name")
    p.add_argument("--org", action="append")
    p.add_argument("--validity-period")
    return p


def main(argv: list[str], version_raw: str) -> int:
    args, unknown = build_parser().parse_known_args(argv)
    if unknown:
        sys.stderr.write(f"unknown flag: {unknown[0].split('=')[0]}\n{STACK}\n")
        return 1
    k = Kubeadm(args, package_version(version_raw))
    fn = getattr(k, f"cmd_{(args.cmd or '').replace('-', '_')}", None)
    if fn is None:
        sys.stderr.write(f'unknown command "{args.cmd}" for "kubeadm"\n' if args.cmd else
                         "kubeadm: easily bootstrap a secure Kubernetes cluster\n")
        return 1
    try:
        fn()
    except Fail as e:
        sys.stdout.flush()
        sys.stderr.write(f"{e}\n" + (f"{STACK}\n" if e.hint else ""))
        return 1
    except ApiError as e:
        sys.stderr.write(f"{e}\n{STACK}\n")
        return 1
    return 0


def _api_endpoint(ic: Obj, cc: Obj) -> tuple[str, int, str]:
    """(advertise address, bind port, host:port clients use): the config's
    controlPlaneEndpoint, else the local API endpoint (kubeadmutil.GetControlPlaneEndpoint)."""
    lae = ic.get("localAPIEndpoint") or {}
    adv = lae.get("advertiseAddress") or nodeinfo.ipv4()
    port = int(lae.get("bindPort") or 6443)
    endpoint = cc.get("controlPlaneEndpoint") or f"{adv}:{port}"
    if ":" not in endpoint:
        endpoint += f":{port}"
    return adv, port, endpoint


def _leaf_validity(cc: Obj) -> None:
    """Leaf certificates live certificateValidityPeriod (ClusterConfiguration v1beta4, kubeadm
    1.31 on; default 8760h, a year), rounded up to whole days for openssl's -days."""
    period = cc.get("certificateValidityPeriod")
    if period:
        try:
            seconds = parse_duration(str(period))
        except ValueError as e:
            raise Fail(f'certificateValidityPeriod: invalid duration "{period}"') from e
        pki.LEAF_DAYS = max(1, math.ceil(seconds / 86400))


def _key_algo(key: str) -> str:
    """The kubeadm encryptionAlgorithm a key on the node was made with."""
    text = subprocess.run(["openssl", "pkey", "-in", P(key), "-noout", "-text"],
                          capture_output=True, text=True).stdout
    if "NIST CURVE: P-384" in text:
        return "ECDSA-P384"
    if "ASN1 OID: prime256v1" in text:
        return "ECDSA-P256"
    bits = next((w.strip("(") for w in text.split() if w.strip("(").isdigit()), "2048")
    return f"RSA-{bits}"
