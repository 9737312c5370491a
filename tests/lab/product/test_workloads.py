"""Workloads on the bootstrapped lab (4 nodes: cp-01, gpu-01 with 2 H100, gpu-02 with 1 H200,
cpu-01), deployed through gpuk8s.workloads over real SSH to the control plane, as REAL pods.

What is real: every workload pod is real containers (runc through the node's containerd 2.1)
made from the lab images (the real TensorFlow 2.21.0 CPU build, TensorBoard, Jupyter; pulled
from the lab's real OCI registry through gpuk8s's registry_mirrors), on a pod network made by
the real CNI plugins (bridge, host-local, portmap) with routes between the nodes; the training
data are real handwritten digits (scikit-learn's load_digits as MNIST's mnist.npz). What is
emulated (tests/lab/standins/k8s/README.md): Kubernetes itself (API server, scheduler, the
kubelet's bookkeeping), flanneld's routes, kube-proxy's rules, the cluster DNS, the GPUs (fake
PCI devices, nvidia-smi stand-in injected into GPU pods) and the NFS server (the lab host's
shared folder stands in for the export: this kernel has neither nfsd nor an NFS client).
"""

from __future__ import annotations

import base64
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s import api, workloads
from gpuk8s.errors import PreflightError
from gpuk8s.report import Reporter
from tests.lab import images, net
from tests.lab.lab import Lab
from tests.lab.paths import HOST_IP, REGISTRY_PORT, REGISTRY_URL, REPO_ROOT, node_ip, shared_dir
from tests.lab.product.test_day2 import restore_bootstrapped
from tests.tfenv import DIGITS_AS_MNIST

pytestmark = pytest.mark.lab

GPU_NODES = {"gpu-01": 2, "gpu-02": 1}
NODE_IPS = {n: node_ip(i) for i, n in enumerate(("cp-01", "gpu-01", "gpu-02", "cpu-01"), 1)}
#: the lab's "NFS server": the shared folder every node sees (see the module docstring)
NFS = ["nfs.server=" + HOST_IP, "nfs.path=/srv/gpuk8s"]
SHARE = Path("10.88.0.1/srv/gpuk8s")
#: lab nodes have the host's 2 CPUs; the workloads' default request of 2 CPUs (sized for real
#: GPU boxes) cannot fit beside the system pods, so the lab asks for less
LAB_CPU = {"jupyter", "tensorflow-job", "distributed-tf", "eval"}
EPOCHS = "4"


def run(fn: Any, *args: Any, **kwargs: Any) -> tuple[dict[str, Any], str]:
    if fn is workloads.deploy and len(args) > 1 and args[1] in LAB_CPU:
        kwargs["sets"] = ["cpu=500m", *kwargs.get("sets", [])]
    out = io.StringIO()
    try:
        result = fn(*args, reporter=Reporter(out), **kwargs)
    finally:
        sys.stdout.write(out.getvalue())
    return result, out.getvalue()


def kubectl(lab: Lab, args: str) -> str:
    rc, out, err = lab.ssh("cp-01", f"kubectl --kubeconfig /etc/kubernetes/admin.conf {args}")
    assert rc == 0, f"kubectl {args}: {out}{err}"
    return out


@pytest.fixture(scope="module")
def cluster(lab: Lab, tf_venv: Path) -> Lab:
    """The bootstrapped lab, the lab images in its registry, and real handwritten digits as
    mnist.npz in the shared folder the storage workload's volume maps to."""
    restore_bootstrapped(lab)
    images.ensure_images()
    data = shared_dir() / SHARE / "data" / "mnist.npz"
    data.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(tf_venv / "bin" / "python"), "-c", DIGITS_AS_MNIST, str(data)],
                   check=True)
    return api_up(lab)


