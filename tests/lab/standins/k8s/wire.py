# LAB STAND-IN: not the real kube-apiserver. Test infrastructure for gpuk8s; never shipped to users.
"""Just enough of Kubernetes' protobuf encoding to read what typed clients send (kubectl's
`auth can-i` and `auth whoami` post their reviews as application/vnd.kubernetes.protobuf).

The envelope is the 4-byte magic "k8s\\0" and a runtime.Unknown message (1: typeMeta {1:
apiVersion, 2: kind}, 2: raw, 3: contentEncoding, 4: contentType); raw is the object's own message.
Answers go back as JSON, which every client lists in its Accept header.
"""

from __future__ import annotations

import base64
from typing import Any

MAGIC = b"k8s\x00"
Fields = dict[int, list[Any]]


class WireError(ValueError):
    pass


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = out = 0
    while True:
        if i >= len(buf):
            raise WireError("truncated varint")
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, i
        shift += 7


def fields(buf: bytes) -> Fields:
    """One message's fields by number (length-delimited values stay bytes)."""
    out: Fields = {}
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(buf, i)
        elif wt == 2:
            n, i = _varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise WireError(f"unsupported wire type {wt}")
        out.setdefault(num, []).append(v)
    return out


def text(f: Fields, num: int) -> str:
    v = f.get(num)
    return v[-1].decode() if v else ""


def sub(f: Fields, num: int) -> Fields | None:
    v = f.get(num)
    return fields(v[-1]) if v else None


def unwrap(body: bytes) -> tuple[str, str, Fields]:
    """(apiVersion, kind, fields of the object) of a k8s protobuf body."""
    if not body.startswith(MAGIC):
        raise WireError("not a Kubernetes protobuf body (no k8s magic)")
    env = fields(body[len(MAGIC):])
    tm = sub(env, 1) or {}
    return text(tm, 1), text(tm, 2), sub(env, 2) or {}


def review(kind: str, f: Fields) -> dict[str, Any]:
    """The JSON form of a decoded review: SelfSubjectAccessReview (spec 2 -> resourceAttributes
    1 {1 namespace, 2 verb, 3 group, 4 version, 5 resource, 6 subresource, 7 name},
    nonResourceAttributes 2 {1 path, 2 verb}), SelfSubjectRulesReview (spec 2 -> namespace 1),
    SelfSubjectReview (no spec)."""
    spec = sub(f, 2) or {}
    if kind == "SelfSubjectRulesReview":
        return {"spec": {"namespace": text(spec, 1)}}
    if kind != "SelfSubjectAccessReview":
        return {}
    out: dict[str, Any] = {}
    ra = sub(spec, 1)
    if ra is not None:
        names = ("namespace", "verb", "group", "version", "resource", "subresource", "name")
        out["resourceAttributes"] = {n: text(ra, i + 1) for i, n in enumerate(names)
                                     if text(ra, i + 1)}
    nra = sub(spec, 2)
    if nra is not None:
        out["nonResourceAttributes"] = {"path": text(nra, 1), "verb": text(nra, 2)}
    return {"spec": out}


def _map(f: Fields, num: int) -> dict[str, str]:
    out = {}
    for entry in f.get(num) or []:
        kv = fields(entry)
        out[text(kv, 1)] = text(kv, 2)
    return out


def metadata(f: Fields) -> dict[str, Any]:
    """ObjectMeta {1 name, 2 generateName, 3 namespace, 11 labels, 12 annotations}."""
    out: dict[str, Any] = {}
    for num, key in ((1, "name"), (2, "generateName"), (3, "namespace")):
        if text(f, num):
            out[key] = text(f, num)
    for num, key in ((11, "labels"), (12, "annotations")):
        m = _map(f, num)
        if m:
            out[key] = m
    return out


def simple_object(kind: str, f: Fields) -> dict[str, Any] | None:
    """The objects `kubectl create namespace|configmap` send (Namespace {1 metadata},
    ConfigMap {1 metadata, 2 data, 3 binaryData}); None for any other kind."""
    md = metadata(sub(f, 1) or {})
    if kind == "Namespace":
        return {"metadata": md}
    if kind == "ConfigMap":
        out: dict[str, Any] = {"metadata": md}
        if _map(f, 2):
            out["data"] = _map(f, 2)
        binary = {}
        for entry in f.get(3) or []:
            kv = fields(entry)
            binary[text(kv, 1)] = base64.b64encode(kv.get(2, [b""])[-1]).decode()
        if binary:
            out["binaryData"] = binary
        return out
    return None
