"""kubeadm's patches for static Pod manifests (`patches.directory` in Init/JoinConfiguration,
or --patches), lab stand-in.

Files are named ``target[suffix][+patchtype].(json|yaml)`` and applied in name order to the
manifest of ``target`` (etcd, kube-apiserver, kube-controller-manager, kube-scheduler). The
stand-in implements the "json" (RFC 6902) and "merge" (RFC 7386) patch
types (with the API server stand-in's own code for them); "strategic", kubeadm's default, is
refused with a message saying so, rather than half-applied.
"""

from __future__ import annotations

import json
import os
import re

from . import merge
from .common import P, yaml_dump, yaml_load_all


class PatchError(Exception):
    """A patch file kubeadm would refuse (the message is kubeadm's error text)."""



_NAME = re.compile(r"^(etcd|kube-apiserver|kube-controller-manager|kube-scheduler|"
                   r"kubeletconfiguration|corednsdeployment)[^+.]*(?:\+(strategic|merge|json))?"
                   r"\.(json|yaml|yml)$")
_TYPES = {"json": "application/json-patch+json", "merge": "application/merge-patch+json",
          "strategic": "application/strategic-merge-patch+json"}


def apply(directory: str | None, target: str, text: str) -> tuple[str, list[str]]:
    """The manifest ``text`` of ``target`` with the patches of ``directory`` applied, and the
    lines kubeadm prints for them."""
    if not directory:
        return text, []
    said: list[str] = []
    folder = P(directory)
    try:
        names = sorted(os.listdir(folder))
    except OSError as e:
        raise PatchError(f"could not list patch files for path \"{directory}\": {e}") from e
    doc = yaml_load_all(text)[0]
    for name in names:
        m = _NAME.match(name)
        if not m or m[1] != target:
            continue
        kind = m[2] or "strategic"
        with open(os.path.join(folder, name)) as fh:
            body = fh.read()
        if kind == "strategic":
            raise PatchError(f"patch {directory}/{name}: strategic merge patches are not "
                             "implemented by the lab stand-in kubeadm; use +json or +merge")
        patch = json.loads(body) if m[3] == "json" else yaml_load_all(body)[0]
        try:  # the API server's own RFC 6902 / RFC 7386 code
            doc = merge.json_patch(doc, patch) if kind == "json" else merge.json_merge(doc, patch)
        except merge.PatchError as e:
            raise PatchError(f"patch {directory}/{name}: {e.message}") from e
        said.append(f'[patches] Applied patch of type "{_TYPES[kind]}" to target "{target}"')
    return (yaml_dump(doc) if said else text), said