def api_up(lab: Lab, timeout: float = 180) -> Lab:
    """After a restore the stand-in API server and kubelets take a few seconds to come back."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rc, out, _ = lab.ssh("cp-01", "kubectl --kubeconfig /etc/kubernetes/admin.conf get "
                             "nodes --no-headers")
        if rc == 0 and len(out.splitlines()) == 4 and out.count(" Ready ") == 4:
            return lab
        time.sleep(2)
    raise AssertionError(f"the lab's API server or nodes did not come back: {out}")


def pods(lab: Lab, workload: str) -> list[dict[str, Any]]:
    data = json.loads(kubectl(lab, f"get pods -n ml -l gpuk8s.io/workload={workload} -o json"))
    items: list[dict[str, Any]] = data["items"]
    return items


def assert_on_gpu_nodes(lab: Lab, workload: str, gpus_each: int) -> None:
    found = pods(lab, workload)
    assert found, f"no pods of {workload}"
    for pod in found:
        node = pod["spec"].get("nodeName")
        assert node in GPU_NODES, f"{pod['metadata']['name']} on {node}"
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) == gpus_each


def pod_log(lab: Lab, pod: dict[str, Any]) -> str:
    return kubectl(lab, f"logs {pod['metadata']['name']} -n ml")


def in_pod_cidr(lab: Lab, pod: dict[str, Any]) -> bool:
    node = json.loads(kubectl(lab, f"get node {pod['spec']['nodeName']} -o json"))
    return ip_address(pod["status"]["podIP"]) in ip_network(node["spec"]["podCIDR"])


def get_in_cluster(lab: Lab, url: str, *curl: str) -> str:
    """GET url with curl on cp-01, from inside the cluster (a ClusterIP Service since review 2,
    L5), connection refusals retried while kube-proxy's rules catch up; the body, or what
    ``curl`` options ask to print."""
    rc, out, err = lab.ssh("cp-01", "curl -sf --retry 10 --retry-connrefused --retry-delay 1 "
                           f"-m 30 {' '.join(shlex.quote(c) for c in curl)} {shlex.quote(url)}")
    assert rc == 0, (url, out, err)
    return out


def get_status(url: str, wait: float = 15) -> int:
    """The HTTP status of GET url; connection errors retried for ``wait`` s (kube-proxy's
    rules for a Service that just became ready can be a moment behind, as in a cluster)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def values_file(tmp_path: Path, **values: Any) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def test_own_nfs_export_fails_clearly_on_this_kernel(cluster: Lab) -> None:
    with pytest.raises(workloads.WorkloadError) as exc:
        run(workloads.deploy, cluster.inventory_path, "storage")
    assert "kernel has no NFS server" in str(exc.value)
    assert "--set nfs.server=ADDRESS" in str(exc.value)


def test_missing_claim_is_named(cluster: Lab) -> None:
    with pytest.raises(workloads.WorkloadError,
                       match="PersistentVolumeClaim ml/gpuk8s-shared does not exist"):
        run(workloads.deploy, cluster.inventory_path, "tensorflow-job")
    with pytest.raises(workloads.WorkloadError,
                       match="StorageClass 'fast-nfs' does not exist"):
        run(workloads.deploy, cluster.inventory_path, "storage",
            sets=["storageClassName=fast-nfs"])


def test_storage_on_the_lab_share_binds(cluster: Lab) -> None:
    result, _text = run(workloads.deploy, cluster.inventory_path, "storage", sets=NFS)
    assert result["objects"] == {"PersistentVolumeClaim/gpuk8s-shared": "Bound"}
    pv = json.loads(kubectl(cluster, "get pv ml-gpuk8s-shared -o json"))
    assert pv["spec"]["nfs"] == {"server": HOST_IP, "path": "/srv/gpuk8s"}
    assert pv["status"]["phase"] == "Bound"


