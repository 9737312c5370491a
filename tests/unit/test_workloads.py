"""Workload manifests: golden files per workload (default and custom values), every object
validated against the Kubernetes 1.36 OpenAPI schema in strict mode (kubernetes-validate), and
the values layer's edge cases. GPUK8S_UPDATE_GOLDEN=1 rewrites the golden files."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpuk8s import workloads as w
from gpuk8s.report import Reporter
from tests.unit.fakes import op_bodies, runner_for, sectioned

GOLDEN = Path(__file__).parent / "golden" / "workloads"
#: newest schema kubernetes-validate ships that is <= the default kubernetes_version (1.36)
K8S_SCHEMA = "1.36.0"

CASES: dict[str, tuple[str, list[str]]] = {
    "storage-default": ("storage", ["nfs.server=10.0.0.5"]),
    "storage-class": ("storage", ["storageClassName=nfs-csi", "size=1Ti"]),
    "jupyter-default": ("jupyter", []),
    "jupyter-nodeport": ("jupyter", ["service.type=NodePort"]),
    "jupyter-custom": ("jupyter", ["gpus=2", "service.nodePort=null", "namespace=team-a",
                                   "nodeSelector.gpu-type=h100", "storage.enabled=false"]),
    "tensorflow-job-default": ("tensorflow-job", []),
    "tensorflow-job-custom": ("tensorflow-job", ["image=registry.lab/train:1", "epochs=10",
                                                 "command=[python3, /app/train.py]",
                                                 "extraEnv.WANDB_MODE=offline"]),
    "distributed-tf-default": ("distributed-tf", []),
    "distributed-tf-three": ("distributed-tf", ["workers=3"]),
    "distributed-tf-tfjob": ("distributed-tf", ["tfjob=true"]),
    "tensorboard-default": ("tensorboard", []),
    "eval-default": ("eval", []),
    "eval-cpu": ("eval", ["gpus=0", "run=exp7"]),
}


def rendered(case: str) -> list[dict[str, Any]]:
    name, sets = CASES[case]
    extra = {"nfs_server": "10.88.0.11"} if name == "storage" else {}
    return w.render(name, w.load_values(name, sets=sets), **extra)


def validate(doc: dict[str, Any]) -> None:
    if doc["kind"] == "TFJob":   # a CRD: validate each replica's pod template as a Pod
        for role, spec in doc["spec"]["tfReplicaSpecs"].items():
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": f"tfjob-{role.lower()}", **spec["template"]["metadata"]},
                   "spec": spec["template"]["spec"]}
            kubernetes_validate.validate(pod, K8S_SCHEMA, strict=True)
        return
    kubernetes_validate.validate(doc, K8S_SCHEMA, strict=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_and_schema(case: str) -> None:
    docs = rendered(case)
    text = w.dump(docs)
    path = GOLDEN / f"{case}.yaml"
    if os.environ.get("GPUK8S_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with GPUK8S_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{case} differs from {path}"
    for doc in docs:
        validate(doc)
        labels = doc["metadata"]["labels"]
        assert labels[w.MANAGED] == "gpuk8s"
        assert labels[w.LABEL] == CASES[case][0]
        for tpl in w.pod_templates(doc):
            assert tpl["metadata"]["labels"][w.LABEL] == CASES[case][0]


def test_schema_check_catches_a_bad_manifest() -> None:
    """The strict validation is not a check that cannot fail."""
    doc = rendered("jupyter-default")[1]
    doc["spec"]["template"]["spec"]["containers"][0]["gpu"] = 1   # unknown field
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(doc)
    doc = rendered("tensorflow-job-default")[1]
    doc["spec"]["backoffLimit"] = "zero"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(doc)


def _by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind)


def test_gpu_pods_ask_for_gpus_with_the_nvidia_runtime() -> None:
    for case, want in (("jupyter-default", 1), ("jupyter-custom", 2),
                       ("tensorflow-job-default", 1), ("eval-default", 1),
                       ("distributed-tf-default", 1)):
        for doc in rendered(case):
            for tpl in w.pod_templates(doc):
                spec = tpl["spec"]
                assert spec["runtimeClassName"] == "nvidia"
                assert {"key": "nvidia.com/gpu", "operator": "Exists",
                        "effect": "NoSchedule"} in spec["tolerations"]
                limits = spec["containers"][0]["resources"]["limits"]
                assert limits["nvidia.com/gpu"] == want, case
    eval_cpu = _by_kind(rendered("eval-cpu"), "Job")["spec"]["template"]["spec"]
    assert "runtimeClassName" not in eval_cpu
    assert "nvidia.com/gpu" not in eval_cpu["containers"][0]["resources"]["limits"]
    tb = _by_kind(rendered("tensorboard-default"), "Deployment")["spec"]["template"]["spec"]
    assert "runtimeClassName" not in tb
    # memory: requested and capped at the same size (over it, the pod is OOMKilled)
    assert tb["containers"][0]["resources"]["limits"] == {"memory": "2Gi"}
    assert tb["containers"][0]["resources"]["requests"]["memory"] == "2Gi"


def test_images_are_pinned() -> None:
    for case in CASES:
        for doc in rendered(case):
            for tpl in w.pod_templates(doc):
                for c in tpl["spec"]["containers"]:
                    image = c["image"]
                    assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), \
                        (case, image)
    assert _by_kind(rendered("jupyter-default"), "Deployment")["spec"]["template"]["spec"][
        "containers"][0]["image"] == "tensorflow/tensorflow:2.21.0-gpu-jupyter"


def test_jupyter_token_comes_from_the_secret_not_argv() -> None:
    dep = _by_kind(rendered("jupyter-default"), "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    assert env["JUPYTER_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "jupyter-token",
                                                                  "key": "token"}
    assert "token" not in " ".join(c["command"]).lower()
    svc = _by_kind(rendered("jupyter-default"), "Service")
    assert svc["spec"]["type"] == "ClusterIP" and "nodePort" not in svc["spec"]["ports"][0]
    assert "nodePort" not in _by_kind(rendered("jupyter-custom"), "Service")["spec"]["ports"][0]
    nb = json.loads(_by_kind(rendered("jupyter-default"), "ConfigMap")["data"]["gpus.ipynb"])
    assert "list_physical_devices('GPU')" in "".join(nb["cells"][1]["source"])


def test_storage_pv_and_claim() -> None:
    pv, pvc = rendered("storage-default")
    assert pv["kind"] == "PersistentVolume" and pvc["kind"] == "PersistentVolumeClaim"
    assert pv["spec"]["nfs"] == {"server": "10.0.0.5", "path": "/srv/gpuk8s"}
    assert pv["spec"]["accessModes"] == pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    assert pv["spec"]["claimRef"] == {"namespace": "ml", "name": "gpuk8s-shared"}
    (only,) = rendered("storage-class")
    assert only["kind"] == "PersistentVolumeClaim"
    assert only["spec"]["storageClassName"] == "nfs-csi" and "volumeName" not in only["spec"]
    # gpuk8s' own export: the server is the control plane's address
    docs = w.render("storage", w.load_values("storage"), nfs_server="10.88.0.11")
    assert docs[0]["spec"]["nfs"]["server"] == "10.88.0.11"


def _tf_config(env: dict[str, str], index: int) -> dict[str, Any]:
    """Run the training script's TF_CONFIG prelude as a pod with this index would."""
    script = (w.workloads_dir() / "_train.py.j2").read_text()
    prelude = script.split("import numpy")[0]
    environ = {**env, "JOB_COMPLETION_INDEX": str(index)}
    ns: dict[str, Any] = {}
    saved = dict(os.environ)
    try:
        os.environ.update(environ)
        exec(compile(prelude, "train.py", "exec"), ns)
        return json.loads(os.environ["TF_CONFIG"])
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_distributed_tf_config_from_the_index() -> None:
    docs = rendered("distributed-tf-default")
    job, svc = _by_kind(docs, "Job"), _by_kind(docs, "Service")
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    assert svc["spec"]["clusterIP"] == "None"
    assert job["spec"]["template"]["spec"]["subdomain"] == svc["metadata"]["name"]
    env = {e["name"]: e["value"] for e in
           job["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}
    cfg = _tf_config(env, 1)
    assert cfg == {"cluster": {"worker": [
        "distributed-tf-0.distributed-tf.ml.svc:2222",
        "distributed-tf-1.distributed-tf.ml.svc:2222"]}, "task": {"type": "worker", "index": 1}}
    three = _by_kind(rendered("distributed-tf-three"), "Job")
    assert three["spec"]["completions"] == three["spec"]["parallelism"] == 3
    env = {e["name"]: e["value"] for e in
           three["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}
    cfg = _tf_config(env, 2)
    assert cfg["task"] == {"type": "worker", "index": 2} and len(cfg["cluster"]["worker"]) == 3
    assert "successPolicy" not in three["spec"]  # every worker must finish
    tfjob = _by_kind(rendered("distributed-tf-tfjob"), "TFJob")
    assert tfjob["apiVersion"] == "kubeflow.org/v1"
    assert set(tfjob["spec"]["tfReplicaSpecs"]) == {"Worker"}
    assert tfjob["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] == 2


@pytest.mark.parametrize("sets", [["ps=1"], ["ps=2", "workers=3"], ["tfjob=true", "ps=1"]])
def test_parameter_servers_are_refused_before_anything_is_applied(sets: list[str]) -> None:
    with pytest.raises(w.WorkloadError, match=r"ps=\d is refused: parameter-server training.*"
                       r"MultiWorkerMirroredStrategy.*--set workers=N"):
        w.load_values("distributed-tf", sets=sets)


def test_verify_job_per_node() -> None:
    values = w.load_values("verify")
    nodes = [{"name": "gpu-01", "gpus": 2}, {"name": "gpu-02", "gpus": 1}]
    for stage, image in (("smi", "nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04"),
                         ("tf", "tensorflow/tensorflow:2.21.0-gpu")):
        docs = w.render("verify", values, gpu_nodes=nodes, stage=stage)
        assert [d["metadata"]["name"] for d in docs] == [f"verify-{stage}-gpu-01",
                                                         f"verify-{stage}-gpu-02"]
        for doc, node in zip(docs, nodes, strict=True):
            validate(doc)
            spec = doc["spec"]["template"]["spec"]
            assert spec["nodeSelector"] == {"kubernetes.io/hostname": node["name"]}
            assert spec["containers"][0]["image"] == image
            assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == node["gpus"]


def test_gpu_nodes_from_node_list() -> None:
    def node(name: str, labels: dict[str, str], gpu: str | None) -> dict[str, Any]:
        alloc = {"cpu": "8"} | ({"nvidia.com/gpu": gpu} if gpu else {})
        return {"metadata": {"name": name, "labels": labels},
                "status": {"allocatable": alloc, "conditions": []}}

    data = {"items": [
        node("cp-01", {}, None),
        node("gpu-01", {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "2"}, "2"),
        node("gpu-02", {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "1"}, None),
        node("gpu-03", {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "1",
                        "nvidia.com/gpu.replicas": "4"}, "4"),
    ]}
    plain = {"mig": "", "mig_offered": 0}
    assert w.gpu_nodes(data) == [
        {"name": "gpu-01", "gpus": 2, "allocatable": 2, "replicas": 1, **plain,
         "limits": {"nvidia.com/gpu": 2}},
        {"name": "gpu-02", "gpus": 1, "allocatable": None, "replicas": 1, **plain,
         "limits": {"nvidia.com/gpu": 1}},
        {"name": "gpu-03", "gpus": 1, "allocatable": 4, "replicas": 4, **plain,
         "limits": {"nvidia.com/gpu": 1}}]
    check = w.NodeCheck("gpu-02", 1, None, smi=["NVIDIA H200"], tf=1)
    assert not check.ok   # allocatable missing: the device plugin is not advertising
    # time-sliced: 1 GPU offered 4 times is right; 1 offered once is not
    assert w.NodeCheck("gpu-03", 1, 4, smi=["NVIDIA H200"], tf=1, replicas=4).ok
    assert not w.NodeCheck("gpu-03", 1, 1, smi=["NVIDIA H200"], tf=1, replicas=4).ok


def _gpu_pod(ns: str, name: str, node: str, gpus: int, phase: str = "Running",
             labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name, "labels": labels or {}},
            "spec": {"nodeName": node, "containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": phase}}


def test_verify_asks_only_for_the_gpus_that_running_pods_leave_free() -> None:
    """A Jupyter server holds one GPU of gpu-01 (2 GPUs): verify's Job there asks for the
    other one (asking for both, it stayed Pending until the timeout), gpu-02's whole GPU is
    held so it is not checked, and both say by which pods; pods that ended, verify's own and
    unbound ones hold nothing."""
    from gpuk8s.workloads.verify import _print, gpu_holders, leave_held
    pods = {"items": [
        _gpu_pod("ml", "jupyter-abc", "gpu-01", 1),
        _gpu_pod("ml", "train-1", "gpu-01", 1, phase="Succeeded"),
        _gpu_pod("gpu-verify", "verify-smi-gpu-01-x", "gpu-01", 2,
                 labels={"gpuk8s.io/workload": "verify"}),
        _gpu_pod("ml", "eval-x", "gpu-02", 1),
        _gpu_pod("ml", "pending-x", "", 1, phase="Pending"),
        {"metadata": {"namespace": "kube-system", "name": "cpu-only"},
         "spec": {"nodeName": "gpu-01", "containers": [{"name": "c"}]},
         "status": {"phase": "Running"}}]}
    holders = gpu_holders(pods)
    assert holders == {"gpu-01": {"ml/jupyter-abc": {"nvidia.com/gpu": 1}},
                       "gpu-02": {"ml/eval-x": {"nvidia.com/gpu": 1}}}
    one = {"name": "gpu-01", "gpus": 2, "limits": {"nvidia.com/gpu": 2}}
    assert leave_held(one, {"nvidia.com/gpu": 2}, holders["gpu-01"]) == {"ml/jupyter-abc": 1}
    assert one["limits"] == {"nvidia.com/gpu": 1}
    two = {"name": "gpu-02", "gpus": 1, "limits": {"nvidia.com/gpu": 1}}
    leave_held(two, {"nvidia.com/gpu": 1}, holders["gpu-02"])
    assert two["limits"] == {}
    # the Job renders with the free count
    (doc,) = w.render("verify", w.load_values("verify"), gpu_nodes=[one], stage="smi")
    limits = doc["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": 1}

    half = w.NodeCheck("gpu-01", 2, 2, smi=["NVIDIA H100 80GB HBM3"], with_tf=False,
                       held={"ml/jupyter-abc": 1}, checked=1)
    full = w.NodeCheck("gpu-02", 1, 1, with_tf=False, held={"ml/eval-x": 1}, checked=0)
    assert half.ok and not half.skipped and full.ok and full.skipped
    # the free GPU must still show: none seen is a failure
    assert not w.NodeCheck("gpu-01", 2, 2, smi=[], with_tf=False, held={"ml/j": 1},
                           checked=1).ok
    out = io.StringIO()
    rep = Reporter(out)
    rep.console.width = 80
    _print(rep, [half, full], with_tf=False)
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    flat = " ".join(text.replace("│", " ").split())
    wide = io.StringIO()
    rep = Reporter(wide)
    rep.console.width = 200
    _print(rep, [half, full], with_tf=False)
    assert "1 (free: 1 of 2)" in wide.getvalue()
    assert "gpu-01: 1 GPU held by ml/jupyter-abc; verified the 1 free" in flat
    assert ("gpu-02: all 1 GPU held by ml/eval-x; not checked: run verify again when one is "
            "free") in flat
    assert "gpu-02 1 1 - - not checked" in flat


def test_verify_says_in_a_sentence_why_its_pod_cannot_be_placed() -> None:
    from gpuk8s.workloads.verify import scheduler_words
    msg = ("0/4 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated "
           "taint {node-role.kubernetes.io/control-plane: }, 2 node(s) didn't match Pod's node "
           "affinity/selector. preemption: 0/4 nodes are available: 1 No preemption victims "
           "found for incoming pod, 3 Preemption is not helpful for scheduling.")
    assert scheduler_words(msg) == (
        "0/4 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated "
        "taint {node-role.kubernetes.io/control-plane: }, 2 node(s) didn't match Pod's node "
        "affinity/selector")


# -- values -------------------------------------------------------------------------------------
def test_values_precedence(tmp_path: Path) -> None:
    f = tmp_path / "v.yaml"
    f.write_text("gpus: 2\nservice: {nodePort: 31000}\nnodeSelector: {pool: a100}\n")
    v = w.load_values("jupyter", [f], ["gpus=3"])
    assert v["gpus"] == 3                       # --set beats the file
    assert v["service"] == {"type": "ClusterIP", "port": 8888, "nodePort": 31000}  # deep merge
    assert v["nodeSelector"] == {"pool": "a100"}  # free-form mapping
    assert v["namespace"] == "ml"               # shared default
    assert w.load_values("jupyter", sets=["cpu=4"])["cpu"] == "4"


@pytest.mark.parametrize("expr, message", [
    ("gpus", "expected key.sub=value"),
    ("gpus.count=2", "gpus is 1 (int), not a mapping"),
    ("gpu=2", "unknown value 'gpu'"),
    ("service.nodeport=1", "unknown value 'service.nodeport'"),
    ("gpus=two", "gpus expects an integer, got 'two'"),
    ("storage.enabled=maybe", "storage.enabled expects true or false"),
    ("service=3", "service expects a mapping"),
    ("a..b=1", "expected key.sub=value"),
    ("namespace=kube-system", "namespace 'kube-system' is refused: kube-* namespaces"),
    ("namespace=ML", "namespace 'ML' is refused: a namespace must be a DNS-1123 label"),
    ("storage.claimName=my_claim", "storage.claimName 'my_claim' is refused: a Kubernetes "
                                   "object name must be a DNS-1123 subdomain"),
    ("tokenSecret=a/b", "tokenSecret 'a/b' is refused"),
])
def test_bad_set_is_a_clear_error(expr: str, message: str) -> None:
    with pytest.raises(w.WorkloadError) as exc:
        w.load_values("jupyter", sets=[expr])
    assert message in str(exc.value)
    assert f"--set {expr}" in str(exc.value)


def test_bad_values_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(w.WorkloadError, match="must be a mapping"):
        w.load_values("jupyter", [bad])
    bad.write_text("servce: {type: ClusterIP}\n")
    with pytest.raises(w.WorkloadError, match=r"values file .*bad.yaml: unknown value 'servce'"):
        w.load_values("jupyter", [bad])
    bad.write_text("service: {nodeport: 30999}\n")   # nested keys are named in full
    with pytest.raises(w.WorkloadError,
                       match=r"values file .*bad.yaml: unknown value 'service.nodeport'"):
        w.load_values("jupyter", [bad])
    with pytest.raises(w.WorkloadError, match="cannot read values file"):
        w.load_values("jupyter", [tmp_path / "missing.yaml"])


def test_unknown_workload() -> None:
    with pytest.raises(w.WorkloadError, match="unknown workload 'jupiter'"):
        w.load_values("jupiter")


def test_snapshot_reports_unschedulable_with_the_scheduler_reason() -> None:
    """The wait loop's judgement on real kubectl JSON shapes (a fake control plane)."""
    msg = ("0/4 nodes are available: 1 node(s) had untolerated taint "
           "{node-role.kubernetes.io/control-plane: }, 3 Insufficient nvidia.com/gpu. "
           "preemption: 0/4 nodes are available: 1 Preemption is not helpful for scheduling, "
           "3 No preemption victims found for incoming pod.")
    objects = {"items": [
        {"kind": "Deployment", "metadata": {"name": "jupyter"}, "spec": {"replicas": 1},
         "status": {}},
        {"kind": "Pod", "metadata": {"name": "jupyter-abc"},
         "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": 4}}}]},
         "status": {"phase": "Pending", "conditions": [
             {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
              "message": "stale"}]}}]}
    events = {"items": [{"involvedObject": {"kind": "Pod", "name": "jupyter-abc"},
                         "reason": "FailedScheduling", "message": msg,
                         "lastTimestamp": "2026-01-01T00:00:00Z"}]}

    class FakeRemote:
        host = "cp-01"

        def probe(self, commands: dict[str, str]) -> dict[str, tuple[int, str]]:
            assert "-l gpuk8s.io/workload=jupyter" in commands["objects"]
            return {"objects": (0, json.dumps(objects)), "events": (0, json.dumps(events))}

    since: dict[str, float] = {}
    first = w.snapshot(FakeRemote(), "ml", "gpuk8s.io/workload=jupyter", since,  # type: ignore[arg-type]
                       pending_grace=60)
    assert not first.ready and not first.problems   # still within the grace time
    assert first.pods[0].detail == f"FailedScheduling: {msg}"
    assert first.pods[0].gpus == 4
    later = w.snapshot(FakeRemote(), "ml", "gpuk8s.io/workload=jupyter",  # type: ignore[arg-type]
                       {"jupyter-abc": since["jupyter-abc"] - 61}, pending_grace=60)
    assert not later.ready
    assert later.problems == [f"pod jupyter-abc is Pending: the scheduler cannot place it: {msg}"]
    assert later.objects == {"Deployment/jupyter": "0/1 available"}


