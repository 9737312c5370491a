# LAB STAND-IN: not the real kube-apiserver. Test infrastructure for gpuk8s; never shipped to users.
"""The real Kubernetes 1.36 object schemas, for strict field validation, strategic merge patch and
server-side apply's field sets.

The schemas are not written here: the lab packages ship `k8s-schema-definitions.json`, the
`_definitions.json` of the PyPI package kubernetes-validate (v1.36.0-local-strict), which is the
upstream OpenAPI of Kubernetes 1.36 turned into JSON Schema. It carries each type's properties and
the list semantics of the real API (x-kubernetes-list-type, -list-map-keys, -patch-merge-key,
-patch-strategy). A kind with no schema (a CRD without one, a file missing) is never refused.
"""

from __future__ import annotations

import json
import os
from typing import Any

Obj = dict[str, Any]
FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "k8s-schema-definitions.json")
_DEFS: dict[str, Obj] | None = None
_BY_GVK: dict[tuple[str, str, str], Obj] = {}
# CRDs register their openAPIV3Schema here (group, version, kind) -> schema
CUSTOM: dict[tuple[str, str, str], Obj] = {}


def _path() -> str:
    """Beside this file in the lab packages; on the lab host, kubernetes-validate's own copy."""
    if os.path.exists(FILE):
        return FILE
    try:
        import kubernetes_validate  # type: ignore[import-untyped]
    except ImportError:
        return FILE
    return os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema",
                        "v1.36.0-local-strict", "_definitions.json")


def _load() -> dict[str, Obj]:
    global _DEFS
    if _DEFS is None:
        try:
            with open(_path()) as f:
                _DEFS = json.load(f)["$defs"]
        except (OSError, ValueError, KeyError):
            _DEFS = {}
        for d in _DEFS.values():
            for gvk in d.get("x-kubernetes-group-version-kind") or []:
                _BY_GVK[(gvk["group"], gvk["version"], gvk["kind"])] = d
    return _DEFS


def resolve(s: Obj | None) -> Obj | None:
    """Follow a `$ref` (and a oneOf of one real type) to the schema it names."""
    if not s:
        return None
    ref = s.get("$ref")
    if ref:
        return _load().get(ref.rsplit("/", 1)[-1])
    return s


def for_kind(group: str, version: str, kind: str) -> Obj | None:
    _load()
    return CUSTOM.get((group, version, kind)) or _BY_GVK.get((group, version, kind))


def _is_object(s: Obj) -> bool:
    t = s.get("type")
    types = t if isinstance(t, list) else [t]
    return "properties" in s or "object" in types


def child(s: Obj | None, key: str) -> Obj | None:
    """The schema of field `key` of an object schema (None: anything goes below)."""
    s = resolve(s)
    if s is None or s.get("x-kubernetes-preserve-unknown-fields"):
        return None
    props = s.get("properties")
    if props is not None and key in props:
        return props[key]
    extra = s.get("additionalProperties")
    if isinstance(extra, dict):
        return extra
    return None


def items(s: Obj | None) -> Obj | None:
    s = resolve(s)
    return resolve(s.get("items")) if s else None


def knows(s: Obj | None, key: str) -> bool:
    """Whether an object schema declares field `key` (schemas that allow anything say yes)."""
    s = resolve(s)
    if s is None or s.get("x-kubernetes-preserve-unknown-fields") or not _is_object(s):
        return True
    if "properties" not in s:
        return True
    return key in s["properties"] or isinstance(s.get("additionalProperties"), dict) \
        or s.get("additionalProperties") is True


def unknown_fields(obj: Any, s: Obj | None, path: str = "") -> list[str]:
    """Paths of fields the schema does not declare, as the real server's strict decoding names
    them: `spec.replica`, `spec.template.spec.containers[0].imagee`."""
    s = resolve(s)
    if s is None:
        return []
    out: list[str] = []
    if isinstance(obj, dict) and _is_object(s):
        for k, v in obj.items():
            here = f"{path}.{k}" if path else k
            if not knows(s, k):
                out.append(here)
                continue
            out += unknown_fields(v, child(s, k), here)
    elif isinstance(obj, list) and s.get("items") is not None:
        for i, v in enumerate(obj):
            out += unknown_fields(v, s.get("items"), f"{path}[{i}]")
    return out


def prune(obj: Any, s: Obj | None) -> None:
    """Drop the fields the schema does not declare, in place (what decoding into the real
    server's typed objects does to them)."""
    s = resolve(s)
    if s is None:
        return
    if isinstance(obj, dict) and _is_object(s):
        for k in list(obj):
            if not knows(s, k):
                del obj[k]
            else:
                prune(obj[k], child(s, k))
    elif isinstance(obj, list) and s.get("items") is not None:
        for v in obj:
            prune(v, s.get("items"))


def list_semantics(s: Obj | None) -> tuple[str, list[str]]:
    """('map', keys) | ('set', []) | ('atomic', []) for a list field (SSA's view)."""
    s = resolve(s) or {}
    kind = s.get("x-kubernetes-list-type")
    if kind == "map":
        return "map", list(s.get("x-kubernetes-list-map-keys") or [])
    if kind == "set":
        return "set", []
    if kind is None and s.get("x-kubernetes-patch-merge-key"):
        return "map", [s["x-kubernetes-patch-merge-key"]]
    return "atomic", []


def merge_key(s: Obj | None) -> tuple[str, str | None]:
    """Strategic merge patch: ('merge', key) for merged lists of objects, ('merge', None) for
    merged lists of scalars, ('replace', None) otherwise."""
    s = resolve(s) or {}
    strategy = str(s.get("x-kubernetes-patch-strategy") or "")
    if "merge" in strategy.split(","):
        return "merge", s.get("x-kubernetes-patch-merge-key")
    return "replace", None


def retains_keys(s: Obj | None) -> bool:
    s = resolve(s) or {}
    return "retainKeys" in str(s.get("x-kubernetes-patch-strategy") or "").split(",")
