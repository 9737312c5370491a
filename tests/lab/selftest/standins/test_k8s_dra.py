"""Dynamic Resource Allocation through the real kubectl against the API server stand-in, and
NVIDIA's DRA kubelet plugin (emulated) on a kubelet stand-in."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.lab.paths import REPO_ROOT
from tests.lab.selftest.standins.k8s_helpers import (
    CP_TAINT,
    FLANNEL,
    NEEDS_OPENSSL,
    STANDINS,
    Cluster,
    Node,
    Obj,
    kubectl_ok,
    wait_for,
)

pytestmark = NEEDS_OPENSSL


DRA_OBJECTS = """\
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.nvidia.com}
spec:
  selectors:
  - cel:
      expression: "device.driver == 'gpu.nvidia.com' && \\
        device.attributes['gpu.nvidia.com'].type == 'gpu'"
""" + "".join(f"""---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {{name: 00000-gpu.nvidia.com-{node}-abcde}}
spec:
  driver: gpu.nvidia.com
  nodeName: {node}
  pool: {{name: {node}, generation: 1, resourceSliceCount: 1}}
  devices:
""" + "".join(f"""  - name: gpu-{i}
    attributes:
      type: {{string: gpu}}
      uuid: {{string: GPU-{node}-{i}}}
    capacity:
      memory: {{value: 81559Mi}}
""" for i in range(n)) for node, n in (("gpu-01", 2), ("gpu-02", 1))) + "".join(f"""---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: train-gpus-{n}, namespace: default}}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly: {{deviceClassName: gpu.nvidia.com, allocationMode: ExactCount, count: {n}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: train-{n}, namespace: default}}
spec:
  restartPolicy: Never
  resourceClaims:
  - {{name: gpus-cuda, resourceClaimTemplateName: train-gpus-{n}}}
  containers:
  - name: cuda
    image: nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04
    resources:
      claims: [{{name: gpus-cuda}}]