def _fake_remote(items: list[dict[str, Any]]) -> Any:
    class FakeRemote:
        host = "cp-01"

        def probe(self, commands: dict[str, str]) -> dict[str, tuple[int, str]]:
            return {"objects": (0, json.dumps({"items": items})),
                    "events": (0, json.dumps({"items": []}))}

    return FakeRemote()


def test_snapshot_names_the_image_node_and_runtime_error_of_a_failed_pull() -> None:
    """containerd's message as the kubelet puts it in the container's waiting state (the
    shape the lab's real containerd gives through the kubelet stand-in)."""
    err = ('Failed to pull image "tensorflow/tensorflow:2.21.0-gpu": failed to pull and '
           'unpack image "docker.io/tensorflow/tensorflow:2.21.0-gpu": failed to resolve '
           'reference "docker.io/tensorflow/tensorflow:2.21.0-gpu": failed to do request: '
           'Head "http://10.0.0.9:5000/v2/tensorflow/tensorflow/manifests/2.21.0-gpu?ns='
           'docker.io": dial tcp 10.0.0.9:5000: connect: no route to host')
    pod = {"kind": "Pod", "metadata": {"name": "tensorflow-job-x"},
           "spec": {"nodeName": "gpu-02", "containers": [{"name": "train"}]},
           "status": {"phase": "Pending", "containerStatuses": [
               {"name": "train", "state": {"waiting": {"reason": "ErrImagePull",
                                                       "message": err}}}]}}
    job = {"kind": "Job", "metadata": {"name": "tensorflow-job"}, "spec": {}, "status": {}}
    since: dict[str, float] = {}
    first = w.snapshot(_fake_remote([job, pod]), "ml", "x=y", since, pending_grace=30)
    assert not first.problems and first.pods[0].detail == f"ErrImagePull: {err}"
    since = {k: v - 31 for k, v in since.items()}
    later = w.snapshot(_fake_remote([job, pod]), "ml", "x=y", since, pending_grace=30)
    (problem,) = later.problems
    assert problem.startswith(f"pod tensorflow-job-x on node gpu-02: ErrImagePull: {err}\n")
    assert "fix: check the image name and that the node reaches its registry" in problem