def test_tensorflow_job_trains_on_real_digits_then_eval_reads_its_accuracy(
        cluster: Lab) -> None:
    result, _text = run(workloads.deploy, cluster.inventory_path, "tensorflow-job",
                        sets=[f"epochs={EPOCHS}", "batchSize=32"])
    assert result["objects"] == {"Job/tensorflow-job": "complete"}
    (pod,) = pods(cluster, "tensorflow-job")
    assert pod["spec"]["nodeName"] in GPU_NODES and in_pod_cidr(cluster, pod)
    log = pod_log(cluster, pod)
    # the real TensorFlow's own epochs on the digits written into the shared folder
    assert f"epoch {EPOCHS}/{EPOCHS}: loss" in log, log[-2000:]
    assert "data: /shared/data/mnist.npz" in log or "/shared/data/mnist.npz" in log
    assert "LAB STAND-IN" not in log
    ckpt = shared_dir() / SHARE / "checkpoints" / "mnist" / "latest.keras"
    assert ckpt.is_file() and ckpt.stat().st_size > 10_000
    (train,) = result["results"].values()
    assert train["checkpoint"] == "/shared/checkpoints/mnist/latest.keras"

    result, text = run(workloads.deploy, cluster.inventory_path, "eval")
    (ev,) = result["results"].values()
    assert ev["data"] == "/shared/data/mnist.npz"
    assert ev["accuracy"] >= 0.85, ev
    assert f"accuracy {ev['accuracy']:.4f}" in text


def test_distributed_tf_trains_across_two_gpu_nodes(cluster: Lab) -> None:
    result, _text = run(workloads.deploy, cluster.inventory_path, "distributed-tf",
                        sets=[f"epochs={EPOCHS}", "batchSize=32"])
    assert result["objects"]["Job/distributed-tf"] == "complete"
    found = sorted(pods(cluster, "distributed-tf"),
                   key=lambda p: p["metadata"]["annotations"][
                       "batch.kubernetes.io/job-completion-index"])
    assert [p["spec"]["nodeName"] for p in found] == ["gpu-01", "gpu-02"]
    assert all(in_pod_cidr(cluster, p) for p in found)
    logs = [pod_log(cluster, p) for p in found]
    # each worker found the other by its pod DNS name (the headless Service) and trained with
    # it: the same weights at the end, the chief's checkpoint on the shared volume
    assert all("distributed-tf-1.distributed-tf.ml.svc:2222" in log for log in logs)
    res = [result["results"][p["metadata"]["name"]] for p in found]
    assert [r["replicas"] for r in res] == [2, 2]
    assert res[0]["weights_sha256"] == res[1]["weights_sha256"]
    assert res[0]["chief"] is True and res[1]["chief"] is False
    assert (shared_dir() / SHARE / "checkpoints" / "mnist-distributed" /
            "latest.keras").is_file()


