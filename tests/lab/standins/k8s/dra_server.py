# LAB STAND-IN: not the real kube-controller-manager / kube-scheduler. Test infrastructure for
# gpuk8s; never shipped to users.
"""The API server stand-in's part of Dynamic Resource Allocation (resource.k8s.io/v1):

- the resourceclaim controller: a pod's `spec.resourceClaims[].resourceClaimTemplateName` gets a
  ResourceClaim made from the template (dra.claim_from_template: the real name, annotation and
  owner) and `status.resourceClaimStatuses`; a missing template is the controller's
  FailedResourceClaimCreation event on the pod; reservations of pods that are gone or done are
  dropped, a claim nobody reserves any more is deallocated, and a claim made for a pod that is
  gone or done is deleted;
- the scheduler's DynamicResources plugin: PreFilter (claims created, found, owned, their
  DeviceClasses exist), Filter after the other filters ("cannot allocate all claims",
  "resourceclaim not available on the node"), PostFilter before DefaultPreemption's text ("still
  not schedulable"; "no new claims to deallocate" when the pod has none or PreFilter failed) and
  PreBind (status.allocation and status.reservedFor written before the pod is bound).
"""

from __future__ import annotations

from typing import Any

from . import dra, scheduler

Obj = dict[str, Any]


def _res(api: Any, name: str) -> Any:
    return api.registry.lookup(f"{name}.{dra.GROUP}")


def _done(pod: Obj | None) -> bool:
    return pod is None or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def claims_controller(api: Any) -> None:
    """One pass of the resourceclaim controller (kube-controller-manager)."""
    claims_res, tpl_res = _res(api, "resourceclaims"), _res(api, "resourceclaimtemplates")
    if claims_res is None or tpl_res is None:
        return  # resource.k8s.io is not served (Kubernetes < 1.34)
    pods_res = api.R("pods")
    pods = api.list(pods_res)
    claims = api.list(claims_res)
    for pod in pods:
        pcs = [pc for pc in pod.get("spec", {}).get("resourceClaims") or []
               if pc.get("resourceClaimTemplateName")]
        if not pcs or _done(pod):
            continue
        md = pod["metadata"]
        have = {s.get("name"): s for s in (pod.get("status") or {}).get(
            "resourceClaimStatuses") or []}
        new = dict(have)
        for pc in pcs:
            if have.get(pc["name"], {}).get("resourceClaimName"):
                continue
            made = next((c for c in claims if dra.owned_by(c, pod) and (
                c["metadata"].get("annotations") or {}).get(dra.POD_CLAIM_ANNOTATION)
                == pc["name"]), None)
            if made is None:
                tpl = api.get(tpl_res, md["namespace"], pc["resourceClaimTemplateName"])
                if tpl is None:
                    name = pc["resourceClaimTemplateName"]
                    api.event(pod, "Warning", "FailedResourceClaimCreation",
                              f'PodResourceClaim {pc["name"]}: resource claim template '
                              f'"{name}": resourceclaimtemplate.{dra.GROUP} "{name}" not found',
                              "resource_claim")
                    continue
                made = api.create(claims_res, dra.claim_from_template(pod, pc, tpl))
                claims.append(made)
            new[pc["name"]] = {"name": pc["name"],
                               "resourceClaimName": made["metadata"]["name"]}
        fresh = api.get(pods_res, md["namespace"], md["name"]) if new != have else None
        if fresh is not None:  # only the claim statuses change (the kubelet owns the rest)
            fresh.setdefault("status", {})["resourceClaimStatuses"] = [
                new[pc["name"]] for pc in fresh["spec"]["resourceClaims"] if pc["name"] in new]
            api.update(pods_res, fresh, status_only=True)
    by_uid = {p["metadata"]["uid"]: p for p in pods}
    for claim in claims:
        st = claim.get("status") or {}
        keep = [r for r in st.get("reservedFor") or []
                if r.get("resource") != "pods" or not _done(by_uid.get(r.get("uid", "")))]
        owner = next((r for r in claim["metadata"].get("ownerReferences") or []
                      if r.get("controller") and r.get("kind") == "Pod"), None)
        if owner is not None and not keep and _done(by_uid.get(owner.get("uid", ""))):
            api.delete(claims_res, claim["metadata"]["namespace"], claim["metadata"]["name"])
            continue
        new_st = dict(st)
        if keep:
            new_st["reservedFor"] = keep
        else:
            new_st.pop("reservedFor", None)
            new_st.pop("allocation", None)  # nobody uses it any more: deallocated
        if new_st != st:
            claim["status"] = new_st
            api.update(claims_res, claim, status_only=True)