#: the kubelet's FailedMount for an NFS export the server does not have (kubernetes v1.35.0:
#: pkg/volume/util/operationexecutor/operation_generator.go "MountVolume.SetUp failed",
#: staging/src/k8s.io/mount-utils/mount_linux.go "mount failed: ...")
MOUNT_ERR = ('MountVolume.SetUp failed for volume "ml-broken" : mount failed: exit status 32\n'
             "Mounting command: mount\nMounting arguments: -t nfs 10.0.0.1:/srv/missing "
             "/var/lib/kubelet/pods/u-1/volumes/kubernetes.io~nfs/ml-broken\n"
             "Output: mount.nfs: mounting 10.0.0.1:/srv/missing failed, reason given by "
             "server: No such file or directory\n")


def _creating_pod(uid: str = "u-1") -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": "tensorboard-x", "namespace": "ml", "uid": uid},
            "spec": {"nodeName": "gpu-01", "containers": [{"name": "tensorboard"}]},
            "status": {"phase": "Pending", "containerStatuses": [
                {"name": "tensorboard", "state": {"waiting": {"reason": "ContainerCreating"}}}]}}


def _event(reason: str, message: str, etype: str = "Warning", uid: str = "u-1",
           at: str = "2026-01-01T00:00:05Z") -> dict[str, Any]:
    return {"involvedObject": {"kind": "Pod", "name": "tensorboard-x", "uid": uid},
            "type": etype, "reason": reason, "message": message, "lastTimestamp": at}


