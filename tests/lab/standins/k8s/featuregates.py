# LAB STAND-IN: not the real component-base featuregate. Test infrastructure for gpuk8s.
"""Feature gates known to the 1.36 stand-ins (a real subset) with stage, default and lock.

Errors use component-base's wording: 'unrecognized feature gate: X' and
'cannot set feature gate X to false, feature is locked to true'.
"""

from __future__ import annotations

GA, BETA, ALPHA, DEPRECATED = "", "BETA", "ALPHA", "DEPRECATED"

# name: (stage, default, locked)
GATES: dict[str, tuple[str, bool, bool]] = {
    "AllAlpha": (ALPHA, False, False),
    "AllBeta": (BETA, False, False),
    "ClusterTrustBundle": (BETA, False, False),
    "ClusterTrustBundleProjection": (BETA, False, False),
    "ComponentFlagz": (ALPHA, False, False),
    "ComponentStatusz": (ALPHA, False, False),
    "ContainerCheckpoint": (BETA, True, False),
    "CoordinatedLeaderElection": (BETA, False, False),
    "CPUManagerPolicyAlphaOptions": (ALPHA, False, False),
    "CPUManagerPolicyBetaOptions": (BETA, True, False),
    "DeploymentReplicaSetTerminatingReplicas": (BETA, True, False),
    "DRAAdminAccess": (BETA, True, False),
    "DRAConsumableCapacity": (ALPHA, False, False),
    "DRADeviceBindingConditions": (BETA, True, False),
    "DRADeviceTaints": (BETA, True, False),
    "DRAExtendedResource": (BETA, True, False),
    "DRAPartitionableDevices": (BETA, True, False),
    "DRAPrioritizedList": (GA, True, True),
    "DRAResourceClaimDeviceStatus": (BETA, True, False),
    "DynamicResourceAllocation": (GA, True, True),
    "GracefulNodeShutdown": (BETA, True, False),
    "GracefulNodeShutdownBasedOnPodPriority": (BETA, True, False),
    "HPAConfigurableTolerance": (BETA, True, False),
    "ImageVolume": (BETA, True, False),
    "InPlacePodVerticalScaling": (GA, True, True),
    "InPlacePodVerticalScalingExclusiveCPUs": (ALPHA, False, False),
    "JobManagedBy": (GA, True, True),
    "KubeletCrashLoopBackOffMax": (BETA, True, False),
    "KubeletFineGrainedAuthz": (BETA, True, False),
    "KubeletInUserNamespace": (ALPHA, False, False),
    "KubeletPodResourcesDynamicResources": (BETA, True, False),
    "KubeletPodResourcesGet": (BETA, True, False),
    "KubeletSeparateDiskGC": (GA, True, True),
    "LocalStorageCapacityIsolationFSQuotaMonitoring": (BETA, False, False),
    "MaxUnavailableStatefulSet": (BETA, True, False),
    "MemoryQoS": (ALPHA, False, False),
    "MutatingAdmissionPolicy": (BETA, False, False),
    "NodeLogQuery": (BETA, False, False),
    "NodeSwap": (GA, True, True),
    "PodLevelResources": (BETA, True, False),
    "PodObservedGenerationTracking": (GA, True, True),
    "ProcMountType": (BETA, True, False),
    "ResourceHealthStatus": (BETA, True, False),
    "SchedulerAsyncPreemption": (BETA, True, False),
    "SELinuxChangePolicy": (BETA, True, False),
    "SELinuxMount": (BETA, False, False),
    "StorageVersionMigrator": (ALPHA, False, False),
    "TopologyManagerPolicyAlphaOptions": (ALPHA, False, False),
    "TopologyManagerPolicyBetaOptions": (BETA, True, False),
    "UserNamespacesSupport": (BETA, True, False),
    "WatchList": (BETA, True, False),
    "WindowsGracefulNodeShutdown": (BETA, True, False),
}

# kubeadm's own gates (ClusterConfiguration.featureGates), 1.36 subset.
KUBEADM_GATES: dict[str, tuple[str, bool, bool]] = {
    "ControlPlaneKubeletLocalMode": (GA, True, True),
    "NodeLocalCRISocket": (BETA, True, False),
    "RootlessControlPlane": (ALPHA, False, False),
    "WaitForAllControlPlaneComponents": (GA, True, True),
}


class GateError(ValueError):
    pass


def _bool(v: object) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("true", "1"):
        return True
    if s in ("false", "0"):
        return False
    raise GateError(f"invalid value of {v}, err: strconv.ParseBool: parsing \"{v}\": "
                    "invalid syntax")


def parse_flag(value: str) -> dict[str, bool]:
    """--feature-gates=A=true,B=false -> {A: True, B: False} (not yet validated)."""
    out: dict[str, bool] = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        k, sep, v = part.partition("=")
        if not sep:
            raise GateError(f"missing bool value for {k}")
        out[k.strip()] = _bool(v)
    return out


def validate(gates: dict[str, object], known: dict[str, tuple[str, bool, bool]] | None = None
             ) -> dict[str, bool]:
    known = GATES if known is None else known
    out: dict[str, bool] = {}
    for name, raw in gates.items():
        if name not in known:
            raise GateError(f"unrecognized feature gate: {name}")
        val = _bool(raw)
        _stage, default, locked = known[name]
        if locked and val != default:
            raise GateError(f"cannot set feature gate {name} to {str(val).lower()}, "
                            f"feature is locked to {str(default).lower()}")
        out[name] = val
    return out


def effective(overrides: dict[str, bool]) -> dict[str, bool]:
    eff = {k: d for k, (_, d, _) in GATES.items() if k not in ("AllAlpha", "AllBeta")}
    for k, (stage, _, locked) in GATES.items():
        if locked or k in ("AllAlpha", "AllBeta"):
            continue
        if overrides.get("AllAlpha") and stage == ALPHA:
            eff[k] = True
        if overrides.get("AllBeta") and stage == BETA:
            eff[k] = True
    eff.update({k: v for k, v in overrides.items() if k not in ("AllAlpha", "AllBeta")})
    return eff


def metrics_lines(overrides: dict[str, bool]) -> list[str]:
    eff = effective(overrides)
    lines = ["# HELP kubernetes_feature_enabled [BETA] This metric records the data about the "
             "stage and enablement of a k8s feature.",
             "# TYPE kubernetes_feature_enabled gauge"]
    for name in sorted(eff):
        stage = GATES[name][0]
        lines.append(f'kubernetes_feature_enabled{{name="{name}",stage="{stage}"}} '
                     f"{1 if eff[name] else 0}")
    return lines
