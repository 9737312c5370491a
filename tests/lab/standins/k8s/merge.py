# LAB STAND-IN: not the real kube-apiserver. Test infrastructure for gpuk8s; never shipped to users.
"""Patches and field ownership as the real API server applies them.

- strategic merge patch (what kubectl label/annotate/cordon/taint/patch send), directed by the
  real schemas' patch strategies and merge keys ($patch, $retainKeys, $setElementOrder/...,
  $deleteFromPrimitiveList/... directives included);
- JSON merge patch (RFC 7386) and JSON patch (RFC 6902);
- server-side apply: managedFields in the FieldsV1 format (f:, k:, v:, "."), one entry per
  manager and operation, conflicts reported with the real message, --force-conflicts taking the
  fields over, and fields a manager stops applying removed when nobody else owns them.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from . import schema
from .common import ts

Obj = dict[str, Any]
Leaf = tuple[str, ...]
IDENTITY = {"name", "namespace", "uid", "resourceVersion", "creationTimestamp", "generation",
            "managedFields", "generateName", "deletionTimestamp", "selfLink"}


class PatchError(Exception):
    """A patch that cannot be applied: (HTTP code, reason, message)."""

    def __init__(self, code: int, reason: str, message: str, causes: list[Obj] | None = None
                 ) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.causes = code, reason, message, causes or []


# ------------------------------------------------------------------ JSON merge patch (RFC 7386)
def json_merge(base: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(base) if isinstance(base, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = json_merge(out.get(k), v)
    return out


# ------------------------------------------------------------------ JSON patch (RFC 6902)
def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(422, "Invalid", f"the server rejected our request due to an error in our "
                         f"request: invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str]) -> Any:
    for p in parts:
        if isinstance(doc, list):
            doc = doc[int(p)]
        elif isinstance(doc, dict):
            doc = doc[p]
        else:
            raise KeyError(p)
    return doc


def json_patch(doc: Any, ops: list[Obj]) -> Any:
    doc = copy.deepcopy(doc)
    for op in ops:
        kind, parts = op.get("op"), _pointer(str(op.get("path", "")))
        try:
            if kind == "test":
                if _walk(doc, parts) != op.get("value"):
                    raise PatchError(422, "Invalid", f"the server rejected our request due to an "
                                     f"error in our request: testing value {op.get('path')} "
                                     "failed: test failed")
                continue
            if kind in ("move", "copy"):
                src = _pointer(str(op.get("from", "")))
                value = copy.deepcopy(_walk(doc, src))
                if kind == "move":
                    _remove(doc, src)
                doc = _add(doc, parts, value)
            elif kind == "add":
                doc = _add(doc, parts, copy.deepcopy(op.get("value")))
            elif kind == "remove":
                _remove(doc, parts)
            elif kind == "replace":
                _walk(doc, parts)
                _remove(doc, parts)
                doc = _add(doc, parts, copy.deepcopy(op.get("value")))
            else:
                raise PatchError(422, "Invalid", f"Unexpected kind: {kind}")
        except (KeyError, IndexError, ValueError, TypeError) as e:
            raise PatchError(422, "Invalid", f"the server rejected our request due to an error "
                             f"in our request: {kind} operation does not apply: doc is missing "
                             f"path: \"{op.get('path')}\": missing value") from e
    return doc


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _walk(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, list):
        if last == "-":
            parent.append(value)
        else:
            i = int(last)
            if i > len(parent):
                raise IndexError(i)
            parent.insert(i, value)
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise KeyError(last)
    return doc


def _remove(doc: Any, parts: list[str]) -> None:
    parent = _walk(doc, parts[:-1])
    if isinstance(parent, list):
        del parent[int(parts[-1])]
    else:
        del parent[parts[-1]]


# ------------------------------------------------------------------ strategic merge patch
def _strip(v: Any) -> Any:
    """A patch value without directives (what a new field's value is)."""
    if isinstance(v, dict):
        return {k: _strip(x) for k, x in v.items() if not k.startswith("$")}
    if isinstance(v, list):
        return [_strip(x) for x in v if not (isinstance(x, dict) and x.get("$patch") == "delete")]
    return v


def strategic(orig: Any, patch: Any, s: Obj | None) -> Any:
    if not isinstance(patch, dict):
        return _strip(patch)
    if patch.get("$patch") == "replace":
        return _strip(patch)
    out = dict(orig) if isinstance(orig, dict) else {}
    orders: dict[str, list[Any]] = {}
    for k, v in patch.items():
        if k in ("$patch", "$retainKeys"):
            continue
        if k.startswith("$setElementOrder/"):
            orders[k.split("/", 1)[1]] = v
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            field = k.split("/", 1)[1]
            out[field] = [x for x in out.get(field) or [] if x not in (v or [])]
            continue
        if v is None:
            out.pop(k, None)
            continue
        cs = schema.child(s, k)
        if isinstance(v, dict) and v.get("$patch") == "delete":
            out.pop(k, None)
        elif isinstance(v, dict):
            out[k] = strategic(out.get(k), v, cs)
        elif isinstance(v, list):
            how, key = schema.merge_key(cs)
            if how == "merge" and isinstance(out.get(k), list):
                out[k] = _merge_list(out[k], v, key, schema.items(cs))
            else:
                out[k] = _strip(v)
        else:
            out[k] = v
    if "$retainKeys" in patch:
        keep = set(patch["$retainKeys"] or [])
        out = {k: x for k, x in out.items() if k in keep}
    for field, order in orders.items():
        if isinstance(out.get(field), list):
            out[field] = _reorder(out[field], order, schema.merge_key(schema.child(s, field))[1])
    return out


def _merge_list(orig: list[Any], patch: list[Any], key: str | None, item: Obj | None
                ) -> list[Any]:
    out = copy.deepcopy(orig)
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [_strip(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    for p in patch:
        if key is None or not isinstance(p, dict):
            if p not in out:
                out.append(p)
            continue
        at = next((i for i, o in enumerate(out) if isinstance(o, dict)
                   and o.get(key) == p.get(key)), None)
        if p.get("$patch") == "delete":
            out = [o for o in out if not (isinstance(o, dict) and o.get(key) == p.get(key))]
        elif at is None:
            out.append(_strip(p))
        else:
            out[at] = strategic(out[at], p, item)
    return out


def _reorder(lst: list[Any], order: list[Any], key: str | None) -> list[Any]:
    def ident(x: Any) -> Any:
        return json.dumps(x.get(key) if key and isinstance(x, dict) else x, sort_keys=True)

    rank = {ident(o): i for i, o in enumerate(order)}
    return sorted(lst, key=lambda x: rank.get(ident(x), len(rank)))


# ------------------------------------------------------------------ field sets (FieldsV1)
def _kjson(item: Obj, keys: list[str]) -> str:
    return "k:" + json.dumps({k: item.get(k) for k in keys if k in item}, separators=(",", ":"),
                             sort_keys=True)


def fields_of(obj: Any, s: Obj | None, top: bool = True) -> Obj:
    """FieldsV1 of a (partial) object: the fields it sets."""
    out: Obj = {}
    if not isinstance(obj, dict):
        return out
    for k, v in obj.items():
        if top and k in ("apiVersion", "kind", "status"):
            continue
        if top and k == "metadata" and isinstance(v, dict):
            md = {mk: mv for mk, mv in v.items() if mk not in IDENTITY}
            if md:
                out["f:metadata"] = fields_of(md, schema.child(s, "metadata"), top=False)
            continue
        cs = schema.child(s, k)
        node: Obj = {}
        if isinstance(v, dict) and v:
            rs = schema.resolve(cs) or {}
            node = fields_of(v, cs, top=False)
            if "properties" not in rs:
                node["."] = {}
        elif isinstance(v, list) and v:
            kind, keys = schema.list_semantics(cs)
            if kind == "map" and keys and all(isinstance(x, dict) for x in v):
                for x in v:
                    node[_kjson(x, keys)] = {".": {}, **fields_of(x, schema.items(cs), top=False)}
            elif kind == "set":
                for x in v:
                    node["v:" + json.dumps(x, separators=(",", ":"))] = {}
        out["f:" + k] = node
    return out


def leaves(fields: Obj, prefix: Leaf = ()) -> set[Leaf]:
    out: set[Leaf] = set()
    for k, v in fields.items():
        if k == ".":
            out.add(prefix)
            continue
        here = (*prefix, k)
        if v:
            out |= leaves(v, here)
        else:
            out.add(here)
    return out


def tree(paths: set[Leaf]) -> Obj:
    """The FieldsV1 of a set of leaves (a leaf that is also a prefix of another gets ".")."""
    root: Obj = {}
    for p in sorted(paths):
        node = root
        for el in p:
            node = node.setdefault(el, {})

    def mark(node: Obj, prefix: Leaf) -> None:
        for k, v in node.items():
            if k == ".":
                continue
            if v and (*prefix, k) in paths:
                v["."] = {}
            mark(v, (*prefix, k))
    mark(root, ())
    return root


def value_at(obj: Any, path: Leaf) -> tuple[bool, Any]:
    cur = obj
    for el in path:
        if el.startswith("f:"):
            if not isinstance(cur, dict) or el[2:] not in cur:
                return False, None
            cur = cur[el[2:]]
        elif el.startswith("k:"):
            want = json.loads(el[2:])
            cur = next((x for x in cur or [] if isinstance(x, dict)
                        and all(x.get(k) == v for k, v in want.items())), None)
            if cur is None:
                return False, None
        elif el.startswith("v:"):
            want = json.loads(el[2:])
            if not isinstance(cur, list) or want not in cur:
                return False, None
            cur = want
    return True, cur


def remove_at(obj: Any, path: Leaf) -> None:
    if not path:
        return
    ok, parent = value_at(obj, path[:-1])
    if not ok:
        return
    el = path[-1]
    if el.startswith("f:") and isinstance(parent, dict):
        parent.pop(el[2:], None)
    elif el.startswith("k:") and isinstance(parent, list):
        want = json.loads(el[2:])
        parent[:] = [x for x in parent if not (isinstance(x, dict) and all(
            x.get(k) == v for k, v in want.items()))]
    elif el.startswith("v:") and isinstance(parent, list):
        want = json.loads(el[2:])
        parent[:] = [x for x in parent if x != want]
    if isinstance(parent, list) and not parent and len(path) > 1 and path[-2].startswith("f:"):
        # a list left empty is not serialized (the API types' slices are omitempty)
        remove_at(obj, path[:-1])


def path_str(path: Leaf) -> str:
    """structured-merge-diff's path text: .spec.containers[name="c"].image, .a[="v"]."""
    out = ""
    for el in path:
        if el.startswith("f:"):
            out += "." + el[2:]
        elif el.startswith("k:"):
            kv = json.loads(el[2:])
            out += "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in kv.items()) + "]"
        elif el.startswith("v:"):
            out += f"[={el[2:]}]"
    return out


def apply_values(live: Any, applied: Any, s: Obj | None) -> Any:
    """The applied configuration's values over the live object (lists by their SSA keys)."""
    if not isinstance(applied, dict) or not isinstance(live, dict):
        return copy.deepcopy(applied)
    out = dict(live)
    for k, v in applied.items():
        cs = schema.child(s, k)
        if isinstance(v, dict):
            out[k] = apply_values(out.get(k) if isinstance(out.get(k), dict) else {}, v, cs)
        elif isinstance(v, list) and isinstance(out.get(k), list):
            kind, keys = schema.list_semantics(cs)
            if kind == "map" and keys:
                merged = copy.deepcopy(out[k])
                for x in v:
                    at = next((i for i, o in enumerate(merged) if isinstance(o, dict) and all(
                        o.get(kk) == x.get(kk) for kk in keys)), None)
                    if at is None:
                        merged.append(copy.deepcopy(x))
                    else:
                        merged[at] = apply_values(merged[at], x, schema.items(cs))
                out[k] = merged
            elif kind == "set":
                out[k] = out[k] + [x for x in v if x not in out[k]]
            else:
                out[k] = copy.deepcopy(v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _without_empty_markers(paths: set[Leaf], obj: Any) -> set[Leaf]:
    """Drop a map's "." marker once no field under it is left in the set (a manager that lost
    every value of a map no longer manages the map)."""
    return {p for p in paths if not (
        isinstance(value_at(obj, p)[1], dict)
        and not any(len(q) > len(p) and q[:len(p)] == p for q in paths))}


def _entry_leaves(e: Obj) -> set[Leaf]:
    return leaves(e.get("fieldsV1") or {})


def _same(e: Obj, manager: str, operation: str, sub: str) -> bool:
    return (e.get("manager"), e.get("operation"), e.get("subresource", "")) == (
        manager, operation, sub)


def server_side_apply(live: Obj | None, applied: Obj, manager: str, force: bool,
                      s: Obj | None, api_version: str, sub: str = "") -> Obj:
    """The object after `manager` applies `applied` over `live` (None: create)."""
    applied = {k: v for k, v in applied.items() if k != "status"}
    mine = leaves(fields_of(applied, s))
    entries = copy.deepcopy((live or {}).get("metadata", {}).get("managedFields") or [])
    if live is not None:
        conflicts: list[tuple[Obj, Leaf]] = []
        # a map or list item itself (its "." entry) never conflicts: only the values in it
        containers = {p[:i] for p in mine for i in range(len(p))}
        for e in entries:
            if _same(e, manager, "Apply", sub):
                continue
            for p in sorted((_entry_leaves(e) & mine) - containers):
                if value_at(live, p) != value_at(applied, p):
                    conflicts.append((e, p))
        if conflicts and not force:
            raise conflict_error(conflicts)
        if force:  # the applier takes the conflicting fields; equal values stay co-owned
            for e in entries:
                lost = {p for c, p in conflicts if c is e}
                if lost:
                    e["fieldsV1"] = tree(_without_empty_markers(_entry_leaves(e) - lost, live))
    base = copy.deepcopy(live) if live is not None else {}
    prev = next((e for e in entries if _same(e, manager, "Apply", sub)), None)
    if prev is not None:
        others: set[Leaf] = set()
        for e in entries:
            if e is not prev:
                others |= _entry_leaves(e)
        # the fields this manager no longer applies and nobody else owns go, each removed
        # from the top: a list item whose key field went first could no longer be found
        # (a volume left as {"persistentVolumeClaim": {}}); a map or item under which another
        # manager, or this apply, still owns a field stays, and only its lost fields go
        kept = {q[:i] for q in others | mine for i in range(1, len(q) + 1)}
        removed: list[Leaf] = []
        for p in sorted(_entry_leaves(prev) - mine - others, key=len):
            if p in kept or any(p[:len(r)] == r for r in removed):
                continue
            remove_at(base, p)
            removed.append(p)
    new = apply_values(base, applied, s)
    entries = [e for e in entries if not _same(e, manager, "Apply", sub)
               and _entry_leaves(e)]
    entries.append(entry(manager, "Apply", api_version, fields_of(applied, s), sub))
    new.setdefault("metadata", {})["managedFields"] = entries
    return new


def track_update(old: Obj | None, new: Obj, manager: str, s: Obj | None, api_version: str,
                 sub: str = "") -> None:
    """Record in new's managedFields that `manager` set every field it changed (create, update,
    patch); fields it removed leave every owner."""
    entries = copy.deepcopy((old or {}).get("metadata", {}).get("managedFields") or [])
    before = leaves(fields_of(old or {}, s)) if old else set()
    after = leaves(fields_of(new, s))
    changed = {p for p in after if p not in before or value_at(old, p) != value_at(new, p)}
    gone = before - after
    if sub == "status":
        changed = {p for p in changed if p[:1] == ("f:status",)}
    if not changed and not gone:
        new.setdefault("metadata", {})["managedFields"] = entries
        return
    for e in entries:
        if not _same(e, manager, "Update", sub):
            e["fieldsV1"] = tree(_without_empty_markers(_entry_leaves(e) - changed - gone, new))
    prev = next((e for e in entries if _same(e, manager, "Update", sub)), None)
    owned = ((_entry_leaves(prev) if prev else set()) | changed) - gone
    entries = [e for e in entries if not _same(e, manager, "Update", sub) and _entry_leaves(e)]
    if owned:
        entries.append(entry(manager, "Update", api_version, tree(owned), sub))
    new.setdefault("metadata", {})["managedFields"] = entries


def entry(manager: str, operation: str, api_version: str, fields: Obj, sub: str = "") -> Obj:
    e = {"manager": manager, "operation": operation, "apiVersion": api_version, "time": ts(),
         "fieldsType": "FieldsV1", "fieldsV1": fields}
    if sub:
        e["subresource"] = sub
    return e


def _who(e: Obj) -> str:
    name = json.dumps(e.get("manager", ""))
    if e.get("subresource"):
        name += f" with subresource {json.dumps(e['subresource'])}"
    if e.get("operation") == "Update":
        name += f" using {e.get('apiVersion')}"
    return name


def conflict_error(conflicts: list[tuple[Obj, Leaf]]) -> PatchError:
    causes = [{"reason": "FieldManagerConflict", "message": f"conflict with {_who(e)}",
               "field": path_str(p)} for e, p in conflicts]
    if len(conflicts) == 1:
        e, p = conflicts[0]
        msg = f"Apply failed with 1 conflict: conflict with {_who(e)}: {path_str(p)}"
    else:
        by: dict[str, list[str]] = {}
        for e, p in conflicts:
            by.setdefault(_who(e), []).append(path_str(p))
        lines = []
        for who in sorted(by):
            lines.append(f"conflicts with {who}:")
            lines += [f"- {p}" for p in by[who]]
        msg = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return PatchError(409, "Conflict", msg, causes)