def test_jupyter_serves_its_token_holders_and_runs_a_notebook(cluster: Lab,
                                                              tf_venv: Path) -> None:
    # NodePort is the documented opt-in (the default is a ClusterIP and a port-forward line,
    # which the lab's API server does not serve): this host reaches it as a browser would
    result, text = run(workloads.deploy, cluster.inventory_path, "jupyter", show_secret=True,
                       sets=["service.type=NodePort"])
    (pod,) = result["pods"]
    assert pod["phase"] == "Running" and pod["node"] in GPU_NODES
    secret = json.loads(kubectl(cluster, "get secret jupyter-token -n ml -o json"))
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) == 48 and text.count(token) == 1
    base = f"http://{NODE_IPS[pod['node']]}:30888"
    assert f"{base}/?token={token}" in text
    run_dir = Path(result["run_dir"])
    written = "".join(p.read_text() for p in run_dir.iterdir())
    assert token not in written and secret["data"]["token"] not in written
    # the URL answers from this host (a NodePort): with the token 200, without it 403
    assert get_status(f"{base}/api/status?token={token}") == 200
    assert get_status(f"{base}/api/status") == 403
    # the starter notebook, run through the server's API (a kernel in the pod)
    out = subprocess.run([str(tf_venv / "bin" / "python"),
                          str(Path(__file__).with_name("notebook_run.py")), base, token,
                          "gpuk8s/gpus.ipynb"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    cells = json.loads(out.stdout)
    assert "TensorFlow 2.21.0" in cells[0]["output"]
    # the TensorFlow in the lab images is the CPU build: it sees no GPU, and says so
    assert "0 GPU(s):" in cells[0]["output"]
    # nvidia-smi inside the pod sees exactly the one GPU it was given
    assert cells[1]["output"].count("NVIDIA H") == 1, cells[1]["output"]
    # the notebook server runs as nobody (security review 2, L5)
    name = pods(cluster, "jupyter")[0]["metadata"]["name"]
    assert "uid=65534" in kubectl(cluster, f"exec -n ml {name} -- id")
    # the default: no NodePort, a port-forward line instead
    again, text2 = run(workloads.deploy, cluster.inventory_path, "jupyter", show_secret=False)
    assert token not in text2 and "token=<redacted>" in text2
    # the redeploy read the existing Secret: neither the token nor its base64 reaches its run
    # folder (security review 2, L2)
    written2 = "".join(p.read_text() for p in Path(again["run_dir"]).iterdir())
    assert token not in written2 and secret["data"]["token"] not in written2
    assert "port-forward service/jupyter 8888:8888" in text2, text2
    svc = json.loads(kubectl(cluster, "get service jupyter -n ml -o json"))["spec"]
    assert svc["type"] == "ClusterIP" and "nodePort" not in svc["ports"][0]
    deadline = time.monotonic() + 15   # kube-proxy drops the NodePort's rules
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status", timeout=5).close()
        except urllib.error.HTTPError:
            pass
        except OSError:
            break
        assert time.monotonic() < deadline, f"{base} still answers"
        time.sleep(1)
    run(workloads.undeploy, cluster.inventory_path, "jupyter")


def test_tensorboard_serves_the_training_runs_scalars(cluster: Lab) -> None:
    result, text = run(workloads.deploy, cluster.inventory_path, "tensorboard")
    assert result["objects"] == {"Deployment/tensorboard": "1/1 available"}
    (pod,) = pods(cluster, "tensorboard")
    assert pod["spec"]["nodeName"] != "cp-01"   # the control plane keeps its taint
    assert "nvidia.com/gpu" not in json.dumps(pod["spec"]["containers"][0]["resources"])
    # a ClusterIP (security review 2, L5): reached from inside the cluster, here a node
    svc = json.loads(kubectl(cluster, "get service tensorboard -n ml -o json"))["spec"]
    assert svc["type"] == "ClusterIP" and "nodePort" not in svc["ports"][0]
    assert "port-forward service/tensorboard 6006:6006" in text, text
    url = f"http://{svc['clusterIP']}:6006"

    def get_json(path: str) -> Any:
        return json.loads(get_in_cluster(cluster, url + path))

    assert isinstance(get_json("/data/runs"), list)
    tags = get_json("/data/plugin/scalars/tags")
    assert {"loss", "accuracy"} <= set(tags["mnist"])
    points = get_json("/data/plugin/scalars/scalars?run=mnist&tag=accuracy")
    assert len(points) == int(EPOCHS) and all(0 <= p[2] <= 1 for p in points)


def test_oversized_request_is_pending_with_the_scheduler_reason(cluster: Lab) -> None:
    run(workloads.undeploy, cluster.inventory_path, "jupyter")
    with pytest.raises(workloads.WorkloadError) as exc:
        run(workloads.deploy, cluster.inventory_path, "jupyter", sets=["gpus=4"],
            pending_grace=5, timeout=120)
    message = str(exc.value)
    assert "is Pending: the scheduler cannot place it: 0/4 nodes are available" in message
    assert "Insufficient nvidia.com/gpu" in message
    run(workloads.undeploy, cluster.inventory_path, "jupyter")


def test_verify_runs_nvidia_smi_in_real_pods(cluster: Lab) -> None:
    # the driver check alone: the real nvidia-smi output of the CUDA image's pods
    result, _text = run(workloads.verify, cluster.inventory_path, sets=["tensorflow=false"])
    nodes = result["nodes"]
    assert set(nodes) == set(GPU_NODES)
    for node, count in GPU_NODES.items():
        assert nodes[node]["ok"], nodes[node]
        assert nodes[node]["expected"] == nodes[node]["allocatable"] == count
        assert nodes[node]["nvidia_smi"] == count
    assert nodes["gpu-01"]["models"] == ["NVIDIA H100 80GB HBM3"] * 2
    assert nodes["gpu-02"]["models"][0].startswith("NVIDIA H200")
    # with TensorFlow's stage: the lab images' CPU TensorFlow sees no GPU, and verify says
    # so per node instead of passing
    with pytest.raises(workloads.WorkloadError, match="verify failed on gpu-01, gpu-02"):
        run(workloads.verify, cluster.inventory_path)
    report = json.loads(max(Path(os.environ["GPUK8S_RUNS_DIR"]).glob("*-verify/report.json"),
                            key=lambda p: p.stat().st_mtime).read_text())
    assert {n: v["tensorflow"] for n, v in report["verify"].items()} == {"gpu-01": 0,
                                                                          "gpu-02": 0}


def test_a_pods_own_nvidia_visible_devices_gets_it_no_other_gpu(cluster: Lab) -> None:
    """Security review 2, L6: on gpu-01 (2 H100s) a pod that asks for 1 GPU and sets
    NVIDIA_VISIBLE_DEVICES=all sees its 1 GPU only, and one that asks for none sees none: the
    toolkit gpuk8s configured ignores the variable in unprivileged containers and takes the
    device plugin's volume mounts (the lab's runtime and device plugin play v1.20.0 and
    v0.20.0, tests/lab/CONTRACT.md)."""
    config = "\n" + cluster.ssh("gpu-01", "cat /etc/nvidia-container-runtime/config.toml")[1]
    assert "\naccept-nvidia-visible-devices-envvar-when-unprivileged = false\n" in config
    assert "\naccept-nvidia-visible-devices-as-volume-mounts = true\n" in config
    cuda = "nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04"

    def pod(name: str, gpus: int) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name,
                                                                "namespace": "default"},
                "spec": {"nodeSelector": {"kubernetes.io/hostname": "gpu-01"},
                         "runtimeClassName": "nvidia", "restartPolicy": "Never",
                         "containers": [{
                             "name": "c", "image": cuda,
                             "command": ["sh", "-c", "nvidia-smi -L || echo no nvidia-smi"],
                             "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                             "resources": {"limits": {"nvidia.com/gpu": gpus}} if gpus
                             else {}}]}}

    names = {"grab-one": 1, "grab-none": 0}
    manifest = "\n---\n".join(json.dumps(pod(n, g)) for n, g in names.items())
    rc, out, err = cluster.ssh("cp-01", "kubectl --kubeconfig /etc/kubernetes/admin.conf "
                               f"apply -f - <<'EOF'\n{manifest}\nEOF")
    assert rc == 0, out + err
    try:
        deadline = time.monotonic() + 60
        phases: dict[str, str] = {}
        while time.monotonic() < deadline:
            phases = {n: json.loads(kubectl(cluster, f"get pod {n} -o json")).get(
                "status", {}).get("phase", "") for n in names}
            if all(p in ("Succeeded", "Failed") for p in phases.values()):
                break
            time.sleep(1)
        assert phases == {"grab-one": "Succeeded", "grab-none": "Succeeded"}, phases
        one = kubectl(cluster, "logs grab-one")
        assert one.count("GPU ") == 1 and "NVIDIA H100" in one, one
        none = kubectl(cluster, "logs grab-none")
        assert "no nvidia-smi" in none and "GPU " not in none, none
    finally:
        kubectl(cluster, "delete pod grab-one grab-none --ignore-not-found --wait=false")