DEPLOYMENT = {"kind": "Deployment", "metadata": {"name": "tensorboard"},
              "spec": {"replicas": 1}, "status": {}}


def _remote_with_events(items: list[dict[str, Any]], events: list[dict[str, Any]]) -> Any:
    items = [DEPLOYMENT, *items]

    class FakeRemote:
        host = "cp-01"

        def probe(self, commands: dict[str, str]) -> dict[str, tuple[int, str]]:
            return {"objects": (0, json.dumps({"items": items})),
                    "events": (0, json.dumps({"items": events}))}

    return FakeRemote()


def test_a_volume_that_cannot_mount_is_a_problem_after_the_mount_grace_time() -> None:
    """A pod stuck in ContainerCreating whose latest event is FailedMount: named with its node,
    the kubelet's text and a fix once it has lasted kube.MOUNT_GRACE (the kubelet retries
    mounts), not at the first failure and not after the 600 s deploy timeout."""
    from gpuk8s.ops.kube import MOUNT_GRACE
    remote = _remote_with_events([_creating_pod()], [
        _event("Scheduled", "Successfully assigned ml/tensorboard-x to gpu-01", "Normal",
               at="2026-01-01T00:00:01Z"),
        _event("FailedMount", MOUNT_ERR)])
    since: dict[str, float] = {}
    first = w.snapshot(remote, "ml", "x=y", since, pending_grace=20)
    assert not first.problems and not first.ready
    (row,) = first.pods
    assert row.status == "ContainerCreating"
    assert row.event == ('FailedMount: MountVolume.SetUp failed for volume "ml-broken" : '
                         "mount failed: exit status 32")
    assert row.detail.startswith("FailedMount: MountVolume.SetUp failed")
    almost = w.snapshot(remote, "ml", "x=y", {k: v - (MOUNT_GRACE - 2) for k, v in
                                               since.items()}, pending_grace=20)
    assert not almost.problems   # past pending_grace but within the mount's grace time
    later = w.snapshot(remote, "ml", "x=y", {k: v - MOUNT_GRACE for k, v in since.items()},
                       pending_grace=20)
    (problem,) = later.problems
    assert problem.startswith("pod tensorboard-x on node gpu-01: FailedMount: "
                              + MOUNT_ERR.strip().replace("\n", "\n    ") + "\n    fix: ")
    assert "fix: the node cannot mount the volume" in problem
    assert 45 <= MOUNT_GRACE <= 60


