# LAB STAND-IN: not the real kubeadm. Test infrastructure for gpuk8s; never shipped to users.
"""kubeadm config files: v1beta4 decoding with kubeadm's strictness and error texts."""

from __future__ import annotations

import copy
from typing import Any

from . import featuregates
from .common import parse_duration, yaml_load_all

Obj = dict[str, Any]
KUBEADM_GV = "kubeadm.k8s.io/v1beta4"
KUBEADM_KINDS = ("InitConfiguration", "ClusterConfiguration", "JoinConfiguration",
                 "ResetConfiguration", "UpgradeConfiguration")
SCHEME = "k8s.io/kubernetes/cmd/kubeadm/app/apis/kubeadm/scheme/scheme.go:31"

# Known top-level fields per kind (v1beta4) for strict decoding.
FIELDS: dict[str, set[str]] = {
    "InitConfiguration": {"bootstrapTokens", "dryRun", "nodeRegistration", "localAPIEndpoint",
                          "certificateKey", "skipPhases", "patches", "timeouts"},
    "ClusterConfiguration": {"etcd", "networking", "kubernetesVersion", "controlPlaneEndpoint",
                             "apiServer", "controllerManager", "scheduler", "dns", "proxy",
                             "certificatesDir", "imageRepository", "featureGates", "clusterName",
                             "encryptionAlgorithm", "certificateValidityPeriod",
                             "caCertificateValidityPeriod"},
    "JoinConfiguration": {"dryRun", "nodeRegistration", "caCertPath", "discovery",
                          "controlPlane", "skipPhases", "patches", "timeouts"},
    "ResetConfiguration": {"cleanupTmpDir", "certificatesDir", "criSocket", "dryRun", "force",
                           "ignorePreflightErrors", "skipPhases", "unmountFlags"},
    "UpgradeConfiguration": {"apply", "node", "plan", "diff", "timeouts"},
}
COMMON = {"apiVersion", "kind", "metadata"}
NODE_REG = {"name", "criSocket", "taints", "kubeletExtraArgs", "ignorePreflightErrors",
            "imagePullPolicy", "imagePullSerial"}
COMPONENT = {"extraArgs", "extraVolumes", "extraEnvs", "certSANs"}
TIMEOUTS = {"controlPlaneComponentHealthCheck", "kubeletHealthCheck", "kubernetesAPICall",
            "etcdAPICall", "tlsBootstrap", "discovery", "upgradeManifests"}


class ConfigError(ValueError):
    pass


def _arg_list(val: Any, field: str, struct: str) -> list[dict[str, str]]:
    if val is None:
        return []
    if not isinstance(val, list):
        kind = "object" if isinstance(val, dict) else type(val).__name__
        raise ConfigError(f"error unmarshaling JSON: while decoding JSON: json: cannot unmarshal "
                          f"{kind} into Go struct field {struct}.{field} of type []v1beta4.Arg")
    for a in val:
        if not isinstance(a, dict) or set(a) - {"name", "value"}:
            raise ConfigError(f'strict decoding error: unknown field "{field}"')
    return val


def _strict(obj: Obj, allowed: set[str], prefix: str) -> None:
    unknown = sorted(k for k in obj if k not in allowed)
    if unknown:
        raise ConfigError("strict decoding error: " + ", ".join(
            f'unknown field "{prefix}{k}"' for k in unknown))


def decode(text: str) -> dict[str, Obj]:
    """Split a multi-document config into kinds; refuse what kubeadm 1.36 refuses."""
    try:
        docs = yaml_load_all(text)
    except Exception as e:  # yaml.YAMLError
        raise ConfigError(f"error converting YAML to JSON: {e}") from e
    out: dict[str, Obj] = {}
    for d in docs:
        if not isinstance(d, dict):
            continue
        gv, kind = d.get("apiVersion", ""), d.get("kind", "")
        if not kind:
            raise ConfigError("Object 'Kind' is missing in '" + str(d)[:60] + "'")
        if gv.startswith("kubeadm.k8s.io/"):
            if gv != KUBEADM_GV or kind not in KUBEADM_KINDS:
                raise ConfigError(f'no kind "{kind}" is registered for version "{gv}" in scheme '
                                  f'"{SCHEME}"')
            _strict(d, FIELDS[kind] | COMMON, "")
            _check_kind(kind, d)
        elif kind == "KubeletConfiguration":
            if gv != "kubelet.config.k8s.io/v1beta1":
                raise ConfigError(f'no kind "{kind}" is registered for version "{gv}" in scheme '
                                  f'"{SCHEME}"')
            try:
                featuregates.validate(d.get("featureGates") or {})
            except featuregates.GateError as e:
                raise ConfigError(str(e)) from e
        elif kind == "KubeProxyConfiguration":
            if gv != "kubeproxy.config.k8s.io/v1alpha1":
                raise ConfigError(f'no kind "{kind}" is registered for version "{gv}" in scheme '
                                  f'"{SCHEME}"')
        else:
            raise ConfigError(f'no kind "{kind}" is registered for version "{gv}" in scheme '
                              f'"{SCHEME}"')
        if kind in out:
            raise ConfigError(f'invalid configuration: kind "{kind}" is specified twice')
        out[kind] = d
    if not out:
        raise ConfigError("no InitConfiguration or ClusterConfiguration kind was found in the "
                          "YAML file")
    return out


