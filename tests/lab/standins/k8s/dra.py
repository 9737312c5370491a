# LAB STAND-IN: not the real Kubernetes DRA. Test infrastructure for gpuk8s; never shipped to users.
"""Dynamic Resource Allocation (resource.k8s.io/v1, GA in Kubernetes 1.34): the pure logic the
API server stand-in (dra_server.py) and the kubelet stand-in (dra_node.py) share.

What is upstream's (kubernetes 1.34-1.36): the group is served from 1.34; defaults of an exact
request (allocationMode ExactCount, count 1) and the validation texts of
pkg/apis/resource/validation (field paths under `exactly`, "must be greater than zero", the
RFC 1123 texts); the name the resourceclaim controller gives a claim made from a template
(`<pod>-<pod claim>-` plus 5 random characters, both parts shortened in proportion past 57
characters), its `resource.kubernetes.io/pod-claim-name` annotation and the Pod as controller
owner; the scheduler's texts ("cannot allocate all claims", "resourceclaim not available on the
node", "still not schedulable", "no new claims to deallocate" for a pod without claims,
`request R: device class C does not exist`, `pod "ns/p": ResourceClaim not created yet`); the
allocation result (request, driver, pool, device) and the node selector (matchFields
metadata.name In [node]).

What is the lab's: CEL. Only `device.driver == '<x>'` and
`device.attributes['<domain>'].<attribute> == '<value>'` (string attributes) joined by `&&` are
understood; any other expression is refused with "CEL expression not supported by the lab
stand-in", never matched. Allocation takes the first free matching devices in slice order
(the real allocator also backtracks over several claims; with one request per claim, as
gpuk8s writes them, the outcome is the same). No firstAvailable, constraints, config, admin
access, device taints, consumable capacity or partitionable devices.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

Obj = dict[str, Any]
GROUP = "resource.k8s.io"
SINCE = (1, 34)
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
CANNOT_ALLOCATE = "cannot allocate all claims"
NOT_ON_NODE = "resourceclaim not available on the node"
STILL_NOT_SCHEDULABLE = "still not schedulable"
NO_NEW_CLAIMS = "no new claims to deallocate"  # PostFilter of a pod without claims
NOT_CREATED = "ResourceClaim not created yet"
LAB_CEL = "CEL expression not supported by the lab stand-in"
MAX_BASE_LEN = 57  # the resourceclaim controller leaves room for "-" and 5 random characters
LABEL_TEXT = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
              "'-', and must start and end with an alphanumeric character (e.g. 'my-name',  or "
              "'123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
SUBDOMAIN_TEXT = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                  "characters, '-' or '.', and must start and end with an alphanumeric "
                  "character (e.g. 'example.com', regex used for validation is "
                  "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


# ------------------------------------------------------------------ served versions
def served(version: str) -> bool:
    """resource.k8s.io/v1 is served from Kubernetes 1.34 ("1.36.2-1.1" -> True)."""
    m = re.match(r"v?(\d+)\.(\d+)", version or "")
    return m is not None and (int(m.group(1)), int(m.group(2))) >= SINCE


def gate(registry: Any, version: str) -> None:
    """Drop resource.k8s.io from a registry of an API server older than 1.34."""
    if not served(version):
        registry.resources = [r for r in registry.resources if r.group != GROUP]


# ------------------------------------------------------------------ CEL (the lab's subset)
class Unsupported(ValueError):
    """Something of DRA the lab does not play (an unknown CEL form, firstAvailable)."""


_Q = r"""(?:'([^'\\]*)'|"([^"\\]*)")"""
_DRIVER = re.compile(rf"device\.driver\s*==\s*{_Q}")
_ATTR = re.compile(rf"device\.attributes\[{_Q}\]\.([A-Za-z_][A-Za-z0-9_]*)\s*==\s*{_Q}")
Pred = tuple[str, ...]


def compile_cel(expr: str) -> list[Pred]:
    """The lab's CEL subset: [("driver", name) | ("attr", domain, attribute, value)], all of
    which must hold; Unsupported for anything else."""
    preds: list[Pred] = []
    for term in str(expr or "").split("&&"):
        term = term.strip()
        if m := _DRIVER.fullmatch(term):
            preds.append(("driver", m.group(1) if m.group(1) is not None else m.group(2)))
        elif m := _ATTR.fullmatch(term):
            domain = m.group(1) if m.group(1) is not None else m.group(2)
            value = m.group(4) if m.group(4) is not None else m.group(5)
            preds.append(("attr", domain, m.group(3), value))
        else:
            raise Unsupported(f"{LAB_CEL}: {expr}")
    return preds