def test_a_mount_that_recovers_or_an_earlier_pods_event_is_no_problem() -> None:
    """FailedMount counts only while it is the pod's latest Warning and the pod is still
    being created, and only the events of this pod (its uid), not of an earlier one."""
    old = _event("FailedMount", MOUNT_ERR, uid="u-0")
    stale = w.snapshot(_remote_with_events([_creating_pod()], [old]), "ml", "x=y",
                       {"tensorboard-x/mount": -1e9}, pending_grace=0)
    assert not stale.problems and stale.pods[0].event == ""
    running = _creating_pod()
    running["status"] = {"phase": "Running", "containerStatuses": [
        {"name": "tensorboard", "state": {"running": {}}}]}
    healed = w.snapshot(_remote_with_events([running], [_event("FailedMount", MOUNT_ERR)]),
                        "ml", "x=y", {"tensorboard-x/mount": -1e9}, pending_grace=0)
    assert not healed.problems and healed.pods[0].status == "Running"


@pytest.mark.parametrize(("state", "last", "reason", "words"), [
    ({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed "
                  "container=tensorboard pod=tensorboard-x_ml(u-1)"}},
     {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}, "OOMKilled",
     "raise the limit (--set memory=...)"),
    ({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s restarting failed "
                  "container=tensorboard pod=tensorboard-x_ml(u-1)"}},
     {"terminated": {"exitCode": 2, "reason": "Error"}}, "CrashLoopBackOff",
     "kubectl -n ml logs tensorboard-x -c tensorboard --previous"),
    ({"waiting": {"reason": "CreateContainerError", "message": "failed to create "
                  "containerd task: no such file or directory"}}, None, "CreateContainerError",
     "the runtime could not create the container"),
    ({"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "x:1"'}},
     None, "ImagePullBackOff", "registry_mirrors"),
])
def test_pods_that_will_not_start_are_named_with_the_kubelets_reason_and_a_fix(
        state: dict[str, Any], last: dict[str, Any] | None, reason: str, words: str) -> None:
    pod = _creating_pod()
    status = {"name": "tensorboard", "state": state, **({"lastState": last} if last else {})}
    pod["status"] = {"phase": "Running" if reason != "ImagePullBackOff" else "Pending",
                     "containerStatuses": [status]}
    since: dict[str, float] = {}
    first = w.snapshot(_remote_with_events([pod], []), "ml", "x=y", since, pending_grace=20)
    assert not first.problems
    later = w.snapshot(_remote_with_events([pod], []), "ml", "x=y",
                       {k: v - 21 for k, v in since.items()}, pending_grace=20)
    (problem,) = later.problems
    assert problem.startswith(f"pod tensorboard-x on node gpu-01: {reason}: ")
    assert words in problem
    if last:
        assert f"exit code {last['terminated']['exitCode']}" in problem


