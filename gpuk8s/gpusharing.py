"""GPU sharing per host (``gpu_sharing``): what the inventory may say, and what it becomes for
NVIDIA's device plugin: one named config per distinct setting in a ConfigMap, a node label
(``nvidia.com/device-plugin.config``) that picks a node's config, and how many
``nvidia.com/gpu`` the node then offers.

The device plugin's config-manager reads the label and writes the chosen config for the plugin
(its documented per-node configuration). Time-slicing gives every GPU ``replicas`` schedulable
slots and no memory or fault isolation between the pods sharing it. MIG splits each GPU into
isolated instances (gpuk8s.mig); the plugin then offers them with its ``mixed`` strategy as
``nvidia.com/mig-<profile>``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuk8s import mig
from gpuk8s.checks import VarProblem, show

#: the node label config-manager reads, and the ConfigMap holding the configs
CONFIG_LABEL = "nvidia.com/device-plugin.config"
CONFIG_MAP = "nvidia-device-plugin-configs"
#: the label gpuk8s sets for how many slots each GPU of a node offers (GPU Feature Discovery's
#: name; gpuk8s does not run GFD)
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
#: the label gpuk8s sets for a MIG node's layout (the GPU Operator's MIG manager reads the same
#: name; gpuk8s applies the layout itself)
MIG_LABEL = "nvidia.com/mig.config"
MODES = ("none", "time-slicing", "mig")
#: more slots than this per GPU is almost certainly a typo (the plugin itself has no limit)
MAX_REPLICAS = 64


@dataclass(frozen=True, order=True)
class Sharing:
    """One host's GPU sharing: ``none``, time-slicing with ``replicas`` slots per GPU, or MIG
    with a ``layout`` (as written in the inventory, JSON-encoded to stay hashable)."""

    mode: str = "none"
    replicas: int = 1
    layout: str = ""

    @property
    def key(self) -> str:
        """The config's name: a ConfigMap key and the node label's value."""
        if self.mode == "mig":
            return "mig-mixed"
        return "none" if self.mode == "none" else f"time-slicing-{self.replicas}"

    @property
    def layout_value(self) -> Any:
        return json.loads(self.layout) if self.layout else None

    @property
    def layout_name(self) -> str:
        """all-3g.40gb, all-balanced, or "custom" for a list per GPU."""
        value = self.layout_value
        return value if isinstance(value, str) else "custom"

    def config(self) -> dict[str, Any]:
        """The device plugin's config file (version v1) for this setting."""
        strategy = "mixed" if self.mode == "mig" else "none"
        body: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": strategy}}
        if self.mode == "time-slicing":
            body["sharing"] = {"timeSlicing": {"resources": [
                {"name": "nvidia.com/gpu", "replicas": self.replicas}]}}
        return body

    def offered(self, gpus: int) -> int:
        """``nvidia.com/gpu`` a node with ``gpus`` GPUs offers under this setting."""
        return 0 if self.mode == "mig" else gpus * self.replicas

    def resources(self, gpus: int, model: str) -> dict[str, int]:
        """The NVIDIA resources a node with ``gpus`` GPUs of ``model`` offers: nvidia.com/gpu,
        or with MIG one nvidia.com/mig-<profile> per instance (ValueError when the layout
        does not suit the model)."""
        if self.mode == "mig":
            return mig.resources(mig.wanted(self.layout_value, model, gpus))
        return {"nvidia.com/gpu": self.offered(gpus)}


_EXAMPLE = ("write gpu_sharing: {mode: none}, or {mode: time-slicing, replicas: 4} "
            "(each GPU then takes 4 pods)")


_MIG_EXAMPLE = ("write gpu_sharing: {mode: mig, layout: all-3g.40gb} (or all-balanced, or one "
                "entry per GPU: layout: [[3g.40gb, 3g.40gb], {1g.10gb: 7}]); MIG runs on "
                f"{mig.CAPABLE}")


def check_gpu_sharing(name: str, value: dict[Any, Any]) -> VarProblem | None:
    """{mode: none} or {mode: time-slicing, replicas: N} with 2 <= N <= 64."""
    unknown = sorted(str(k) for k in value if k not in ("mode", "replicas", "layout"))
    if unknown:
        return VarProblem(name, f"{name} has unknown key(s) {', '.join(unknown)}", _EXAMPLE)
    if value.get("mode") == "mig":
        if "replicas" in value:
            return VarProblem(name, f"{name}: replicas needs mode time-slicing; MIG instances "
                              "are not time-sliced by gpuk8s", _MIG_EXAMPLE)
        if "layout" not in value:
            return VarProblem(name, f"{name}: mode mig needs a layout", _MIG_EXAMPLE)
        problem = mig.check_layout(name, value["layout"])
        return VarProblem(name, problem, _MIG_EXAMPLE) if problem else None
    if "layout" in value:
        return VarProblem(name, f"{name}: layout needs mode mig", _MIG_EXAMPLE)
    mode = value.get("mode", "none")
    if mode not in MODES:
        return VarProblem(name, f"{name}: mode {show(mode)} is not one of "
                          f"{', '.join(MODES)}", _EXAMPLE)
    replicas = value.get("replicas")
    if mode == "none":
        if replicas not in (None, 1):
            return VarProblem(name, f"{name}: replicas {show(replicas)} needs mode "
                              "time-slicing", _EXAMPLE)
        return None
    if isinstance(replicas, bool) or not isinstance(replicas, int) or \
            not 2 <= replicas <= MAX_REPLICAS:
        return VarProblem(name, f"{name}: time-slicing needs replicas, a whole number from 2 "
                          f"to {MAX_REPLICAS} (slots per GPU), got {show(replicas)}", _EXAMPLE)
    return None


def sharing_of(value: Mapping[str, Any] | None) -> Sharing:
    """A checked ``gpu_sharing`` value as a Sharing."""
    value = value or {}
    mode = str(value.get("mode", "none"))
    if mode == "mig":
        return Sharing(mode, 1, json.dumps(value.get("layout"), sort_keys=True))
    return Sharing(mode, int(value.get("replicas") or 1) if mode == "time-slicing" else 1)


def config_map(settings: Iterable[Sharing]) -> dict[str, Any]:
    """The ConfigMap of every setting in use (and ``none``, the default for unlabelled nodes):
    one key per setting, each a whole config file (JSON is YAML)."""
    keys = {s.key: s for s in [Sharing(), *settings]}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": CONFIG_MAP, "namespace": "kube-system"},
            "data": {k: json.dumps(s.config(), indent=2) + "\n"
                     for k, s in sorted(keys.items())}}


def node_labels(sharing: Sharing) -> dict[str, str | None]:
    """The labels that put a node on its config (and name its MIG layout; None removes the
    label from a node that left MIG)."""
    return {CONFIG_LABEL: sharing.key, REPLICAS_LABEL: str(sharing.replicas),
            MIG_LABEL: sharing.layout_name if sharing.mode == "mig" else None}