def attribute(driver: str, device: Obj, domain: str, name: str) -> Any:
    """device.attributes['<domain>'].<name>: an attribute without a domain in the slice belongs
    to the driver's domain."""
    attrs = device.get("attributes") or {}
    got = attrs.get(f"{domain}/{name}")
    if got is None and domain == driver:
        got = attrs.get(name)
    return got if isinstance(got, dict) else None


def matches(preds: list[Pred], driver: str, device: Obj) -> bool:
    for p in preds:
        if p[0] == "driver" and driver != p[1]:
            return False
        if p[0] == "attr":
            got = attribute(driver, device, p[1], p[2])
            # CEL compares a string attribute with a string; a missing attribute or one of
            # another type never equals it
            if got is None or got.get("string") != p[3]:
                return False
    return True


# ------------------------------------------------------------------ allocation
Device = tuple[str, str, Obj]   # (driver, pool, device)
DeviceId = tuple[str, str, str]  # (driver, pool, device name)


def pool_devices(slices: Iterable[Obj], node: str) -> list[Device]:
    """The devices of the node's ResourceSlices, newest pool generation only, in slice order."""
    newest: dict[tuple[str, str], int] = {}
    mine = [s for s in slices if (s.get("spec") or {}).get("nodeName") == node]
    for s in mine:
        spec = s["spec"]
        key = (str(spec.get("driver", "")), str((spec.get("pool") or {}).get("name", "")))
        newest[key] = max(newest.get(key, 0), int((spec.get("pool") or {}).get("generation", 0)))
    out: list[Device] = []
    for s in sorted(mine, key=lambda s: s["metadata"]["name"]):
        spec = s["spec"]
        pool = spec.get("pool") or {}
        key = (str(spec.get("driver", "")), str(pool.get("name", "")))
        if int(pool.get("generation", 0)) < newest[key]:
            continue
        out += [(key[0], key[1], d) for d in spec.get("devices") or [] if isinstance(d, dict)]
    return out


def in_use(claims: Iterable[Obj]) -> set[DeviceId]:
    out: set[DeviceId] = set()
    for c in claims:
        alloc = (c.get("status") or {}).get("allocation") or {}
        for r in (alloc.get("devices") or {}).get("results") or []:
            out.add((r.get("driver", ""), r.get("pool", ""), r.get("device", "")))
    return out


def class_problem(claim: Obj, classes: dict[str, Obj]) -> str | None:
    """The scheduler's PreFilter check of an unallocated claim's requests."""
    if (claim.get("status") or {}).get("allocation"):
        return None
    for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        exact = req.get("exactly")
        if exact is None:
            raise Unsupported(f"request {req.get('name')}: firstAvailable is not supported by "
                              "the lab stand-in")
        cls = exact.get("deviceClassName", "")
        if cls not in classes:
            return f"request {req.get('name')}: device class {cls} does not exist"
    return None


def allocate(claim: Obj, classes: dict[str, Obj], devices: list[Device],
             taken: set[DeviceId]) -> list[Obj] | None:
    """The allocation results of one claim on one node's devices (None: it does not fit);
    Unsupported for selectors the lab cannot evaluate."""
    results: list[Obj] = []
    mine: set[DeviceId] = set()
    for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        exact = req.get("exactly") or {}
        cls = classes.get(exact.get("deviceClassName", ""), {})
        preds = [compile_cel((s.get("cel") or {}).get("expression", ""))
                 for s in [*((cls.get("spec") or {}).get("selectors") or []),
                           *(exact.get("selectors") or [])]]
        fits = [(drv, pool, d) for drv, pool, d in devices
                if all(matches(p, drv, d) for p in preds)]
        free = [x for x in fits if (x[0], x[1], x[2].get("name", "")) not in taken | mine]
        if exact.get("allocationMode", "ExactCount") == "All":
            if not fits or len(free) < len(fits):
                return None
            pick = free
        else:
            count = int(exact.get("count") or 1)
            if len(free) < count:
                return None
            pick = free[:count]
        for drv, pool, d in pick:
            mine.add((drv, pool, d.get("name", "")))
            results.append({"request": req.get("name", ""), "driver": drv, "pool": pool,
                            "device": d.get("name", "")})
    return results


def node_selector(node: str) -> Obj:
    return {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [node]}]}]}


def allocated_node(claim: Obj) -> str | None:
    """The node an allocated claim is tied to (its nodeSelector's metadata.name), else None."""
    sel = (((claim.get("status") or {}).get("allocation") or {}).get("nodeSelector") or {})
    for term in sel.get("nodeSelectorTerms") or []:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("operator") == "In" and f.get("values"):
                return str(f["values"][0])
    return None