def test_deploy_wait_shows_progress_once_per_change_and_stops_early_on_a_failed_mount(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The deploy wait prints a line when a pod's status or latest event changes (image pull,
    FailedMount), not on every look, and gives up on a FailedMount past its grace time
    instead of waiting the whole timeout in silence."""
    clock = [1000.0]
    monkeypatch.setattr(w.cluster.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(w.cluster.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    deploy = {"kind": "Deployment", "metadata": {"name": "tensorboard"},
              "spec": {"replicas": 1}, "status": {}}
    pulling = _event("Pulling", 'Pulling image "tensorflow/tensorflow:2.20.0"', "Normal",
                     at="2026-01-01T00:00:02Z")
    looks = [[pulling]] * 3 + [[pulling, _event("FailedMount", MOUNT_ERR)]] * 100

    class FakeRemote:
        host = "cp-01"
        calls = 0

        def probe(self, commands: dict[str, str]) -> dict[str, tuple[int, str]]:
            events = looks[min(self.calls, len(looks) - 1)]
            self.calls += 1
            return {"objects": (0, json.dumps({"items": [deploy, _creating_pod()]})),
                    "events": (0, json.dumps({"items": events}))}

    lines: list[str] = []
    result = w.wait(FakeRemote(), "ml", "x=y", timeout=600,  # type: ignore[arg-type]
                    pending_grace=20, progress=lines.append)
    assert lines == [
        'tensorboard-x on gpu-01: ContainerCreating (Pulling: Pulling image '
        '"tensorflow/tensorflow:2.20.0")',
        'tensorboard-x on gpu-01: ContainerCreating (FailedMount: MountVolume.SetUp failed '
        'for volume "ml-broken" : mount failed: exit status 32)']
    assert not result.ready and "FailedMount" in result.problems[0]
    assert clock[0] - 1000.0 < 90   # well before the 600 s timeout


def test_progress_lines_fit_the_terminal_and_stay_plain_text() -> None:
    out = io.StringIO()
    rep = Reporter(out)
    rep.console.width = 80
    show = w.cluster.progress_printer(rep)
    assert show is not None
    show(f"tensorboard-x on gpu-01: ContainerCreating (FailedMount: [bold]{'x' * 200}\x1b[2J)")
    (line,) = out.getvalue().splitlines()
    assert len(line) <= 80 and line.startswith("  tensorboard-x on gpu-01: ")
    assert "[bold]" in line and "\x1b" not in line
    assert w.cluster.progress_printer(Reporter(io.StringIO(), quiet=True)) is None


def test_a_redeploy_that_changes_the_pod_template_waits_for_the_new_pods() -> None:
    """A Deployment whose template the apply just changed still shows the old pod available:
    ready only once the controller has observed the new generation and every replica is
    updated, with no old one left (as kubectl rollout status), not at once on the old pod
    (the lab saw a redeploy with a broken claim called ready in 1.3 s)."""
    def deployment(generation: int, **status: int) -> dict[str, Any]:
        return {"kind": "Deployment", "metadata": {"name": "tensorboard",
                                                   "generation": generation},
                "spec": {"replicas": 1}, "status": status}
    old_pod = {"kind": "Pod", "metadata": {"name": "tensorboard-a"},
               "spec": {"nodeName": "cpu-01"},
               "status": {"phase": "Running", "containerStatuses": [
                   {"name": "tensorboard", "state": {"running": {}}}]}}
    unseen = w.snapshot(_fake_remote([deployment(2, observedGeneration=1, replicas=1,
                                                 updatedReplicas=1, availableReplicas=1),
                                      old_pod]), "ml", "x=y", {}, pending_grace=20)
    assert not unseen.ready
    assert unseen.objects == {"Deployment/tensorboard": "1/1 available, 0/1 updated"}
    rolling = w.snapshot(_fake_remote([deployment(2, observedGeneration=2, replicas=2,
                                                  updatedReplicas=1, availableReplicas=1),
                                       old_pod]), "ml", "x=y", {}, pending_grace=20)
    assert not rolling.ready
    done = w.snapshot(_fake_remote([deployment(2, observedGeneration=2, replicas=1,
                                               updatedReplicas=1, availableReplicas=1),
                                    old_pod]), "ml", "x=y", {}, pending_grace=20)
    assert done.ready and done.objects == {"Deployment/tensorboard": "1/1 available"}


def test_snapshot_shows_how_a_job_pod_ended() -> None:
    def pod(name: str, state: dict[str, Any]) -> dict[str, Any]:
        return {"kind": "Pod", "metadata": {"name": name, "ownerReferences": [{"kind": "Job"}]},
                "spec": {"nodeName": "gpu-01"},
                "status": {"phase": "Failed", "containerStatuses": [
                    {"name": "train", "state": {"terminated": state}}]}}
    job = {"kind": "Job", "metadata": {"name": "j"}, "spec": {}, "status": {"conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
         "message": "Job has reached the specified backoff limit"}]}}
    got = w.snapshot(_fake_remote([job, pod("j-1", {"exitCode": 3, "reason": "Error"}),
                                   pod("j-2", {"exitCode": 137, "reason": "OOMKilled"})]),
                     "ml", "x=y", {}, pending_grace=30)
    assert [p.detail for p in got.pods] == ["container train: Error, exit code 3",
                                            "container train: OOMKilled, exit code 137"]
    assert got.problems == ["Job j failed: BackoffLimitExceeded: Job has reached the "
                            "specified backoff limit"]


def test_manifest_goes_in_a_heredoc_not_argv() -> None:
    sent: list[str] = []

    class T:
        def run(self, script: str, timeout: float | None = None) -> Any:
            sent.append(script)
            return sectioned(script, "deployment.apps/jupyter serverside-applied")

    class S:
        first_cp = "cp-01"
        transports = {"cp-01": T()}
        runner = staticmethod(runner_for(transports))

        class runlog:
            @staticmethod
            def host_logger(host: str) -> Any:
                return lambda text: None

        @staticmethod
        def redact(text: str) -> str:
            return text

    w.Remote(S()).apply(rendered("jupyter-default"))  # type: ignore[arg-type]
    (sent_script,) = sent
    (body,) = op_bodies(sent_script)
    script = body.removeprefix("set +e\n")
    first, _, rest = script.partition("\n")
    assert first.startswith("kubectl --kubeconfig /etc/kubernetes/admin.conf")
    assert "apply --server-side --force-conflicts --field-manager=gpuk8s -f - <<'GPUK8S_EOF_" \
        in first
    assert "kind: Deployment" in rest and "kind:" not in first
    docs = list(yaml.safe_load_all(rest.rsplit("GPUK8S_EOF_", 1)[0]))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Deployment", "Service"]


def test_set_keeps_a_number_typed_for_a_string_value_as_written() -> None:
    # the rule inventories use for --set too: "1.30" stays "1.30" where a string is wanted
    values = w.load_values("tensorflow-job", sets=["run=1.30", "epochs=2", "gpus=1"])
    assert values["run"] == "1.30" and values["epochs"] == 2 and values["gpus"] == 1