def test_a_failing_job_shows_its_exit_code(cluster: Lab, tmp_path: Path) -> None:
    bad = values_file(tmp_path, command=["python3", "-c", "import sys; print('giving up'); "
                                                          "sys.exit(3)"])
    with pytest.raises(workloads.WorkloadError, match="Job tensorflow-job failed"):
        run(workloads.deploy, cluster.inventory_path, "tensorflow-job", values_files=[bad])
    (pod,) = pods(cluster, "tensorflow-job")
    state = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (state["exitCode"], state["reason"]) == (3, "Error")
    assert pod_log(cluster, pod) == "giving up\n"


def test_a_pod_over_its_memory_limit_is_oomkilled(cluster: Lab, tmp_path: Path) -> None:
    hog = values_file(tmp_path, memory="128Mi", command=[
        "python3", "-c", "block = bytearray(512 * 1024 * 1024); print(len(block))"])
    with pytest.raises(workloads.WorkloadError) as exc:
        run(workloads.deploy, cluster.inventory_path, "tensorflow-job", values_files=[hog])
    (pod,) = pods(cluster, "tensorflow-job")
    state = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (state["exitCode"], state["reason"]) == (137, "OOMKilled")
    assert "Job tensorflow-job failed" in str(exc.value)


def test_a_wrong_mirror_names_the_image_the_node_and_containerds_error(cluster: Lab,
                                                                      tmp_path: Path) -> None:
    """A wrong mirror URL in the inventory is refused by preflight before any node changes,
    naming the node and the mirror; a mirror that stops answering after bootstrap fails the
    pull in the real containerd, and deploy says which image, on which node, and why."""
    wrong = f"http://{HOST_IP}:5999"
    with pytest.raises(PreflightError) as refused:
        api.bootstrap(cluster.inventory_path, limit="gpu-02", yes=True,
                      sets=[f"registry_mirrors={json.dumps({'docker.io': [wrong]})}"],
                      reporter=Reporter(io.StringIO()))
    (problem,) = refused.value.problems["gpu-02"]
    assert problem[0] == "registry_mirror"
    assert f"mirror {wrong} (of docker.io) does not answer from this node" in problem[1]
    rc, hosts, _ = cluster.ssh("gpu-02", "cat /etc/containerd/certs.d/docker.io/hosts.toml")
    assert rc == 0 and wrong not in hosts and f'[host."{REGISTRY_URL}"]' in hosts

    on_gpu02 = values_file(tmp_path, imagePullPolicy="Always", storage={"enabled": False},
                           nodeSelector={"kubernetes.io/hostname": "gpu-02"})
    # the lab's mirror goes away after bootstrap, as gpu-02 sees it: its connections to the
    # registry are refused (the registry itself keeps serving the other lab instance)
    def refuse(action: str, check: bool = True) -> None:
        subprocess.run(["ip", "netns", "exec", net.netns_name("gpu-02"), "iptables", action,
                        "OUTPUT", "-p", "tcp", "-d", HOST_IP, "--dport", str(REGISTRY_PORT),
                        "-j", "REJECT", "--reject-with", "tcp-reset"], check=check)

    refuse("-I")
    try:
        with pytest.raises(workloads.WorkloadError) as exc:
            run(workloads.deploy, cluster.inventory_path, "eval", values_files=[on_gpu02],
                pending_grace=5, timeout=180)
    finally:
        refuse("-D", check=False)  # never hides the deploy's own failure
        run(workloads.undeploy, cluster.inventory_path, "eval")
    message = str(exc.value)
    assert "on node gpu-02" in message
    assert 'image "tensorflow/tensorflow:2.21.0-gpu"' in message
    assert f"{HOST_IP}:5000" in message and "connection refused" in message