def plan(claims: list[Obj], classes: dict[str, Obj], devices: list[Device],
         taken: set[DeviceId], node: str) -> dict[str, list[Obj]] | str:
    """The DRA filter for one node: claim uid -> new allocation results (allocated claims need
    none), or the reason the node does not fit."""
    out: dict[str, list[Obj]] = {}
    used = set(taken)
    for c in claims:
        if (c.get("status") or {}).get("allocation"):
            where = allocated_node(c)
            if where is not None and where != node:
                return NOT_ON_NODE
            continue
        try:
            got = allocate(c, classes, devices, used)
        except Unsupported as e:
            return str(e)
        if got is None:
            return CANNOT_ALLOCATE
        used |= {(r["driver"], r["pool"], r["device"]) for r in got}
        out[c["metadata"]["uid"]] = got
    return out


# ------------------------------------------------------------------ pods and their claims
def claim_name(pod: Obj, pc: Obj) -> tuple[str | None, bool, str | None]:
    """(claim name, made for this pod from a template, error) as resourceclaim.Name."""
    if pc.get("resourceClaimName"):
        return str(pc["resourceClaimName"]), False, None
    if pc.get("resourceClaimTemplateName"):
        for st in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
            if st.get("name") == pc.get("name"):
                return st.get("resourceClaimName"), True, None
        md = pod["metadata"]
        return None, True, f'pod "{md.get("namespace")}/{md["name"]}": {NOT_CREATED}'
    return None, False, None


def owned_by(claim: Obj, pod: Obj) -> bool:
    uid = pod["metadata"].get("uid")
    return any(r.get("uid") == uid and r.get("controller") for r in
               claim["metadata"].get("ownerReferences") or [])


def not_owner(claim: Obj, pod: Obj) -> str:
    cm, pm = claim["metadata"], pod["metadata"]
    return (f"ResourceClaim {cm.get('namespace')}/{cm['name']} was not created for pod "
            f"{pm.get('namespace')}/{pm['name']} (pod is not owner)")