def schedule(api: Any, pod: Obj, nodes: list[Obj], pods: list[Obj]) -> tuple[str | None, str]:
    """scheduler.schedule with the DynamicResources plugin; on success the pod's claims are
    allocated and reserved for it (PreBind) before the caller binds the pod."""
    pcs = pod.get("spec", {}).get("resourceClaims") or []
    claims_res = _res(api, "resourceclaims")
    if claims_res is None or not nodes:  # no DynamicResources plugin before 1.34
        return scheduler.schedule(pod, nodes, pods)
    if not pcs:
        return scheduler.schedule(pod, nodes, pods, postfilter=dra.NO_NEW_CLAIMS)
    ns = pod["metadata"]["namespace"]
    claims: list[Obj] = []
    for pc in pcs:
        name, from_template, err = dra.claim_name(pod, pc)
        if err:
            return scheduler.schedule(pod, nodes, pods, postfilter=dra.NO_NEW_CLAIMS,
                                      prefilter=err)
        if name is None:
            continue
        claim = api.get(claims_res, ns, name)
        if claim is None:
            return scheduler.schedule(pod, nodes, pods, postfilter=dra.NO_NEW_CLAIMS,
                                      prefilter=f'resourceclaim.{dra.GROUP} "{name}" not found')
        if from_template and not dra.owned_by(claim, pod):
            return scheduler.schedule(pod, nodes, pods, postfilter=dra.NO_NEW_CLAIMS,
                                      prefilter=dra.not_owner(claim, pod))
        claims.append(claim)
    classes = {c["metadata"]["name"]: c for c in api.list(_res(api, "deviceclasses"))}
    for claim in claims:
        try:
            problem = dra.class_problem(claim, classes)
        except dra.Unsupported as e:
            problem = str(e)
        if problem:
            return scheduler.schedule(pod, nodes, pods, postfilter=dra.NO_NEW_CLAIMS,
                                      prefilter=problem)
    slices = api.list(_res(api, "resourceslices"))
    mine = {c["metadata"]["uid"] for c in claims}
    taken = dra.in_use(c for c in api.list(claims_res) if c["metadata"]["uid"] not in mine)
    plans: dict[str, dict[str, list[Obj]]] = {}

    def dra_filter(node: Obj) -> str | None:
        name = node["metadata"]["name"]
        got = dra.plan(claims, classes, dra.pool_devices(slices, name), taken, name)
        if isinstance(got, str):
            return got
        plans[name] = got
        return None

    node, msg = scheduler.schedule(pod, nodes, pods, extra=dra_filter,
                                   postfilter=dra.STILL_NOT_SCHEDULABLE)
    if node is None:
        return None, msg
    for claim in claims:
        st = claim.setdefault("status", {})
        results = plans[node].get(claim["metadata"]["uid"])
        if results is not None:
            st["allocation"] = {"devices": {"results": results},
                                "nodeSelector": dra.node_selector(node)}
        me = dra.consumer(pod)
        if not any(r.get("uid") == me["uid"] for r in st.get("reservedFor") or []):
            st["reservedFor"] = [*(st.get("reservedFor") or []), me]
        api.update(claims_res, claim, status_only=True)
    return node, ""
