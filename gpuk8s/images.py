"""`invoke images`: every container image the cluster and the workloads pull at the inventory's
versions, read from the same manifests and values gpuk8s applies, so an admin can mirror
exactly those (registry_mirrors). No host is contacted."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpuk8s.inventory import load_inventory
from gpuk8s.ops.kube import KUBEADM_IMAGES
from gpuk8s.report import untrusted
from gpuk8s.roles import render
from gpuk8s.session import role_vars

WORKLOADS = ("storage", "tensorflow-job", "eval", "distributed-tf", "jupyter", "tensorboard",
             "verify")


def _containers(doc: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every container and init container of an object's pod specs, however nested."""
    if not isinstance(doc, Mapping):
        return
    for key, value in doc.items():
        if key in ("containers", "initContainers") and isinstance(value, list):
            yield from (c for c in value if isinstance(c, Mapping))
        elif isinstance(value, Mapping):
            yield from _containers(value)
        elif isinstance(value, list):
            for item in value:
                yield from _containers(item)


def manifest_images(text: str) -> list[str]:
    return [str(c["image"]) for doc in yaml.safe_load_all(text) if doc
            for c in _containers(doc) if c.get("image")]


def kubeadm_images(vars: Mapping[str, Any]) -> list[tuple[str, str]]:
    minor = str(vars["kubernetes_version"])
    pinned = str(vars.get("kubernetes_package_version") or "")
    tag = f"v{pinned.split('-')[0]}" if pinned else f"v{minor}.<patch>"
    coredns, pause, etcd = KUBEADM_IMAGES[minor]
    why = "kubeadm (control plane, every node)"
    out = [(f"registry.k8s.io/{c}:{tag}", why) for c in
           ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy")]
    out += [(f"registry.k8s.io/coredns/coredns:{coredns}", why),
            (f"registry.k8s.io/pause:{pause}", why),
            (f"registry.k8s.io/etcd:{etcd}", why)]
    return out


def cluster_images(vars: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(image, what pulls it) for the cluster itself at these variables."""
    from gpuk8s.roles import ContainerRuntimeExports, exports

    sandbox = exports(ContainerRuntimeExports).sandbox_image(vars)
    out = [*kubeadm_images(vars), (sandbox, "containerd (pod sandbox)")]
    cni = str(vars["cni"])
    context = dict(vars)
    out += [(i, f"pod network ({cni})")
            for i in manifest_images(render("cni", f"cni/{cni}.yaml.j2", context))]
    if vars.get("gpu_allocation") == "dra":
        out += [(i, "NVIDIA DRA driver (GPU nodes, gpu_allocation: dra)") for i in
                manifest_images(render("gpu_cluster", "gpu/nvidia-dra-driver.yaml.j2", context))]
    else:
        out += [(i, "NVIDIA device plugin (GPU nodes)") for i in manifest_images(
            render("gpu_cluster", "gpu/nvidia-device-plugin.yaml.j2", context))]
    if vars.get("gpu_monitoring"):
        out += [(i, "GPU monitoring (gpu_monitoring)") for i in manifest_images(
            render("monitoring", "monitoring/gpu-monitoring.yaml.j2",
                   {**context, "prometheus_config_sha256": ""}))]
    return out


def workload_images(values_files: Sequence[str] = (), sets: Sequence[str] = (),
                    names: Sequence[str] = WORKLOADS) -> list[tuple[str, str]]:
    """(image, workload) for every workload of ``names`` at its values (defaults, files,
    --set)."""
    from gpuk8s.workloads import load_values
    from gpuk8s.workloads import render as render_workload

    out = []
    for name in names:
        values = load_values(name, values_files, sets)
        # verify runs one Job per GPU node, in two stages; one sample node shows its images
        extra = ({"gpu_nodes": [{"name": "gpu-node", "gpus": 1}], "stage": stage}
                 for stage in ("smi", "tf")) if name == "verify" else ({"nfs_server": "x"},)
        used = f"invoke {name}" if name == "verify" else f"invoke deploy {name}"
        for kw in extra:
            out += [(str(c["image"]), used) for d in render_workload(name, values, **kw)
                    for c in _containers(d) if c.get("image")]
    return out


def images(inventory: str | Path, *, sets: Sequence[str] = (),
           values_files: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Every image, once, with what pulls it: [{image, registry, used_by: [...]}]."""
    inv = load_inventory(inventory, overrides=list(sets))
    vars = role_vars(inv.control_planes[0]) if inv.control_planes else {}
    found: dict[str, list[str]] = {}
    for image, why in cluster_images(vars) + workload_images(values_files):
        if why not in found.setdefault(image, []):
            found[image].append(why)
    return [{"image": image, "registry": registry_of(image), "used_by": why}
            for image, why in found.items()]


def registry_of(image: str) -> str:
    """The registry an image reference pulls from (docker.io when the first part is no host)."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def _line(text: str) -> str:
    """Inventory or values text as one printed line: :func:`untrusted` (escape sequences
    shown, not run), and a line break or tab shown as ``\\n``/``\\t``, so a value can never
    add a line to the ``--output list`` a mirroring tool reads."""
    return untrusted(text).replace("\n", "\\n").replace("\t", "\\t")


def print_images(inventory: str | Path, *, sets: Sequence[str] = (),
                 values_files: Sequence[str] = (), output: str = "table") -> list[dict[str, Any]]:
    """Print the images (``output``: "table", "json", or "list": one reference per line, for
    a mirroring tool) and return them."""
    import json
    import sys

    rows = images(inventory, sets=sets, values_files=values_files)
    if output == "json":  # JSON escapes every control character itself
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    elif output == "list":
        sys.stdout.write("".join(f"{_line(r['image'])}\n" for r in rows))
    else:  # plain columns: an image reference is never cut to fit the terminal
        shown = [(_line(r["image"]), _line(", ".join(r["used_by"]))) for r in rows]
        width = max(len(image) for image, _ in shown)
        sys.stdout.write(f"{'IMAGE':<{width}}  PULLED BY\n")
        for image, used_by in shown:
            sys.stdout.write(f"{image:<{width}}  {used_by}\n")
        if any("<patch>" in r["image"] for r in rows):
            sys.stdout.write("\n<patch>: the kubeadm package installed decides "
                             "(kubernetes_package_version pins it); `kubeadm config images "
                             "list` on a node prints the exact tags\n")
    return rows