def test_a_pod_whose_runner_died_gets_a_new_sandbox_and_leaks_no_network(cluster: Lab) -> None:
    """The lab kubelet's pod runner SIGKILLed (as systemd ends one that outlives its stop
    timeout) cannot give the pod's network namespace back; the kubelet stand-in starts the
    pod again, as the kubelet replaces a dead sandbox, and removes the old namespace first
    (CI once found one left after undeploy). A new namespace has a new inode."""
    (pod,) = pods(cluster, "tensorboard")
    node, uid = pod["spec"]["nodeName"], pod["metadata"]["uid"]
    netns = f"/var/run/netns/gpuk8s-{uid[:13]}"
    rc, before, err = cluster.ssh(node, f"stat -L -c %i {netns}")
    assert rc == 0, err
    rc, _, err = cluster.ssh(node, f"systemctl kill -s KILL --kill-whom=main "
                                   f"gpuk8s-lab-pod-{uid}")
    assert rc == 0, err
    deadline = time.monotonic() + 150
    while True:
        rc, after, _ = cluster.ssh(node, f"systemctl is-active --quiet gpuk8s-lab-pod-{uid} && "
                                         f"stat -L -c %i {netns}")
        (now,) = pods(cluster, "tensorboard")
        ready = all(c.get("ready") for c in now["status"].get("containerStatuses") or [{}])
        if rc == 0 and after.strip() != before.strip() and ready:
            break
        assert time.monotonic() < deadline, f"{node}: no new sandbox for {uid} ({after!r})"
        time.sleep(3)
    # the new sandbox serves: through the Service's ClusterIP (no NodePort since review 2, L5)
    ip = json.loads(kubectl(cluster, "get service tensorboard -n ml -o json"))["spec"][
        "clusterIP"]
    assert get_in_cluster(cluster, f"http://{ip}:6006/data/runs", "-o", "/dev/null",
                          "-w", "%{http_code}") == "200"
    rc, out, _ = cluster.ssh(node, "ip netns list")
    assert out.count(f"gpuk8s-{uid[:13]}") == 1, out


