"""The lab's Dynamic Resource Allocation (tests/lab/standins/k8s/dra.py, dra_server.py), without a
booted lab: the CEL subset, allocation over ResourceSlices, the claim made from a template,
defaults and validation texts, the scheduler's messages, and the resourceclaim controller and
scheduler glue against an in-memory API. The node's part: tests/unit/test_lab_dra_node.py."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest

from tests.lab.standins.k8s import dra, dra_server, scheduler, tables
from tests.lab.standins.k8s.resources import Registry

Obj = dict[str, Any]
GPU_CEL = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
MIG_CEL = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
CP_TAINT = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
#: the lab's default topology: cp-01 (tainted), gpu-01 (2 x H100), gpu-02 (1 x H200), cpu-01
LAB_MESSAGE_3_GPUS = (
    "0/4 nodes are available: 1 node(s) had untolerated taint(s), 3 cannot allocate all claims. "
    "still not schedulable, preemption: 0/4 nodes are available: 4 Preemption is not helpful "
    "for scheduling.")


def device_class(name: str = "gpu.nvidia.com", cel: str = GPU_CEL) -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": cel}}]}}


def gpu_slice(node: str, n: int, kind: str = "gpu", generation: int = 1) -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"00000-gpu.nvidia.com-{node}-x{generation}"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}", "attributes": {
                         "type": {"string": kind}, "uuid": {"string": f"GPU-{node}-{i}"}}}
                         for i in range(n)]}}


def claim_spec(count: int = 1, cls: str = "gpu.nvidia.com") -> Obj:
    return {"devices": {"requests": [{"name": "gpus", "exactly": {
        "deviceClassName": cls, "allocationMode": "ExactCount", "count": count}}]}}


def node_obj(name: str, taints: list[Obj] | None = None) -> Obj:
    return {"metadata": {"name": name, "labels": {}}, "spec": {"taints": taints or []},
            "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}}}


def lab_nodes() -> list[Obj]:
    return [node_obj("cp-01", [CP_TAINT]), node_obj("gpu-01"), node_obj("gpu-02"),
            node_obj("cpu-01")]


# ------------------------------------------------------------------ CEL subset
class TestCel:
    def test_the_device_classes_of_nvidias_chart(self) -> None:
        assert dra.compile_cel(GPU_CEL) == [("driver", "gpu.nvidia.com"),
                                            ("attr", "gpu.nvidia.com", "type", "gpu")]
        gpu = {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}
        mig = {"name": "gpu-0-mig-1g10gb-19-0", "attributes": {"type": {"string": "mig"}}}
        assert dra.matches(dra.compile_cel(GPU_CEL), "gpu.nvidia.com", gpu)
        assert not dra.matches(dra.compile_cel(GPU_CEL), "gpu.nvidia.com", mig)
        assert dra.matches(dra.compile_cel(MIG_CEL), "gpu.nvidia.com", mig)
        assert not dra.matches(dra.compile_cel(GPU_CEL), "other.example.com", gpu)

    def test_qualified_attributes_and_types(self) -> None:
        dev = {"attributes": {"resource.kubernetes.io/pciBusID": {"string": "0000:00:06.0"},
                              "driverVersion": {"version": "580.159.4"}}}
        pred = dra.compile_cel("device.attributes[\"resource.kubernetes.io\"].pciBusID == "
                               "\"0000:00:06.0\"")
        assert dra.matches(pred, "gpu.nvidia.com", dev)
        # a version attribute never equals a string, a missing one matches nothing
        assert not dra.matches(dra.compile_cel(
            "device.attributes['gpu.nvidia.com'].driverVersion == '580.159.4'"),
            "gpu.nvidia.com", dev)
        assert not dra.matches(dra.compile_cel(
            "device.attributes['gpu.nvidia.com'].type == 'gpu'"), "gpu.nvidia.com", dev)

    @pytest.mark.parametrize("expr", [
        "device.driver == 'a' || device.driver == 'b'",
        "!(device.driver == 'a')",
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
        "device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('h100')",
        "'gpu.nvidia.com' == device.driver",
        "true",
    ])
    def test_anything_else_is_refused_by_name(self, expr: str) -> None:
        with pytest.raises(dra.Unsupported) as e:
            dra.compile_cel(expr)
        assert str(e.value) == f"CEL expression not supported by the lab stand-in: {expr}"


# ------------------------------------------------------------------ allocation
class TestAllocation:
    CLASSES = {"gpu.nvidia.com": device_class(), "mig.nvidia.com": device_class(
        "mig.nvidia.com", MIG_CEL)}

    def claim(self, count: int = 1, uid: str = "c1", cls: str = "gpu.nvidia.com") -> Obj:
        return {"metadata": {"name": uid, "uid": uid}, "spec": claim_spec(count, cls)}

    def test_first_free_devices_of_the_node(self) -> None:
        devs = dra.pool_devices([gpu_slice("gpu-01", 2), gpu_slice("gpu-02", 1)], "gpu-01")
        assert [d[2]["name"] for d in devs] == ["gpu-0", "gpu-1"]
        got = dra.allocate(self.claim(1), self.CLASSES, devs,
                           {("gpu.nvidia.com", "gpu-01", "gpu-0")})
        assert got == [{"request": "gpus", "driver": "gpu.nvidia.com", "pool": "gpu-01",
                        "device": "gpu-1"}]
        assert dra.allocate(self.claim(2), self.CLASSES, devs,
                            {("gpu.nvidia.com", "gpu-01", "gpu-0")}) is None
        assert dra.allocate(self.claim(1, cls="mig.nvidia.com"), self.CLASSES, devs,
                            set()) is None

    def test_only_the_newest_pool_generation_counts(self) -> None:
        old, new = gpu_slice("gpu-01", 2, generation=1), gpu_slice("gpu-01", 1, generation=2)
        assert len(dra.pool_devices([old, new], "gpu-01")) == 1

    def test_all_mode_takes_every_matching_device_or_none(self) -> None:
        devs = dra.pool_devices([gpu_slice("gpu-01", 2)], "gpu-01")
        claim = self.claim()
        claim["spec"]["devices"]["requests"][0]["exactly"] = {
            "deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}
        assert len(dra.allocate(claim, self.CLASSES, devs, set()) or []) == 2
        assert dra.allocate(claim, self.CLASSES, devs,
                            {("gpu.nvidia.com", "gpu-01", "gpu-1")}) is None

    def test_plan_per_node(self) -> None:
        slices = [gpu_slice("gpu-01", 2), gpu_slice("gpu-02", 1)]
        two = [self.claim(1, "a"), self.claim(1, "b")]
        got = dra.plan(two, self.CLASSES, dra.pool_devices(slices, "gpu-01"), set(), "gpu-01")
        assert isinstance(got, dict)
        assert [r["device"] for uid in ("a", "b") for r in got[uid]] == ["gpu-0", "gpu-1"]
        assert dra.plan(two, self.CLASSES, dra.pool_devices(slices, "gpu-02"), set(),
                        "gpu-02") == "cannot allocate all claims"
        done = self.claim(1, "d")
        done["status"] = {"allocation": {"nodeSelector": dra.node_selector("gpu-02")}}
        assert dra.plan([done], self.CLASSES, [], set(), "gpu-01") == \
            "resourceclaim not available on the node"
        assert dra.plan([done], self.CLASSES, [], set(), "gpu-02") == {}
        odd = {"gpu.nvidia.com": device_class(cel="device.driver != 'x'")}
        assert dra.plan([self.claim()], odd, dra.pool_devices(slices, "gpu-01"), set(),
                        "gpu-01") == ("CEL expression not supported by the lab stand-in: "
                                      "device.driver != 'x'")

    def test_missing_class_and_first_available(self) -> None:
        assert dra.class_problem(self.claim(cls="gpu.example.com"), self.CLASSES) == \
            "request gpus: device class gpu.example.com does not exist"
        first = {"metadata": {"uid": "f"}, "spec": {"devices": {"requests": [
            {"name": "gpus", "firstAvailable": [{"name": "a", "deviceClassName": "x"}]}]}}}
        with pytest.raises(dra.Unsupported, match="firstAvailable is not supported"):
            dra.class_problem(first, self.CLASSES)

    def test_the_lab_message_for_three_gpus(self) -> None:
        """A 3-GPU claim in the default lab: FitError with DynamicResources' Filter and
        PostFilter, then DefaultPreemption (every node unresolvable)."""
        slices = [gpu_slice("gpu-01", 2), gpu_slice("gpu-02", 1)]
        pod = {"metadata": {"name": "p", "namespace": "default"}, "spec": {}}

        def dra_filter(node: Obj) -> str | None:
            got = dra.plan([self.claim(3)], self.CLASSES,
                           dra.pool_devices(slices, node["metadata"]["name"]), set(),
                           node["metadata"]["name"])
            return got if isinstance(got, str) else None

        assert scheduler.schedule(pod, lab_nodes(), [], extra=dra_filter,
                                  postfilter=dra.STILL_NOT_SCHEDULABLE) == \
            (None, LAB_MESSAGE_3_GPUS)
        # a pod without claims: DynamicResources' PostFilter has nothing to deallocate
        plain = {"metadata": {"name": "q"}, "spec": {"containers": [
            {"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
        api = FakeApi()
        assert dra_server.schedule(api, plain, [node_obj("n")], [])[1] == (
            "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. no new claims to "
            "deallocate, preemption: 0/1 nodes are available: 1 No preemption victims found for "
            "incoming pod.")
        dra.gate(api.registry, "1.33.5-1.1")  # no DynamicResources plugin before 1.34
        assert "no new claims" not in dra_server.schedule(api, plain, [node_obj("n")], [])[1]

    def test_prefilter_message(self) -> None:
        msg = scheduler.schedule({"metadata": {}, "spec": {}}, lab_nodes(), [],
                                 postfilter=dra.NO_NEW_CLAIMS,
                                 prefilter='pod "default/p": ResourceClaim not created yet')[1]
        assert msg == ('0/4 nodes are available: pod "default/p": ResourceClaim not created '
                       "yet. no new claims to deallocate, preemption: 0/4 nodes are available: 4 "
                       "Preemption is not helpful for scheduling.")


# ------------------------------------------------------------------ claims, names, validation
class TestClaims:
    def pod(self, name: str = "train-0", claim: str = "gpus-cuda") -> Obj:
        return {"metadata": {"name": name, "namespace": "ml", "uid": "pod-uid"},
                "spec": {"resourceClaims": [{"name": claim,
                                             "resourceClaimTemplateName": "train-gpus-2"}]}}

    def test_generate_name(self) -> None:
        assert dra.generate_name("pod-mem-ok", "gpu") == "pod-mem-ok-gpu-"
        long = dra.generate_name("p" * 60, "c" * 20)
        # both parts shortened in proportion: 60*57//81 and 20*57//81 characters
        assert long == "p" * 42 + "-" + "c" * 14 + "-"
        assert len(long) + 5 <= 63

    def test_claim_from_template(self) -> None:
        tpl = {"metadata": {"name": "train-gpus-2"}, "spec": {
            "metadata": {"labels": {"app": "train"}}, "spec": claim_spec(2)}}
        got = dra.claim_from_template(self.pod(), self.pod()["spec"]["resourceClaims"][0], tpl)
        assert got["metadata"] == {
            "generateName": "train-0-gpus-cuda-", "namespace": "ml",
            "annotations": {"resource.kubernetes.io/pod-claim-name": "gpus-cuda"},
            "labels": {"app": "train"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "train-0",
                                 "uid": "pod-uid", "controller": True,
                                 "blockOwnerDeletion": True}]}
        assert got["spec"] == claim_spec(2)

    def test_claim_name_and_state(self) -> None:
        pod = self.pod()
        pc = pod["spec"]["resourceClaims"][0]
        assert dra.claim_name(pod, pc) == (None, True, 'pod "ml/train-0": ResourceClaim not '
                                           "created yet")
        pod["status"] = {"resourceClaimStatuses": [{"name": "gpus-cuda",
                                                    "resourceClaimName": "train-0-gpus-x"}]}
        assert dra.claim_name(pod, pc) == ("train-0-gpus-x", True, None)
        assert dra.claim_name(pod, {"name": "s", "resourceClaimName": "shared"}) == \
            ("shared", False, None)
        claim: Obj = {"metadata": {"name": "c"}}
        assert dra.state(claim) == "pending"
        claim["status"] = {"allocation": {"devices": {}}}
        assert dra.state(claim) == "allocated"
        claim["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "u"}]
        assert dra.state(claim) == "allocated,reserved"
        assert tables.row("resourceclaims", claim, "None")["cells"][:2] == \
            ["c", "allocated,reserved"]
        assert [c["name"] for c in tables.columns("resourceslices")] == \
            ["Name", "Node", "Driver", "Pool", "Age"]

    def test_defaults(self) -> None:
        obj = {"spec": {"spec": {"devices": {"requests": [
            {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}}
        assert dra.field_errors("ResourceClaimTemplate", obj) == []
        assert obj["spec"]["spec"]["devices"]["requests"][0]["exactly"] == {
            "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}

    def test_invalid_messages(self) -> None:
        tpl = {"metadata": {"name": "t"}, "spec": {"spec": {"devices": {"requests": [
            {"name": "gpus", "exactly": {"allocationMode": "ExactCount", "count": -1}}]}}}}
        errs = dra.field_errors("ResourceClaimTemplate", tpl)
        msg, details = dra.invalid("ResourceClaimTemplate", "t", errs)
        assert msg == (
            'ResourceClaimTemplate.resource.k8s.io "t" is invalid: ['
            "spec.spec.devices.requests[0].exactly.deviceClassName: Required value, "
            "spec.spec.devices.requests[0].exactly.count: Invalid value: -1: must be greater "
            "than zero]")
        assert details["causes"][1] == {
            "reason": "FieldValueInvalid", "field": "spec.spec.devices.requests[0].exactly.count",
            "message": "Invalid value: -1: must be greater than zero"}
        claim = {"spec": {"devices": {"requests": [{"name": "gpus"}]}}}
        assert dra.invalid("ResourceClaim", "c", dra.field_errors("ResourceClaim", claim))[0] \
            == ('ResourceClaim.resource.k8s.io "c" is invalid: spec.devices.requests[0]: '
                "Required value: exactly one of `exactly` or `firstAvailable` is required")
        mode = {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "allocationMode": "Some"}}]}}}
        assert dra.field_errors("ResourceClaim", mode) == [
            ("NotSupported", "spec.devices.requests[0].exactly.allocationMode", "Some",
             'supported values: "All", "ExactCount"')]

    def test_admit_raises_the_servers_error(self) -> None:
        class HTTPError(Exception):
            def __init__(self, code: int, reason: str, message: str, details: Obj) -> None:
                super().__init__(message)
                self.code, self.reason = code, reason

        res = Registry().lookup("resourceclaimtemplates.resource.k8s.io")
        bad = {"metadata": {"name": "t"}, "spec": {"spec": {"devices": {"requests": [
            {"name": "gpus", "exactly": {"deviceClassName": "", "count": 2}}]}}}}
        with pytest.raises(HTTPError) as e:
            dra.admit(res, bad, HTTPError)
        assert (e.value.code, e.value.reason) == (422, "Invalid")
        dra.admit(Registry().lookup("pods"), {"spec": "anything"}, HTTPError)

    def test_served_from_1_34(self) -> None:
        assert dra.served("1.36.2-1.1") and dra.served("1.34.0") and not dra.served("1.33.5")
        reg = Registry()
        dra.gate(reg, "1.33.5-1.1")
        assert reg.lookup("resourceslices") is None and reg.lookup("pods") is not None
        reg = Registry()
        dra.gate(reg, "1.35.4-1.1")
        assert {r.plural for r in reg.resources if r.group == "resource.k8s.io"} == {
            "deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices"}


# ------------------------------------------------------------------ the API server's glue
class FakeApi:
    """What dra_server uses of the ApiServer, in memory."""

    def __init__(self) -> None:
        self.registry = Registry()
        self.objs: dict[tuple[str, str, str], Obj] = {}
        self.events: list[tuple[str, str, str]] = []

    def R(self, name: str) -> Any:  # the ApiServer's name
        return self.registry.lookup(name)

    def get(self, res: Any, ns: str, name: str) -> Obj | None:
        obj = self.objs.get((res.plural, ns if res.namespaced else "", name))
        return copy.deepcopy(obj) if obj else None

    def list(self, res: Any, ns: str | None = None) -> list[Obj]:
        return [copy.deepcopy(o) for (p, n, _), o in sorted(self.objs.items())
                if p == res.plural and (ns is None or n == ns)]

    def create(self, res: Any, obj: Obj) -> Obj:
        md = obj["metadata"]
        md.setdefault("name", md.get("generateName", "") + uuid.uuid4().hex[:5])
        md["uid"] = str(uuid.uuid4())
        self.objs[(res.plural, md.get("namespace", ""), md["name"])] = copy.deepcopy(obj)
        return obj

    def update(self, res: Any, obj: Obj, status_only: bool = False) -> Obj:
        md = obj["metadata"]
        self.objs[(res.plural, md.get("namespace", ""), md["name"])] = copy.deepcopy(obj)
        return obj

    def delete(self, res: Any, ns: str, name: str) -> Obj:
        return self.objs.pop((res.plural, ns, name))

    def event(self, obj: Obj, etype: str, reason: str, message: str, component: str = "",
              host: str = "") -> None:
        self.events.append((etype, reason, message))


def gpu_pod(name: str, template: str) -> Obj:
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "cuda", "resources": {"claims": [
                {"name": "gpus-cuda"}]}}], "resourceClaims": [
                {"name": "gpus-cuda", "resourceClaimTemplateName": template}]},
            "status": {"phase": "Pending"}}


class TestServerGlue:
    def api(self) -> FakeApi:
        api = FakeApi()
        api.create(api.R("deviceclasses"), device_class())
        for s in (gpu_slice("gpu-01", 2), gpu_slice("gpu-02", 1)):
            api.create(api.R("resourceslices"), s)
        for n in (1, 3):
            api.create(api.R("resourceclaimtemplates"), {
                "metadata": {"name": f"w-gpus-{n}", "namespace": "default"},
                "spec": {"spec": claim_spec(n)}})
        return api

    def test_claim_made_scheduled_and_freed(self) -> None:
        api = self.api()
        pods = api.R("pods")
        api.create(pods, gpu_pod("one", "w-gpus-1"))
        api.objs[("pods", "default", "one")]["metadata"]["uid"] = "uid-one"
        dra_server.claims_controller(api)
        pod = api.get(pods, "default", "one")
        assert pod is not None
        (st,) = pod["status"]["resourceClaimStatuses"]
        assert st["name"] == "gpus-cuda" and st["resourceClaimName"].startswith(
            "one-gpus-cuda-")
        claims = api.R("resourceclaims")
        claim = api.get(claims, "default", st["resourceClaimName"])
        assert claim is not None and dra.owned_by(claim, pod)
        node, msg = dra_server.schedule(api, pod, lab_nodes(), [])
        assert node in ("gpu-01", "gpu-02") and msg == ""
        claim = api.get(claims, "default", st["resourceClaimName"])
        assert claim is not None
        assert claim["status"]["reservedFor"] == [
            {"resource": "pods", "name": "one", "uid": "uid-one"}]
        assert claim["status"]["allocation"]["nodeSelector"] == dra.node_selector(str(node))
        assert dra.state(claim) == "allocated,reserved"
        # the pod is done: its claim is gone
        pod["status"]["phase"] = "Succeeded"
        api.update(pods, pod)
        dra_server.claims_controller(api)
        assert api.list(claims) == []

    def test_three_gpus_pending_and_missing_template(self) -> None:
        api = self.api()
        pods = api.R("pods")
        api.create(pods, gpu_pod("big", "w-gpus-3"))
        api.create(pods, gpu_pod("lost", "no-such-template"))
        dra_server.claims_controller(api)
        big = api.get(pods, "default", "big")
        assert big is not None
        assert dra_server.schedule(api, big, lab_nodes(), []) == (None, LAB_MESSAGE_3_GPUS)
        lost = api.get(pods, "default", "lost")
        assert lost is not None
        assert ("Warning", "FailedResourceClaimCreation",
                'PodResourceClaim gpus-cuda: resource claim template "no-such-template": '
                'resourceclaimtemplate.resource.k8s.io "no-such-template" not found') \
            in api.events
        assert dra_server.schedule(api, lost, lab_nodes(), [])[1] == (
            '0/4 nodes are available: pod "default/lost": ResourceClaim not created yet. no new '
            "claims to deallocate, preemption: 0/4 nodes are available: 4 Preemption is not "
            "helpful for scheduling.")

    def test_a_shared_claim_is_deallocated_when_nobody_uses_it(self) -> None:
        api = self.api()
        claims, pods = api.R("resourceclaims"), api.R("pods")
        api.create(claims, {"metadata": {"name": "shared", "namespace": "default"},
                            "spec": claim_spec(1)})
        pod = gpu_pod("a", "")
        pod["spec"]["resourceClaims"] = [{"name": "gpus-cuda", "resourceClaimName": "shared"}]
        api.create(pods, pod)
        node, _ = dra_server.schedule(api, api.get(pods, "default", "a") or {}, lab_nodes(),
                                      [])
        assert node is not None
        api.delete(pods, "default", "a")
        dra_server.claims_controller(api)
        claim = api.get(claims, "default", "shared")
        assert claim is not None and dra.state(claim) == "pending"