def generate_name(pod_name: str, claim: str) -> str:
    """The resourceclaim controller's generateName for a claim made from a template."""
    base = f"{pod_name}-{claim}"
    if len(base) > MAX_BASE_LEN:
        base = (pod_name[:len(pod_name) * MAX_BASE_LEN // len(base)] + "-" +
                claim[:len(claim) * MAX_BASE_LEN // len(base)])
    return base + "-"


def claim_from_template(pod: Obj, pc: Obj, template: Obj) -> Obj:
    md = pod["metadata"]
    tmd = ((template.get("spec") or {}).get("metadata") or {})
    return {"apiVersion": f"{GROUP}/v1", "kind": "ResourceClaim", "metadata": {
        "generateName": generate_name(md["name"], pc["name"]), "namespace": md["namespace"],
        "annotations": {**(tmd.get("annotations") or {}), POD_CLAIM_ANNOTATION: pc["name"]},
        **({"labels": dict(tmd["labels"])} if tmd.get("labels") else {}),
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": md["name"],
                             "uid": md["uid"], "controller": True,
                             "blockOwnerDeletion": True}]},
        "spec": dict((template.get("spec") or {}).get("spec") or {})}


def consumer(pod: Obj) -> Obj:
    md = pod["metadata"]
    return {"resource": "pods", "name": md["name"], "uid": md["uid"]}


def state(claim: Obj) -> str:
    """kubectl get resourceclaims' STATE (resourceClaimState of the real printer)."""
    st = claim.get("status") or {}
    out = ["deleted"] if claim["metadata"].get("deletionTimestamp") else []
    if not st.get("allocation"):
        if not out:
            out.append("pending")
    else:
        out.append("allocated")
        if st.get("reservedFor"):
            out.append("reserved")
    return ",".join(out)


# ------------------------------------------------------------------ defaults and validation
FieldError = tuple[str, str, Any, str]  # (type, field path, bad value, detail)
REASONS = {"Required": "FieldValueRequired", "Invalid": "FieldValueInvalid",
           "NotSupported": "FieldValueNotSupported", "Duplicate": "FieldValueDuplicate"}


def _device_claim(spec: Obj, path: str) -> list[FieldError]:
    """Defaults (allocationMode ExactCount, count 1) and validation of spec.devices."""
    errs: list[FieldError] = []
    seen: set[str] = set()
    for i, req in enumerate((spec.get("devices") or {}).get("requests") or []):
        p = f"{path}.devices.requests[{i}]"
        name = str(req.get("name", ""))
        if not _LABEL.match(name) or len(name) > 63:
            errs.append(("Invalid", f"{p}.name", name, LABEL_TEXT))
        elif name in seen:
            errs.append(("Duplicate", f"{p}.name", name, ""))
        seen.add(name)
        has_exact, has_first = req.get("exactly") is not None, bool(req.get("firstAvailable"))
        if not has_exact and not has_first:
            errs.append(("Required", p, None, "exactly one of `exactly` or `firstAvailable` "
                         "is required"))
            continue
        if has_exact and has_first:
            errs.append(("Invalid", p, None, "exactly one of `exactly` or `firstAvailable` is "
                         "required, but multiple fields are set"))
            continue
        if not has_exact:
            continue  # firstAvailable: accepted, the lab's scheduler refuses it by name
        ex = req["exactly"]
        ep = f"{p}.exactly"
        ex.setdefault("allocationMode", "ExactCount")
        if ex["allocationMode"] == "ExactCount" and not ex.get("count"):
            ex["count"] = 1
        cls = str(ex.get("deviceClassName") or "")
        if not cls:
            errs.append(("Required", f"{ep}.deviceClassName", None, ""))
        elif not _SUBDOMAIN.match(cls) or len(cls) > 253:
            errs.append(("Invalid", f"{ep}.deviceClassName", cls, SUBDOMAIN_TEXT))
        for j, sel in enumerate(ex.get("selectors") or []):
            if not (sel or {}).get("cel"):
                errs.append(("Required", f"{ep}.selectors[{j}].cel", None, ""))
        mode, count = ex["allocationMode"], ex.get("count")
        if mode == "All":
            if count:
                errs.append(("Invalid", f"{ep}.count", count,
                             "must not be specified when allocationMode is 'All'"))
        elif mode == "ExactCount":
            if not isinstance(count, int) or count <= 0:
                errs.append(("Invalid", f"{ep}.count", count, "must be greater than zero"))
        else:
            errs.append(("NotSupported", f"{ep}.allocationMode", mode,
                         'supported values: "All", "ExactCount"'))
    return errs


def field_errors(kind: str, obj: Obj) -> list[FieldError]:
    """Defaults applied to ``obj`` in place, then its validation errors."""
    spec = obj.get("spec") or {}
    if kind == "ResourceClaim":
        return _device_claim(spec, "spec")
    if kind == "ResourceClaimTemplate":
        return _device_claim(spec.get("spec") or {}, "spec.spec")
    if kind == "DeviceClass":
        return [("Required", f"spec.selectors[{i}].cel", None, "")
                for i, s in enumerate(spec.get("selectors") or []) if not (s or {}).get("cel")]
    if kind == "ResourceSlice":
        errs: list[FieldError] = []
        if not spec.get("driver"):
            errs.append(("Required", "spec.driver", None, ""))
        if not (spec.get("pool") or {}).get("name"):
            errs.append(("Required", "spec.pool.name", None, ""))
        for i, d in enumerate(spec.get("devices") or []):
            name = str((d or {}).get("name", ""))
            if not _LABEL.match(name) or len(name) > 63:
                errs.append(("Invalid", f"spec.devices[{i}].name", name, LABEL_TEXT))
        return errs
    return []


def _body(err: FieldError) -> str:
    kind, _, value, detail = err
    if kind == "Required":
        return "Required value" + (f": {detail}" if detail else "")
    if kind == "Duplicate":
        return f'Duplicate value: "{value}"'
    if kind == "NotSupported":
        return f'Unsupported value: "{value}": {detail}'
    shown = "null" if value is None else (f'"{value}"' if isinstance(value, str) else value)
    return f"Invalid value: {shown}: {detail}"


def invalid(kind: str, name: str, errs: list[FieldError]) -> tuple[str, Obj]:
    """The message and details of the real 422 Invalid Status."""
    parts = [f"{e[1]}: {_body(e)}" for e in errs]
    listed = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    msg = f'{kind}.{GROUP} "{name}" is invalid: {listed}'
    return msg, {"name": name, "group": GROUP, "kind": kind, "causes": [
        {"reason": REASONS[e[0]], "message": _body(e), "field": e[1]} for e in errs]}


def admit(res: Any, obj: Obj, error: Any) -> None:
    """The API server's create/update hook: defaults, then a 422 (``error`` is the API
    server's HTTPError class) for an invalid resource.k8s.io object."""
    if getattr(res, "group", None) != GROUP:
        return
    errs = field_errors(res.kind, obj)
    if errs:
        md = obj.get("metadata") or {}
        msg, details = invalid(res.kind, md.get("name") or md.get("generateName", ""), errs)
        raise error(422, "Invalid", msg, details)