def _check_kind(kind: str, d: Obj) -> None:
    nr = d.get("nodeRegistration")
    if isinstance(nr, dict):
        _strict(nr, NODE_REG, "nodeRegistration.")
        _arg_list(nr.get("kubeletExtraArgs"), "nodeRegistration.kubeletExtraArgs",
                  "NodeRegistrationOptions")
    for comp in ("apiServer", "controllerManager", "scheduler"):
        c = d.get(comp)
        if isinstance(c, dict):
            _strict(c, COMPONENT, f"{comp}.")
            struct = {"apiServer": "APIServer"}.get(comp, "ControlPlaneComponent")
            _arg_list(c.get("extraArgs"), f"{comp}.extraArgs", struct)
    etcd_local = (d.get("etcd") or {}).get("local")
    if isinstance(etcd_local, dict):
        _arg_list(etcd_local.get("extraArgs"), "etcd.local.extraArgs", "LocalEtcd")
    to = d.get("timeouts")
    if isinstance(to, dict):
        _strict(to, TIMEOUTS, "timeouts.")
        for _k, v in to.items():
            try:
                parse_duration(str(v))
            except ValueError as e:
                raise ConfigError(f"error unmarshaling JSON: while decoding JSON: {e}") from e
    if kind == "ClusterConfiguration":
        try:
            featuregates.validate(d.get("featureGates") or {}, featuregates.KUBEADM_GATES)
        except featuregates.GateError as e:
            raise ConfigError(str(e)) from e
        for a in (d.get("apiServer") or {}).get("extraArgs") or []:
            if a.get("name") == "feature-gates":
                try:
                    featuregates.validate(featuregates.parse_flag(str(a.get("value", ""))))
                except featuregates.GateError as e:
                    raise ConfigError(str(e)) from e
    if kind == "JoinConfiguration":
        disc = d.get("discovery") or {}
        if "timeout" in disc:
            raise ConfigError('strict decoding error: unknown field "discovery.timeout"')
        bt = disc.get("bootstrapToken") or {}
        if not bt and not disc.get("file"):
            raise ConfigError("discovery: Invalid value: \"\": bootstrapToken or file must be "
                              "set")


def args_dict(args: list[dict[str, str]] | None) -> dict[str, str]:
    return {a["name"]: str(a.get("value", "")) for a in args or []}


def kubelet_defaults(kc: Obj | None) -> Obj:
    """The KubeletConfiguration kubeadm writes to /var/lib/kubelet/config.yaml."""
    base: Obj = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"cacheTTL": "0s",
                                                                         "enabled": True},
                           "x509": {"clientCAFile": "/etc/kubernetes/pki/ca.crt"}},
        "authorization": {"mode": "Webhook", "webhook": {"cacheAuthorizedTTL": "0s",
                                                         "cacheUnauthorizedTTL": "0s"}},
        "cgroupDriver": "systemd",
        "clusterDNS": ["10.96.0.10"],
        "clusterDomain": "cluster.local",
        "containerRuntimeEndpoint": "",
        "cpuManagerReconcilePeriod": "0s",
        "crashLoopBackOff": {},
        "evictionPressureTransitionPeriod": "0s",
        "fileCheckFrequency": "0s",
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "httpCheckFrequency": "0s",
        "imageMaximumGCAge": "0s",
        "imageMinimumGCAge": "0s",
        "logging": {"flushFrequency": 0, "options": {"json": {"infoBufferSize": "0"},
                                                     "text": {"infoBufferSize": "0"}},
                    "verbosity": 0},
        "memorySwap": {},
        "nodeStatusReportFrequency": "0s",
        "nodeStatusUpdateFrequency": "0s",
        "rotateCertificates": True,
        "runtimeRequestTimeout": "0s",
        "shutdownGracePeriod": "0s",
        "shutdownGracePeriodCriticalPods": "0s",
        "staticPodPath": "/etc/kubernetes/manifests",
        "streamingConnectionIdleTimeout": "0s",
        "syncFrequency": "0s",
        "volumeStatsAggPeriod": "0s",
    }
    for k, v in (copy.deepcopy(kc) or {}).items():
        base[k] = v
    return base
