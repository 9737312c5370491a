# LAB STAND-IN: not NVIDIA's device plugin, nor the real kubelet. Test infrastructure for gpuk8s;
# never shipped to users.
"""NVIDIA's device plugin (nvcr.io/nvidia/k8s-device-plugin v0.20.0), EMULATED by the kubelet
stand-in for its pod (daemons.py): what it registers with the kubelet (its resources, from the
node's GPU view and its config as its config-manager resolves it), the log it starts with, and
its start-up, which fails where it may not read MIG devices. Its Allocate answer and the
toolkit's part are programs.py's (device_plugin_allocation, device_plugin_sees_gpus)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import yaml

from . import gpuview, nodeinfo, programs
from .client import ApiError
from .common import klog, read

if TYPE_CHECKING:
    from .kubelet import Kubelet

Obj = dict[str, Any]
IMAGE = "k8s-device-plugin"
CONTAINER = "nvidia-device-plugin-ctr"
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"


def config_ok(config: Obj) -> bool:
    """Whether NVIDIA's device plugin starts with this config (v1): a known migStrategy and
    time-slicing replicas of at least 2 (else it exits, and config-manager restarts it)."""
    strategy = (config.get("flags") or {}).get("migStrategy") or "none"
    resources = ((config.get("sharing") or {}).get("timeSlicing") or {}).get("resources") or []
    return strategy in ("none", "single", "mixed") and all(
        isinstance(r, dict) and int(r.get("replicas", 1)) >= 2 for r in resources)


def resources_for(gpus: Sequence[gpuview.Gpu], config: Obj,
                  limit: int | None = None) -> dict[str, list[str]]:
    """What NVIDIA's device plugin advertises: resource name -> device IDs, from the node's GPUs
    (gpuview.View.gpus: `nvidia-smi -L` and each GPU's MIG mode; the real plugin asks NVML)
    and the plugin's (valid) config.

    migStrategy none: every GPU is one ``nvidia.com/gpu``. mixed: a GPU with MIG on offers
    each MIG device as ``nvidia.com/mig-<profile>`` (the plugin writes a profile's "+" as
    "."), the others stay ``nvidia.com/gpu``. single: every GPU must have MIG on with one
    profile, each MIG device is a ``nvidia.com/gpu`` (else the plugin fails: nothing). With
    time-slicing replicas R a device is R IDs ``<UUID>::<n>``, spread over the devices.
    ``limit``: the first GPUs only (those PCI lists)."""
    strategy = (config.get("flags") or {}).get("migStrategy") or "none"
    gpus = list(gpus)[:limit]
    out: dict[str, list[str]] = {}
    migged = [g.mig_mode == "Enabled" for g in gpus]
    if strategy == "single" and any(migged):
        profiles = {m.profile for g in gpus for m in g.migs}
        if not all(migged) or len(profiles) > 1:
            return {}   # "invalid MIG configuration": the plugin exits
    for g, on in zip(gpus, migged, strict=True):
        if on and strategy == "mixed":
            for m in g.migs:
                name = f"nvidia.com/mig-{m.profile.replace('+', '.')}"
                out.setdefault(name, []).append(m.uuid)
        elif on and strategy == "single":
            out.setdefault("nvidia.com/gpu", []).extend(m.uuid for m in g.migs)
        else:
            out.setdefault("nvidia.com/gpu", []).append(g.uuid)
    resources = ((config.get("sharing") or {}).get("timeSlicing") or {}).get("resources") or []
    for r in resources:
        ids = out.get(str(r.get("name")))
        if ids:
            out[r["name"]] = [f"{u}::{n}" for n in range(int(r.get("replicas", 1))) for u in ids]
    return {k: v for k, v in sorted(out.items()) if v}


def resources(k: Kubelet, pods: list[Obj]) -> dict[str, list[str]]:
    """The device plugin's resources (name -> device IDs), advertised only when it could
    really register: nvidia.com/gpu, or nvidia.com/mig-<profile> with migStrategy mixed."""
    pci = gpuview.pci_gpus()
    if not pci:
        return {}
    view = gpuview.View(kept=True)
    if not view.listed():
        return {}
    cfg = nodeinfo.containerd_config()
    if "nvidia" not in nodeinfo.runtime_handlers(cfg):
        return {}
    for p in pods:
        images = " ".join(c.get("image", "") for c in p["spec"].get("containers") or [])
        if IMAGE in images and p.get("status", {}).get("phase") == "Running" \
                and k.pod_runtime(p, cfg) == "nvidia":
            config = plugin_config(k, p)
            if config is None:
                return {}
            ctr: Obj = next((c for c in p["spec"].get("containers") or []
                             if c.get("name") == CONTAINER), {})
            k.plugin_container = ctr
            if not programs.device_plugin_sees_gpus(ctr, read(TOOLKIT_CONFIG)):
                return {}  # "No devices found. Waiting indefinitely."
            started = k.programs.get((p["metadata"]["uid"], CONTAINER))
            if started is not None and started[0].state != "ok":
                return {}  # it exited (MIG devices it may not read): nothing registered
            return resources_for(view.gpus(), config, len(pci))
    return {}


def plugin_config(k: Kubelet, pod: Obj) -> Obj | None:
    """The device plugin's config, resolved as its config-manager does: the node's
    NODE_LABEL value, else DEFAULT_CONFIG, else a key named "default" or the only key
    (FALLBACK_STRATEGIES named,single); a config it cannot find, read or accept leaves the
    plugin down (None: config-manager exits and is restarted). A plugin without
    config-manager runs on its defaults ({}: one nvidia.com/gpu per GPU)."""
    env: dict[str, str] = {}
    for c in pod["spec"].get("containers") or []:
        if c.get("command") == ["config-manager"]:
            env = {e["name"]: e.get("value", "") for e in c.get("env") or []}
    cm_name = next((v["configMap"]["name"] for v in pod["spec"].get("volumes") or []
                    if "configMap" in v and v.get("name") == "available-configs"), None)
    if not env or not cm_name:
        return {}
    try:
        node = k.client.get(f"/api/v1/nodes/{k.node_name}")
        data = k.client.get(f"/api/v1/namespaces/{pod['metadata']['namespace']}/"
                            f"configmaps/{cm_name}").get("data") or {}
    except ApiError:
        return None
    label = node["metadata"].get("labels", {}).get(env.get("NODE_LABEL", ""), "")
    name = label or env.get("DEFAULT_CONFIG", "")
    if not name:
        strategies = env.get("FALLBACK_STRATEGIES", "named,single").split(",")
        name = "default" if "named" in strategies and "default" in data else \
            next(iter(data)) if "single" in strategies and len(data) == 1 else ""
    if name not in data:
        klog("E", f'"Error: unable to get config" err="config {name!r} not found in '
             f'{cm_name}"', "main.go:113")
        return None
    try:
        config = yaml.safe_load(data[name]) or {}
        return config if config_ok(config) else None
    except (yaml.YAMLError, AttributeError, TypeError, ValueError):
        return None


def program(k: Kubelet, pod: Obj, container: Obj) -> programs.Outcome:
    """The device plugin on a node whose GPUs have MIG on, with migStrategy mixed: it
    reads every MIG device's memory and exits when it may not (programs.py)."""
    config = plugin_config(k, pod) or {}
    strategy = (config.get("flags") or {}).get("migStrategy") or "none"
    mig_on = gpuview.View(kept=True).mig_on()
    toolkit = nodeinfo.installed_version("nvidia-container-toolkit")
    if strategy != "none" and mig_on and \
            not programs.device_plugin_mig_ok(container, toolkit):
        return programs.Outcome("crash", [
            'I1126 00:00:00.000000       1 main.go:235] "Starting NVIDIA Device Plugin"',
            programs.DEVICE_PLUGIN_MIG_ERROR], 1)
    return programs.Outcome("ok", (read(k.log_path(pod, container["name"])) or ""
                                   ).splitlines())


def start_log(k: Kubelet, handler: str | None) -> str:
    """The log a device plugin container starts with (the kubelet writes it when it starts
    the pod; ``handler``: the pod's runtime handler)."""
    head = "I1126 00:00:00.000000       1 main.go:235] \"Starting NVIDIA Device Plugin\"\n"
    if handler != "nvidia" or gpuview.View(kept=True).listing() is None:
        return head + ("I1126 00:00:00.000000       1 factory.go:112] Incompatible platform "
                       "detected\nE1126 00:00:00.000000       1 factory.go:113] If this is a "
                       "GPU node, did you configure the NVIDIA Container Toolkit?\n"
                       "I1126 00:00:00.000000       1 main.go:381] No devices found. Waiting "
                       "indefinitely.\n")
    return head + "".join(
        f"I1126 00:00:00.000000       1 server.go:176] \"Starting GRPC server\" "
        f"resourceName=\"{name}\"\nI1126 00:00:00.000000       1 server.go:199] "
        f"\"Registered device plugin with Kubelet\" resourceName=\"{name}\"\n"
        for name in (sorted(k.devices) or ["nvidia.com/gpu"]))