#: a claim whose NFS export the server does not have: the lab's share lacks its folder
BROKEN_SHARE = f"""apiVersion: v1
kind: Namespace
metadata: {{name: ml}}
---
apiVersion: v1
kind: PersistentVolume
metadata: {{name: ml-broken-share}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteMany]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  mountOptions: [nfsvers=4.1, hard]
  nfs: {{server: "{HOST_IP}", path: /srv/no-such-export}}
  claimRef: {{namespace: ml, name: broken-share}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: broken-share, namespace: ml}}
spec:
  accessModes: [ReadWriteMany]
  storageClassName: ""
  volumeName: ml-broken-share
  resources: {{requests: {{storage: 1Gi}}}}
"""


def test_a_volume_that_cannot_mount_fails_within_90s_naming_the_event_pod_and_node(
        cluster: Lab) -> None:
    """A claim bound to an NFS export the server does not have: the kubelet cannot mount it
    and the pod stays ContainerCreating with FailedMount events (the real kubelet's text).
    deploy shows the pod's progress as it goes and gives up within 90 s (not after its 600 s
    timeout), naming the event, the pod, its node and a fix. It is a redeploy over a working
    tensorboard, as a person changing a value would do: the old pod's availability does not
    make the new template ready (the full module's run saw that)."""
    assert not (shared_dir() / HOST_IP / "srv/no-such-export").exists()
    run(workloads.deploy, cluster.inventory_path, "tensorboard",
        sets=["storage.enabled=false"], timeout=300)
    rc, out, err = cluster.ssh("cp-01", "kubectl --kubeconfig /etc/kubernetes/admin.conf "
                               f"apply -f - <<'EOF'\n{BROKEN_SHARE}EOF\n")
    assert rc == 0, out + err
    started = time.monotonic()
    try:
        with pytest.raises(workloads.WorkloadError) as exc:
            run(workloads.deploy, cluster.inventory_path, "tensorboard",
                sets=["storage.claimName=broken-share"])
        elapsed = time.monotonic() - started
        (pod,) = pods(cluster, "tensorboard")
        node = pod["spec"]["nodeName"]
        state = pod["status"]["containerStatuses"][0]["state"]
        events = json.loads(kubectl(cluster, "get events -n ml --field-selector "
                                             f"involvedObject.name={pod['metadata']['name']},"
                                             "reason=FailedMount -o json"))["items"]
    finally:
        run(workloads.undeploy, cluster.inventory_path, "tensorboard")
        kubectl(cluster, "delete pvc broken-share -n ml --ignore-not-found")
        kubectl(cluster, "delete pv ml-broken-share --ignore-not-found")
    message = str(exc.value)
    assert elapsed < 90, f"deploy took {elapsed:.0f}s to give up"
    assert state == {"waiting": {"reason": "ContainerCreating"}}
    assert events and events[-1]["message"].startswith(
        'MountVolume.SetUp failed for volume "ml-broken-share" : mount failed: exit status 32\n'
        "Mounting command: mount\nMounting arguments: -t nfs -o nfsvers=4.1,hard "
        f"{HOST_IP}:/srv/no-such-export /var/lib/kubelet/pods/{pod['metadata']['uid']}/")
    assert f"pod {pod['metadata']['name']} on node {node}: FailedMount: MountVolume.SetUp " \
           'failed for volume "ml-broken-share"' in message
    assert "reason given by server: No such file or directory" in message
    assert "fix: the node cannot mount the volume" in message


