"""The node's part of the lab's Dynamic Resource Allocation (tests/lab/standins/k8s/dra_node.py)
without a booted lab: the ResourceSlice NVIDIA's kubelet plugin (v0.4.0) publishes, built from the
REAL nvidia-smi stand-in on a fake node root (whole GPUs, MIG devices) and from a real H200's
`nvidia-smi -q`; publishing, updating and the kubelet's wiping; the kubelet's claim preparation
and its messages. The API side is tests/unit/test_lab_dra.py."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.lab.standins.k8s import dra, dra_node, gpuview
from tests.unit.test_lab_dra import gpu_pod, gpu_slice

Obj = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]
NVIDIA_SMI = REPO / "tests/lab/standins/nvidia/nvidia-smi"
H200_Q = REPO / "tests/fixtures/nvidia/h200-ubuntu2404/nvidia-smi-q.txt"


# ------------------------------------------------------------------ the node: slices, prepare
def smi_root(tmp_path: Path, devices: tuple[str, ...] = ("0x2330", "0x2330")) -> dict[str, str]:
    root = tmp_path / "root"
    (root / "run/nvidia-lab").mkdir(parents=True)
    (root / "run/nvidia-lab/loaded-module-version").write_text("580.159.04\n")
    (root / "etc").mkdir()
    (root / "etc/machine-id").write_text("0123456789abcdef0123456789abcdef\n")
    for i, dev in enumerate(devices):
        d = root / f"sys/bus/pci/devices/0000:00:0{6 + i}.0"
        d.mkdir(parents=True)
        (d / "vendor").write_text("0x10de\n")
        (d / "device").write_text(f"{dev}\n")
        (d / "class").write_text("0x030200\n")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(f"#!/bin/sh\nexec {sys.executable} {NVIDIA_SMI} \"$@\"\n")
    (fake / "nvidia-smi").chmod(0o755)
    return {"GPUK8S_LAB_ROOT": str(root), "PATH": f"{fake}:{os.environ['PATH']}"}


class TestSlices:
    def test_helpers(self) -> None:
        assert dra_node.semver("580.159.04") == "580.159.4"
        assert dra_node.semver("13.0") == "13.0.0" and dra_node.semver("9.0") == "9.0.0"
        assert dra_node.binary_quantity(81559 * 1024 * 1024) == "81559Mi"
        assert dra_node.binary_quantity(16 * 1024 ** 3) == "16Gi"
        assert dra_node.binary_quantity(1536) == "1536"
        assert dra_node.pci_bus_id("00000000:00:06.0") == "0000:00:06.0"

    def test_real_h200_nvidia_smi_q(self) -> None:
        cuda, extra = gpuview.parse_q(H200_Q.read_text())
        assert cuda == "13.0"
        assert extra == {"GPU-cce09752-ab60-6d25-5d87-ee417aaddb56": {
            "brand": "NVIDIA", "architecture": "Hopper", "minor": 0}}
        query = ("0, GPU-cce09752-ab60-6d25-5d87-ee417aaddb56, NVIDIA H200, 143771, "
                 "00000000:00:06.0, 9.0, 580.159.04, Disabled\n")
        cuda, gpus = gpuview.detail(query, H200_Q.read_text(), "")
        (dev,) = dra_node.build_devices(gpus, cuda)
        assert dev == {"name": "gpu-0", "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": "GPU-cce09752-ab60-6d25-5d87-ee417aaddb56"},
            "productName": {"string": "NVIDIA H200"}, "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "580.159.4"},
            "cudaDriverVersion": {"version": "13.0.0"},
            "resource.kubernetes.io/pciBusID": {"string": "0000:00:06.0"}},
            "capacity": {"memory": {"value": "143771Mi"}}}

    def test_whole_gpus_and_mig_devices_from_the_nvidia_smi_standin(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        for k, v in smi_root(tmp_path).items():
            monkeypatch.setenv(k, v)
        devs, why = dra_node.node_devices()
        assert why == "" and devs is not None
        assert [d["name"] for d in devs] == ["gpu-0", "gpu-1"]
        assert devs[0]["capacity"] == {"memory": {"value": "81559Mi"}}
        body = dra_node.slice_body("gpu-01", "node-uid", devs)
        assert body["metadata"]["generateName"] == "00000-gpu.nvidia.com-gpu-01-"
        assert body["spec"]["pool"] == {"name": "gpu-01", "generation": 1,
                                        "resourceSliceCount": 1}
        env = {**os.environ}
        for args in (["-i", "0", "-mig", "1"], ["mig", "-i", "0", "-cgi", "19,9", "-C"]):
            subprocess.run(["nvidia-smi", *args], env=env, check=True, capture_output=True)
        devs, _ = dra_node.node_devices()
        assert devs is not None
        names = [d["name"] for d in devs]
        # gpu-<minor>-mig-<profile>-<GI profile ID>-<placement start> (the stand-in's driver
        # puts the 1g instance at 6, the 3g one at 0)
        assert names == ["gpu-0-mig-1g10gb-19-6", "gpu-0-mig-3g40gb-9-0", "gpu-1"]
        mig = devs[0]
        listing = subprocess.run(["nvidia-smi", "-L"], env=env, capture_output=True,
                                 text=True).stdout
        assert mig["attributes"]["uuid"]["string"] in listing
        assert mig["attributes"]["type"] == {"string": "mig"}
        assert mig["attributes"]["profile"] == {"string": "1g.10gb"}
        gpu0 = listing.splitlines()[0].split("UUID: ")[1].rstrip(")")
        assert mig["attributes"]["parentUUID"] == {"string": gpu0}
        assert mig["capacity"]["multiprocessors"] == {"value": "16"}
        assert mig["capacity"]["memorySlice6"] == {"value": "1"}
        assert [k for k in devs[1]["capacity"] if k.startswith("memorySlice")] == \
            [f"memorySlice{i}" for i in range(4)]

    def test_no_driver_no_devices(self, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
        for k, v in smi_root(tmp_path).items():
            monkeypatch.setenv(k, v)
        (Path(os.environ["GPUK8S_LAB_ROOT"]) / "run/nvidia-lab/loaded-module-version").unlink()
        devs, why = dra_node.node_devices()
        assert devs is None and why.startswith("NVIDIA-SMI has failed")


class FakeClient:
    def __init__(self, claims: dict[str, Obj]) -> None:
        self.claims = claims

    def get(self, path: str) -> Obj:
        from tests.lab.standins.k8s.client import ApiError

        name = path.rsplit("/", 1)[-1]
        if name not in self.claims:
            raise ApiError(404, {"message": f'resourceclaims.resource.k8s.io "{name}" not '
                                            "found", "reason": "NotFound"})
        return self.claims[name]


class FakeKubelet:
    node_name = "gpu-01"

    def __init__(self, claims: dict[str, Obj]) -> None:
        self.client = FakeClient(claims)
        self.gpu_assign: dict[str, list[str]] = {}


class TestPrepare:
    def setup(self, reserved: bool = True, registered: bool = True
              ) -> tuple[FakeKubelet, Obj]:
        pod = gpu_pod("one", "w-gpus-1")
        pod["status"]["resourceClaimStatuses"] = [{"name": "gpus-cuda",
                                                   "resourceClaimName": "one-gpus-cuda-abcde"}]
        claim = {"metadata": {"name": "one-gpus-cuda-abcde", "uid": "claim-uid",
                              "ownerReferences": [{"kind": "Pod", "uid": "uid-one",
                                                   "controller": True}]},
                 "status": {"allocation": {"devices": {"results": [
                     {"request": "gpus", "driver": "gpu.nvidia.com", "pool": "gpu-01",
                      "device": "gpu-1"}]}, "nodeSelector": dra.node_selector("gpu-01")}}}
        if reserved:
            claim["status"]["reservedFor"] = [dra.consumer(pod)]
        kubelet = FakeKubelet({claim["metadata"]["name"]: claim})
        state = dra_node.plugin(kubelet)
        state.registered = registered
        state.devices = gpu_slice("gpu-01", 2)["spec"]["devices"]
        return kubelet, pod

    def test_the_allocated_gpu_goes_to_the_pod(self) -> None:
        kubelet, pod = self.setup()
        assert dra_node.prepare(kubelet, pod) is None
        assert kubelet.gpu_assign == {"uid-one": ["GPU-gpu-01-1"]}
        v3 = {"version": 3, "plugins": {"io.containerd.cri.v1.runtime": {}}}
        spec: Obj = {"gpus": ["GPU-gpu-01-1"], "gpuRuntime": False}
        dra_node.cdi(kubelet, pod, spec, v3)
        assert spec == {"gpus": ["GPU-gpu-01-1"], "gpuRuntime": True, "cdi": True}
        # CDI turned off in containerd: the CRI ignores the claim's CDI devices
        off = {"plugins": {"io.containerd.cri.v1.runtime": {"enable_cdi": False}}}
        spec = {"gpus": ["GPU-gpu-01-1"], "gpuRuntime": False}
        dra_node.cdi(kubelet, pod, spec, off)
        assert spec == {"gpus": [], "gpuRuntime": False}
        assert not dra_node.cdi_enabled({"version": 2, "plugins": {
            "io.containerd.grpc.v1.cri": {}}})

    def test_kubelet_messages(self) -> None:
        kubelet, pod = self.setup(reserved=False)
        assert dra_node.prepare(kubelet, pod) == (
            "prepare dynamic resources: pod one (uid-one) is not allowed to use ResourceClaim "
            "one-gpus-cuda-abcde (claim-uid)")
        kubelet, pod = self.setup(registered=False)
        assert dra_node.prepare(kubelet, pod) == (
            "prepare dynamic resources: DRA driver gpu.nvidia.com is not registered")
        kubelet, pod = self.setup()
        pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"] = "gone"
        assert dra_node.prepare(kubelet, pod) == (
            'prepare dynamic resources: fetch ResourceClaim gone: '
            'resourceclaims.resource.k8s.io "gone" not found')
        del pod["status"]["resourceClaimStatuses"]
        assert dra_node.prepare(kubelet, pod) == (
            'prepare dynamic resources: pod "default/one": ResourceClaim not created yet')
        assert kubelet.gpu_assign == {}


class RecordingClient:
    """The API as the kubelet's DRA part uses it: slices kept in memory, the writes recorded
    with who made them ("kubelet", or the plugin's ServiceAccount token)."""

    def __init__(self, slices: dict[str, Obj] | None = None,
                 calls: list[tuple[str, str]] | None = None, who: str = "kubelet") -> None:
        self.slices: dict[str, Obj] = {} if slices is None else slices
        self.calls: list[tuple[str, str]] = [] if calls is None else calls
        self.who = who
        self.creds = type("Creds", (), {"token": who})()

    def get(self, path: str) -> Obj:
        return dict(self.request("GET", path))

    def request(self, method: str, path: str, body: Obj | None = None) -> Obj:
        if method == "GET":
            if path.startswith("/api/v1/nodes/"):
                return {"metadata": {"name": "gpu-01", "uid": "node-uid"}}
            assert "spec.nodeName%3Dgpu-01" in path, path
            return {"items": [copy.deepcopy(s) for s in self.slices.values()]}
        self.calls.append((method, path) if self.who == "kubelet" else
                          (method, path, self.who))  # type: ignore[arg-type]
        if method == "POST":
            assert body is not None
            body["metadata"]["name"] = body["metadata"]["generateName"] + "x7k2p"
            self.slices[body["metadata"]["name"]] = body
        elif method == "PUT":
            assert body is not None
            self.slices[body["metadata"]["name"]] = body
        elif method == "DELETE":
            self.slices.pop(path.rsplit("/", 1)[-1])
        return body or {}


class PluginKubelet:
    node_name = "gpu-01"

    def __init__(self) -> None:
        self.client = RecordingClient()
        self.programs: dict[tuple[str, str], list[Any]] = {}
        self.tokens: list[str] = []

    def pod_api(self, pod: Obj) -> Any:
        """kubelet.pod_api: a token bound to the pod (here: "sa:<pod uid>")."""
        from tests.lab.standins.k8s import programs

        self.tokens.append(pod["metadata"]["uid"])
        return programs.Api(RecordingClient(self.client.slices, self.client.calls,  # type: ignore[arg-type]
                                            f"sa:{pod['metadata']['uid']}"))

    def log_path(self, pod: Obj, container: str) -> str:
        """A node path (GPUK8S_LAB_ROOT applies), as the kubelet's."""
        return f"/var/log/pods/{pod['metadata']['name']}-{container}.log"


def plugin_pod(phase: str = "Running", uid: str = "p") -> Obj:
    return {"metadata": {"name": "nvidia-dra-driver-gpu-kubelet-plugin-abcde", "uid": uid},
            "spec": {"containers": [{"name": "gpus", "image": "registry.k8s.io/dra-driver-"
                                     "nvidia/dra-driver-nvidia-gpu:v0.4.0"}]},
            "status": {"phase": phase}}


def test_the_plugin_publishes_updates_and_the_kubelet_wipes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in smi_root(tmp_path).items():
        monkeypatch.setenv(k, v)
    kubelet = PluginKubelet()
    logs = Path(os.environ["GPUK8S_LAB_ROOT"]) / "var/log/pods"
    logs.mkdir(parents=True)
    kubelet.client.slices["00000-gpu.nvidia.com-gpu-01-stale"] = gpu_slice("gpu-01", 1)
    kubelet.client.slices["00000-gpu.nvidia.com-gpu-01-stale"]["metadata"]["name"] = \
        "00000-gpu.nvidia.com-gpu-01-stale"
    dra_node.sync(kubelet, [plugin_pod()])
    # the kubelet wiped its node's slices at start (its own credentials), then the plugin
    # published its own as its ServiceAccount, whose token lies in the pod's projected volume
    assert kubelet.client.calls == [
        ("DELETE", "/apis/resource.k8s.io/v1/resourceslices/00000-gpu.nvidia.com-gpu-01-stale"),
        ("POST", "/apis/resource.k8s.io/v1/resourceslices", "sa:p")]
    root = Path(os.environ["GPUK8S_LAB_ROOT"])
    token = root / dra_node.token_dir("p").lstrip("/") / "token"
    assert token.read_text() == "sa:p"
    assert dra_node.token_dir("p").startswith(
        "/var/lib/kubelet/pods/p/volumes/kubernetes.io~projected/kube-api-access-")
    (body,) = kubelet.client.slices.values()
    assert body["metadata"]["name"] == "00000-gpu.nvidia.com-gpu-01-x7k2p"
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "gpu-01", "uid": "node-uid",
         "controller": True}]
    assert [d["name"] for d in body["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    assert dra_node.plugin(kubelet).registered
    dra_node.sync(kubelet, [plugin_pod()])
    assert len(kubelet.client.calls) == 2  # nothing changed: nothing written
    log = (logs / "nvidia-dra-driver-gpu-kubelet-plugin-abcde-gpus.log").read_text()
    assert log == ("LAB STAND-IN gpu-kubelet-plugin: registered with the kubelet; publishing 2 "
                   "device(s): gpu-0, gpu-1\n")
    # MIG on GPU 0 while the plugin runs: as the real one, it enumerated its devices when it
    # started; its next pod (a restart) publishes the MIG device, updating the slice in place
    env = {**os.environ}
    for args in (["-i", "0", "-mig", "1"], ["mig", "-i", "0", "-cgi", "9", "-C"]):
        subprocess.run(["nvidia-smi", *args], env=env, check=True, capture_output=True)
    dra_node.sync(kubelet, [plugin_pod()])
    assert len(kubelet.client.calls) == 2
    dra_node.sync(kubelet, [plugin_pod(uid="p2")])
    assert kubelet.client.calls[-1] == (
        "PUT", "/apis/resource.k8s.io/v1/resourceslices/00000-gpu.nvidia.com-gpu-01-x7k2p",
        "sa:p2")
    assert kubelet.tokens == ["p", "p2"]  # one token per pod, not one per sync
    assert not (root / "var/lib/kubelet/pods/p").exists()  # the old pod's volume is gone
    assert [d["name"] for d in kubelet.client.slices[body["metadata"]["name"]]["spec"][
        "devices"]] == ["gpu-0-mig-3g40gb-9-4", "gpu-1"]  # the stand-in driver put it at 4
    # the plugin pod is gone: unregistered at once, the slice wiped 30 s later
    now = [1000.0]
    monkeypatch.setattr(dra_node.time, "monotonic", lambda: now[0])
    dra_node.sync(kubelet, [])
    assert not dra_node.plugin(kubelet).registered and kubelet.client.slices
    now[0] += 29
    dra_node.sync(kubelet, [])
    assert kubelet.client.slices
    now[0] += 2
    dra_node.sync(kubelet, [])
    assert kubelet.client.slices == {} and kubelet.client.calls[-1][0] == "DELETE"
    assert len(kubelet.client.calls[-1]) == 2  # the kubelet's wipe, not the plugin's
    assert not (root / "var/lib/kubelet/pods/p2").exists()


def test_a_refused_slice_write_is_logged_and_tried_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin's ResourceSlice controller logs a refused write (resourceslicecontroller.go
    processNextWorkItem -> the driver's HandleError) and retries the pool: the slice comes
    once the API server accepts it."""
    from tests.lab.standins.k8s import programs
    from tests.lab.standins.k8s.client import ApiError

    for k, v in smi_root(tmp_path).items():
        monkeypatch.setenv(k, v)
    kubelet = PluginKubelet()
    logs = Path(os.environ["GPUK8S_LAB_ROOT"]) / "var/log/pods"
    logs.mkdir(parents=True)
    refuse = ["resourceslices.resource.k8s.io \"00000-gpu.nvidia.com-gpu-01-\" is forbidden: "
              "ValidatingAdmissionPolicy 'p' with binding 'p' denied request: no"]

    class Refusing(RecordingClient):
        def request(self, method: str, path: str, body: Obj | None = None) -> Obj:
            if method == "POST" and refuse:
                raise ApiError(422, {"message": refuse[0], "reason": "Invalid"})
            return super().request(method, path, body)

    kubelet.pod_api = lambda pod: programs.Api(Refusing(  # type: ignore[method-assign]
        kubelet.client.slices, kubelet.client.calls, "sa:p"))
    dra_node.sync(kubelet, [plugin_pod()])
    assert kubelet.client.slices == {}
    log = (logs / "nvidia-dra-driver-gpu-kubelet-plugin-abcde-gpus.log").read_text()
    assert log.splitlines()[-1] == ("LAB STAND-IN gpu-kubelet-plugin: processing ResourceSlice "
                                    f"objects: create resource slice: {refuse[0]}")
    refuse.clear()
    dra_node.sync(kubelet, [plugin_pod()])
    assert [s["spec"]["nodeName"] for s in kubelet.client.slices.values()] == ["gpu-01"]


def test_a_plugin_whose_container_exits_publishes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu-kubelet-plugin without IMAGE_NAME exits at start (programs.dra_gpu_plugin): it never
    registers, so no ResourceSlice is published."""
    from tests.lab.standins.k8s import programs

    for k, v in smi_root(tmp_path).items():
        monkeypatch.setenv(k, v)
    kubelet = PluginKubelet()
    (Path(os.environ["GPUK8S_LAB_ROOT"]) / "var/log/pods").mkdir(parents=True)
    pod = plugin_pod()
    container = {**pod["spec"]["containers"][0], "command": ["gpu-kubelet-plugin"],
                 "env": [{"name": "NODE_NAME", "value": "gpu-01"}]}
    outcome = programs.dra_gpu_plugin(programs.Api(kubelet.client), pod, container, "gpu-01")
    assert outcome.state == "crash" and outcome.exit_code == 1
    assert outcome.log[-1] == 'Error: Required flag "image-name" not set'
    kubelet.programs[("p", "gpus")] = [outcome, 1, 0.0]
    dra_node.sync(kubelet, [pod])
    assert kubelet.client.slices == {} and not dra_node.plugin(kubelet).registered
    fixed = {**container, "env": [*container["env"], {"name": "IMAGE_NAME", "value": "x:v0.4.0"}]}
    assert programs.dra_gpu_plugin(programs.Api(kubelet.client), pod, fixed,
                                   "gpu-01").state == "ok"
