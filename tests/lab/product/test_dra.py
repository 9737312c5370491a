"""gpu_allocation: dra on the bootstrapped lab (issue 19's acceptance, part 2b): NVIDIA's DRA
driver (a lab stand-in publishing the nvidia-smi stand-in's GPUs) replaces the device plugin;
each GPU node publishes a ResourceSlice with as many devices as its PCI GPUs, as the plugin's
ServiceAccount, whose token gpuk8s's ValidatingAdmissionPolicy keeps to its own node's slices
(security review 2, M1); a pod's claim is
allocated by the scheduler stand-in and prepared by the kubelet stand-in; the real TensorFlow
job runs with `--set gpuAllocation=dra`; a claim for 3 GPUs stays Pending with the scheduler's
real reason; back to the device plugin converges. The tests run in order on one cluster."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import workloads
from tests.lab import images, registry
from tests.lab.lab import Lab
from tests.lab.product.runs import bootstrap_inline, call, derived_inventory, ssh_ok
from tests.lab.product.test_bootstrap import GATE_VARS
from tests.lab.product.test_day2 import restore_bootstrapped

pytestmark = pytest.mark.lab
KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf"
BUSYBOX = "docker.io/library/busybox:gpuk8s-lab"


@pytest.fixture(scope="module")
def cluster(lab: Lab) -> Lab:
    registry.push_busybox()
    images.ensure_images()
    return restore_bootstrapped(lab)


def inventory(lab: Lab, dest: Path, mode: str) -> Path:
    return derived_inventory(lab, dest, feature_gates=GATE_VARS, gpu_allocation=mode)


def kubectl_json(lab: Lab, args: str) -> dict[str, Any]:
    return dict(json.loads(ssh_ok(lab, "cp-01", f"{KUBECTL} {args} -o json")))


def slices(lab: Lab) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in kubectl_json(lab, "get resourceslices")["items"]:
        if item["spec"]["driver"] == "gpu.nvidia.com":
            out.setdefault(item["spec"]["nodeName"], []).extend(
                d["attributes"]["type"]["string"] for d in item["spec"]["devices"])
    return out


def claim_pod(name: str, template: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"restartPolicy": "Never", "runtimeClassName": "nvidia",
                     "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}],
                     "containers": [{"name": "c", "image": BUSYBOX,
                                     "command": ["/bin/busybox", "sleep", "300"],
                                     "resources": {"claims": [{"name": "gpus"}]}}]}}


def claim_template(name: str, count: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "count": count}}]}}}}


def apply(lab: Lab, *docs: dict[str, Any]) -> None:
    text = "\n---\n".join(json.dumps(d) for d in docs)
    ssh_ok(lab, "cp-01", f"{KUBECTL} apply -f - <<'EOF'\n{text}\nEOF")


def test_dra_replaces_the_device_plugin_and_every_gpu_is_published(cluster: Lab,
                                                                    tmp_path: Path) -> None:
    result, text = bootstrap_inline(inventory(cluster, tmp_path, "dra"))
    assert all(t["failed"] == 0 for t in result["totals"].values()), text
    assert "remove the device plugin (gpu_allocation is dra)" in text, text
    assert "wait until gpu-01 publishes 2 gpu device(s)" in text, text
    assert slices(cluster) == {"gpu-01": ["gpu", "gpu"], "gpu-02": ["gpu"]}
    classes = {c["metadata"]["name"] for c in kubectl_json(cluster, "get deviceclasses")["items"]}
    assert classes == {"gpu.nvidia.com", "mig.nvidia.com"}
    again, text = bootstrap_inline(inventory(cluster, tmp_path, "dra"))
    assert again["changed"] == 0, text


POLICY = "gpuk8s-nvidia-dra-driver-gpu-resourceslices"


def forged_slice(name: str, node: str, driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 9, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-9", "attributes": {"type": {"string": "gpu"}}}]}}


def test_the_plugins_token_may_not_touch_another_nodes_slices(cluster: Lab) -> None:
    """Security review 2, M1: root on a GPU node can read the DRA kubelet plugin's token (its
    pod is privileged, the token lies in the pod's projected volume). gpuk8s's
    ValidatingAdmissionPolicy binds that token's ResourceSlice writes to the node it names:
    creating or deleting gpu-02's slices with gpu-01's token is refused with the real
    message, a slice of gpu-01 is allowed; the plugin published its own slices through the
    policy (the test before) and the claims of the tests after are served from them."""
    t0 = time.monotonic()
    (pod,) = kubectl_json(cluster, "-n nvidia-dra-driver-gpu get pods --field-selector "
                          "spec.nodeName=gpu-01")["items"]
    token = (f"/var/lib/kubelet/pods/{pod['metadata']['uid']}/volumes/"
             "kubernetes.io~projected/kube-api-access-*/token")
    as_plugin = ("S=$(awk '/server:/ {print $2; exit}' /etc/kubernetes/kubelet.conf); "
                 f"T=$(cat {token}); KUBECONFIG=/nonexistent kubectl --server=\"$S\" "
                 "--certificate-authority=/etc/kubernetes/pki/ca.crt --token=\"$T\"")
    who = json.loads(ssh_ok(cluster, "gpu-01", f"{as_plugin} auth whoami -o json"))
    info = who["status"]["userInfo"]
    assert info["username"] == \
        "system:serviceaccount:nvidia-dra-driver-gpu:nvidia-dra-driver-gpu-kubeletplugin"
    assert info["extra"]["authentication.kubernetes.io/node-name"] == ["gpu-01"]
    denied = (f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request: "
              "this user running on node 'gpu-01' may not modify resourceslices on node "
              "'gpu-02'")
    forged = json.dumps(forged_slice("forged-gpu-02", "gpu-02"))
    rc, out, err = cluster.ssh("gpu-01", f"{as_plugin} create -f - <<'EOF'\n{forged}\nEOF")
    assert rc == 1 and f'The resourceslices "forged-gpu-02" is invalid: : {denied}' in err, \
        (out, err)
    (theirs,) = [s["metadata"]["name"] for s in kubectl_json(cluster, "get resourceslices")[
        "items"] if s["spec"]["nodeName"] == "gpu-02"]
    rc, out, err = cluster.ssh("gpu-01", f"{as_plugin} delete resourceslice {theirs}")
    assert rc == 1 and f'The resourceslices "{theirs}" is invalid: : {denied}' in err, (out, err)
    # its own node's slices it may write (another driver's: the plugin's own stay as they are)
    own = json.dumps(forged_slice("probe-gpu-01", "gpu-01", "probe.gpuk8s.io"))
    assert "created" in ssh_ok(cluster, "gpu-01",
                               f"{as_plugin} create -f - <<'EOF'\n{own}\nEOF")
    assert "deleted" in ssh_ok(cluster, "gpu-01", f"{as_plugin} delete resourceslice probe-gpu-01")
    assert slices(cluster) == {"gpu-01": ["gpu", "gpu"], "gpu-02": ["gpu"]}
    assert time.monotonic() - t0 < 20


def test_a_claim_is_allocated_and_three_gpus_stay_pending(cluster: Lab) -> None:
    apply(cluster, claim_template("one-gpu", 1), claim_template("three-gpus", 3),
          claim_pod("one", "one-gpu"), claim_pod("three", "three-gpus"))
    deadline = time.monotonic() + 120
    pod: dict[str, Any] = {}
    while time.monotonic() < deadline:
        pod = kubectl_json(cluster, "get pod one")
        if pod["status"].get("phase") == "Running":
            break
        time.sleep(1)
    assert pod["status"].get("phase") == "Running", pod["status"]
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = kubectl_json(cluster, f"get resourceclaim {status['resourceClaimName']}")
    (device,) = claim["status"]["allocation"]["devices"]["results"]
    assert device["driver"] == "gpu.nvidia.com" and device["pool"] == pod["spec"]["nodeName"]
    assert [r["name"] for r in claim["status"]["reservedFor"]] == ["one"]
    three = kubectl_json(cluster, "get pod three")
    assert three["status"].get("phase") == "Pending"
    cond = next(c for c in three["status"]["conditions"] if c["type"] == "PodScheduled")
    assert cond["reason"] == "Unschedulable"
    assert cond["message"].startswith("0/4 nodes are available: ") and \
        "cannot allocate all claims" in cond["message"], cond
    ssh_ok(cluster, "cp-01", f"{KUBECTL} delete pod one three --wait=true", timeout=180)


def test_tensorflow_job_runs_with_a_claim(cluster: Lab, tmp_path: Path) -> None:
    inv = inventory(cluster, tmp_path, "dra")
    result, text = call(workloads.deploy, inv, "tensorflow-job",
                        sets=["gpuAllocation=dra", "epochs=1", "storage.enabled=false",
                              "datasetDownload=false", "cpu=500m"])
    assert result["objects"] == {"Job/tensorflow-job": "complete"}, text
    pods = kubectl_json(cluster, "get pods -n ml -l gpuk8s.io/workload=tensorflow-job")["items"]
    (pod,) = pods
    assert pod["spec"]["nodeName"] in ("gpu-01", "gpu-02")
    assert pod["spec"]["resourceClaims"] == [{"name": "gpus-train", "resourceClaimTemplateName":
                                              "tensorflow-job-gpus-1"}]
    assert pod["status"]["resourceClaimStatuses"][0]["name"] == "gpus-train"
    call(workloads.undeploy, inv, "tensorflow-job")
    left = ssh_ok(cluster, "cp-01", f"{KUBECTL} get resourceclaimtemplates -n ml -o name")
    assert left.strip() == ""


def test_verify_under_dra_checks_the_slices(cluster: Lab, tmp_path: Path) -> None:
    result = workloads.verify(inventory(cluster, tmp_path, "dra"), sets=["tensorflow=false"])
    assert {n: (v["slices"], v["nvidia_smi"], v["ok"]) for n, v in result["nodes"].items()} == {
        "gpu-01": (2, 2, True), "gpu-02": (1, 1, True)}, result


def test_a_kubelet_plugin_without_image_name_exits_and_gpuk8s_says_why(cluster: Lab,
                                                                     tmp_path: Path) -> None:
    """gpu-kubelet-plugin v0.4.0 requires --image-name (IMAGE_NAME), which gpuk8s once left
    out: the lab's plugin exits as the real one does, with urfave/cli's 'Required flag' line,
    publishes nothing, and a bootstrap waiting for the slices fails quoting it. gpuk8s's own
    manifest brings the slices back."""
    ds = kubectl_json(cluster, "-n nvidia-dra-driver-gpu get daemonset")["items"][0]
    containers = ds["spec"]["template"]["spec"]["containers"]
    i = next(n for n, c in enumerate(containers) if c["name"] == "gpus")
    env = [e for e in containers[i]["env"] if e["name"] != "IMAGE_NAME"]
    assert len(env) == len(containers[i]["env"]) - 1
    patch = json.dumps([{"op": "replace", "path": f"/spec/template/spec/containers/{i}/env",
                         "value": env}])
    ssh_ok(cluster, "cp-01", f"{KUBECTL} -n nvidia-dra-driver-gpu patch daemonset "
           f"{ds['metadata']['name']} --type=json -p '{patch}'")
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and slices(cluster).get("gpu-01"):
        time.sleep(3)  # the kubelet wipes a dead driver's slices 30 s after it stopped
    assert not slices(cluster).get("gpu-01"), slices(cluster)
    logs = ssh_ok(cluster, "cp-01", f"{KUBECTL} -n nvidia-dra-driver-gpu logs -l "
                  "nvidia-dra-driver-gpu-component=kubelet-plugin -c gpus --tail=2")
    assert 'Error: Required flag "image-name" not set' in logs, logs
    from gpuk8s.errors import PhaseFailed

    with pytest.raises(PhaseFailed) as err:
        bootstrap_inline(inventory(cluster, tmp_path, "dra"), sets=["gpu_ready_timeout=15"])
    text = str(err.value)
    assert "the DRA driver publishes 0 gpu device(s), expected" in text, text
    assert 'Required flag "image-name" not set' in text, text
    ssh_ok(cluster, "cp-01", f"{KUBECTL} -n nvidia-dra-driver-gpu annotate daemonset "
           f"{ds['metadata']['name']} gpuk8s.io/sha256-")
    result, text = bootstrap_inline(inventory(cluster, tmp_path, "dra"))
    assert all(t["failed"] == 0 for t in result["totals"].values()), text
    assert slices(cluster) == {"gpu-01": ["gpu", "gpu"], "gpu-02": ["gpu"]}


def test_back_to_the_device_plugin(cluster: Lab, tmp_path: Path) -> None:
    result, text = bootstrap_inline(inventory(cluster, tmp_path, "device-plugin"))
    assert all(t["failed"] == 0 for t in result["totals"].values()), text
    assert "remove the DRA driver (gpu_allocation is device-plugin)" in text, text
    nodes = {n["metadata"]["name"]: n["status"]["allocatable"].get("nvidia.com/gpu")
             for n in kubectl_json(cluster, "get nodes")["items"]}
    assert nodes["gpu-01"] == "2" and nodes["gpu-02"] == "1"
    again, text = bootstrap_inline(inventory(cluster, tmp_path, "device-plugin"))
    assert again["changed"] == 0, text