def test_deploy_fits_80_columns_in_a_pipe_and_shows_progress(cluster: Lab) -> None:
    """`deploy` as a person runs it, with COLUMNS=80 and its output through a pipe: every
    line of the default view fits 80 columns (progress lines are cut, not wrapped into a
    grid) and the pods' progress shows as it happens."""
    runs = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))   # a short run-folder path
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "gpuk8s.cli", "deploy", "tensorboard", "-i",
             str(cluster.inventory_path), "--set", "storage.enabled=false"],
            cwd=REPO_ROOT, capture_output=True, text=True,
            timeout=600, env={**os.environ, "COLUMNS": "80", "GPUK8S_RUNS_DIR": str(runs)})
    finally:
        run(workloads.undeploy, cluster.inventory_path, "tensorboard")
        shutil.rmtree(runs, ignore_errors=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, "\n".join(
        line for line in lines if len(line) > 80)
    assert any(line.lstrip().startswith("tensorboard-") and ": Running" in line
               for line in lines), out
    assert "tensorboard ready (" in out and "Traceback" not in out


def test_verify_leaves_gpus_held_by_pods_and_names_the_holder(cluster: Lab,
                                                            tmp_path: Path) -> None:
    """A Jupyter server holds one of gpu-01's two GPUs: verify's Job there asks for the other
    (asking for both, it stayed Pending and the table printed the scheduler's message), checks
    it, and says which pod holds the first."""
    on_gpu01 = values_file(tmp_path, gpus=1, storage={"enabled": False},
                           nodeSelector={"kubernetes.io/hostname": "gpu-01"})
    run(workloads.deploy, cluster.inventory_path, "jupyter", values_files=[on_gpu01],
        timeout=300)
    try:
        (holder,) = pods(cluster, "jupyter")
        started = time.monotonic()
        result, text = run(workloads.verify, cluster.inventory_path,
                           sets=["tensorflow=false"])
        elapsed = time.monotonic() - started
    finally:
        run(workloads.undeploy, cluster.inventory_path, "jupyter")
    name = f"ml/{holder['metadata']['name']}"
    gpu01, gpu02 = result["nodes"]["gpu-01"], result["nodes"]["gpu-02"]
    assert gpu01["ok"] and gpu01["held"] == {name: 1} and gpu01["checked"] == 1
    assert gpu01["nvidia_smi"] == 1 and gpu01["expected"] == 2
    assert gpu02["ok"] and gpu02["held"] == {} and gpu02["nvidia_smi"] == 1
    flat = " ".join(text.split())
    assert f"gpu-01: 1 GPU held by {name}; verified the 1 free" in flat
    assert "preemption" not in text and "FailedScheduling" not in text
    assert elapsed < 120, f"verify took {elapsed:.0f}s"


def test_undeploy_removes_everything(cluster: Lab) -> None:
    # verify keeps its finished Jobs (and so their pods) until the next verify: undeploy them too
    for name in ("jupyter", "tensorflow-job", "distributed-tf", "eval", "tensorboard", "verify",
                 "storage"):
        run(workloads.undeploy, cluster.inventory_path, name)
        left = kubectl(cluster, f"get deployments,jobs,services,configmaps,secrets,"
                                f"persistentvolumeclaims,pods -n ml -l gpuk8s.io/workload={name}"
                                " -o name")
        assert left.strip() == "", left
    assert kubectl(cluster, "get pv -l gpuk8s.io/workload=storage -o name").strip() == ""
    # and on the nodes: no pod runner, no pod network namespace, no container left
    for node in GPU_NODES:
        deadline = time.monotonic() + 120
        while True:
            rc, out, _ = cluster.ssh(node, "ls /run/gpuk8s-lab/pods; ip netns list; "
                                           "ctr -n k8s.io tasks ls -q")
            if rc == 0 and not out.strip():
                break
            assert time.monotonic() < deadline, f"{node} still has: {out}"
            time.sleep(3)