""" for n in (1, 3))


def test_dynamic_resource_allocation_through_the_real_kubectl(cluster: Cluster) -> None:
    """resource.k8s.io/v1 (served from 1.34): discovery, NVIDIA's DeviceClass, two nodes'
    ResourceSlices, ResourceClaimTemplates as gpuk8s writes them; the 1-GPU pod gets a claim
    made from its template, allocated on a GPU node and reserved; the 3-GPU pod stays Pending
    with the scheduler's real message; an invalid template is the real 422."""
    cluster.add_node("cp-01", taints=[CP_TAINT])
    for name in ("gpu-01", "gpu-02", "cpu-01"):
        cluster.add_node(name)
    assert kubectl_ok(cluster, "api-resources", "--api-group=resource.k8s.io", "-o",
                      "name").split() == [
        "deviceclasses.resource.k8s.io", "resourceclaims.resource.k8s.io",
        "resourceclaimtemplates.resource.k8s.io", "resourceslices.resource.k8s.io"]
    kubectl_ok(cluster, "apply", "--server-side", "--field-manager=gpuk8s", "-f", "-",
               stdin=DRA_OBJECTS)

    def claim_of(pod: str) -> Obj | None:
        p = cluster.client.get(f"/api/v1/namespaces/default/pods/{pod}")
        st = (p.get("status", {}).get("resourceClaimStatuses") or [{}])[0]
        if not st.get("resourceClaimName"):
            return None
        c: Obj = cluster.client.get("/apis/resource.k8s.io/v1/namespaces/default/"
                                    f"resourceclaims/{st['resourceClaimName']}")
        return c

    one = cluster.wait(lambda: (c := claim_of("train-1")) and c.get("status", {}).get(
        "allocation") and c)
    assert re.fullmatch(r"train-1-gpus-cuda-[bcdfghjklmnpqrstvwxz2456789]{5}",
                        one["metadata"]["name"])
    assert one["metadata"]["annotations"] == {
        "resource.kubernetes.io/pod-claim-name": "gpus-cuda"}
    pod = cluster.client.get("/api/v1/namespaces/default/pods/train-1")
    assert one["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    node = pod["spec"]["nodeName"]
    assert node in ("gpu-01", "gpu-02")
    (result,) = one["status"]["allocation"]["devices"]["results"]
    assert result == {"request": "gpus", "driver": "gpu.nvidia.com", "pool": node,
                      "device": "gpu-0"}
    assert one["status"]["reservedFor"] == [
        {"resource": "pods", "name": "train-1", "uid": pod["metadata"]["uid"]}]
    rows = kubectl_ok(cluster, "get", "resourceclaims").splitlines()
    assert rows[0].split() == ["NAME", "STATE", "AGE"]
    assert rows[1].split()[:2] == [one["metadata"]["name"], "allocated,reserved"]
    assert kubectl_ok(cluster, "get", "resourceslices").splitlines()[0].split() == \
        ["NAME", "NODE", "DRIVER", "POOL", "AGE"]
    assert kubectl_ok(cluster, "get", "resourceslices", "--field-selector",
                      "spec.nodeName=gpu-02", "-o", "name") == \
        "resourceslice.resource.k8s.io/00000-gpu.nvidia.com-gpu-02-abcde\n"

    want = ("0/4 nodes are available: 1 node(s) had untolerated taint(s), 3 cannot allocate all "
            "claims. still not schedulable, preemption: 0/4 nodes are available: 4 Preemption is "
            "not helpful for scheduling.")
    big = cluster.wait(lambda: next((c for c in cluster.client.get(
        "/api/v1/namespaces/default/pods/train-3").get("status", {}).get("conditions") or []
        if c["type"] == "PodScheduled" and c.get("message") == want), None))
    assert (big["status"], big["reason"]) == ("False", "Unschedulable")
    out = kubectl_ok(cluster, "describe", "pod", "train-3")
    # an event row per scheduling attempt: the scheduler may also have tried before the
    # resourceclaim controller made the claim ("ResourceClaim not created yet"), in the same
    # second, so kubectl lists the two in either order
    assert any(line.split("default-scheduler", 1)[-1].strip() == want
               for line in out.splitlines() if "Warning  FailedScheduling" in line), out
    pending = claim_of("train-3")
    assert pending is not None and "allocation" not in pending.get("status", {})
    assert f"{pending['metadata']['name']}   pending" in kubectl_ok(
        cluster, "get", "resourceclaims")

    r = cluster.kubectl("apply", "--server-side", "--field-manager=gpuk8s", "-f", "-", stdin="""\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: bad, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly: {allocationMode: ExactCount, count: -1}
""")
    assert r.returncode == 1
    assert "spec.spec.devices.requests[0].exactly.deviceClassName: Required value" in r.stderr
    assert "spec.spec.devices.requests[0].exactly.count: Invalid value: -1: must be greater " \
        "than zero" in r.stderr, r.stderr

    # the pod is deleted: its claim goes with it, and its GPU is free for another pod
    kubectl_ok(cluster, "delete", "pod", "train-1")
    cluster.wait(lambda: not cluster.client.get(
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims").get("items") or all(
        c["metadata"]["name"] != one["metadata"]["name"] for c in cluster.client.get(
            "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims")["items"]))


def test_dra_driver_on_a_kubelet(control_plane: tuple[Node, str]) -> None:
    """gpuk8s' own DRA manifest (templates/gpu/nvidia-dra-driver.yaml.j2) on a kubelet stand-in
    with the REAL nvidia-smi stand-in: the emulated kubelet plugin publishes the node's two
    H100s, a pod's 1-GPU claim is allocated and prepared (the runner's spec gives the pod that
    GPU through CDI, with the runc handler), a 3-GPU claim stays Pending."""
    import jinja2

    node, kc = control_plane
    k = lambda *a, **kw: node.run("kubectl", "--kubeconfig", kc, *a, **kw)  # noqa: E731
    (node.bin / "nvidia-smi").write_text(
        f"#!/bin/sh\nexec {sys.executable} {STANDINS / 'nvidia/nvidia-smi'} \"$@\"\n")
    (node.root / "run/nvidia-lab").mkdir(parents=True)
    (node.root / "run/nvidia-lab/loaded-module-version").write_text("580.159.04\n")
    assert k("apply", "--server-side", "-f", "-", stdin=FLANNEL).returncode == 0
    assert k("label", "node", "cp-01", "nvidia.com/gpu.present=true").returncode == 0
    manifest = jinja2.Template((REPO_ROOT / "templates/gpu/"
                                "nvidia-dra-driver.yaml.j2").read_text()).render(
        nvidia_dra_driver_version="0.4.0")
    r = k("apply", "--server-side", "--field-manager=gpuk8s", "-f", "-", stdin=manifest)
    assert r.returncode == 0, r.stderr
    uuids = subprocess.run([str(node.bin / "nvidia-smi"), "--query-gpu=uuid",
                            "--format=csv,noheader"], capture_output=True, text=True,
                           env=node.env()).stdout.split()
    assert len(uuids) == 2
    path = ('jsonpath={range .items[?(@.spec.nodeName=="cp-01")]}{.spec.driver}{" "}'
            '{range .spec.devices[*]}{.attributes.type.string}{" "}{end}{"\\n"}{end}')
    assert wait_for(lambda: k("get", "resourceslices", "-o", path).stdout ==
                    "gpu.nvidia.com gpu gpu \n")
    (sl,) = json.loads(k("get", "resourceslices", "-o", "json").stdout)["items"]
    assert re.fullmatch(r"00000-gpu\.nvidia\.com-cp-01-[a-z0-9]{5}", sl["metadata"]["name"])
    assert [d["attributes"]["uuid"]["string"] for d in sl["spec"]["devices"]] == uuids
    assert sl["spec"]["devices"][0]["capacity"] == {"memory": {"value": "81559Mi"}}
    r = k("apply", "--server-side", "-f", "-", stdin="".join(f"""---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: w-gpus-{n}, namespace: default}}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly: {{deviceClassName: gpu.nvidia.com, allocationMode: ExactCount, count: {n}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: w-{n}, namespace: default}}
spec:
  restartPolicy: Never
  resourceClaims: [{{name: gpus-smi, resourceClaimTemplateName: w-gpus-{n}}}]
  containers:
  - name: smi
    image: nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04
    command: [nvidia-smi, -L]
    resources: {{claims: [{{name: gpus-smi}}]}}
""" for n in (1, 3)))
    assert r.returncode == 0, r.stderr
    uid = k("get", "pod", "w-1", "-o", "jsonpath={.metadata.uid}").stdout
    spec_file = node.root / f"run/gpuk8s-lab/pods/{uid}/spec.json"
    assert wait_for(lambda: spec_file.exists())
    spec = json.loads(spec_file.read_text())
    assert spec["gpus"] == [uuids[0]] and spec["gpuRuntime"] is True and spec["cdi"] is True
    assert k("get", "resourceclaims").stdout.count("allocated,reserved") == 1
    assert wait_for(lambda: "1 cannot allocate all claims. still not schedulable, preemption: "
                    "0/1 nodes are available: 1 Preemption is not helpful for scheduling." in k(
                        "get", "pod", "w-3", "-o",
                        "jsonpath={.status.conditions[0].message}").stdout)
