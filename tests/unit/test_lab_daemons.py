"""The lab kubelet's registry of emulated daemons (tests/lab/standins/k8s/daemons.py), without a
booted lab: each daemon recognises its pods in gpuk8s's own manifests and kubeadm's addons (and
nothing else), each container gets its program and start log, a pod's start does to a fake node
what the daemon's init containers do, the per-sync hooks run in the kubelet's order, and a
program that calls the API exits without its pod's token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s.roles import render
from tests.lab.standins.k8s import daemons, dcgm, device_plugin, dra_node, programs
from tests.lab.standins.k8s.client import ApiError
from tests.unit.scenarios import default_vars

Obj = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]
MANIFESTS = [("cni", "cni/flannel.yaml.j2", {}), ("cni", "cni/calico.yaml.j2", {}),
             ("gpu_cluster", "gpu/nvidia-device-plugin.yaml.j2", {}),
             ("gpu_cluster", "gpu/nvidia-dra-driver.yaml.j2",
              {"nvidia_dra_driver_version": "0.4.0"}),
             ("monitoring", "monitoring/gpu-monitoring.yaml.j2",
              {"prometheus_config_sha256": "0" * 64})]


def pods() -> dict[str, Obj]:
    """name -> pod, of the workloads in gpuk8s's manifests and kubeadm's two addons."""
    out = {}
    for role, name, extra in MANIFESTS:
        for doc in yaml.safe_load_all(render(role, name, default_vars(**extra))):
            if doc and doc["kind"] in ("DaemonSet", "Deployment"):
                out[doc["metadata"]["name"]] = {
                    "metadata": {"name": doc["metadata"]["name"], "namespace": "ns", "uid": "u"},
                    "spec": doc["spec"]["template"]["spec"]}
    for name, image in (("coredns", "registry.k8s.io/coredns/coredns:v1.12.4"),
                        ("kube-proxy", "registry.k8s.io/kube-proxy:v1.36.2")):
        out[name] = {"metadata": {"name": name, "namespace": "kube-system", "uid": "u"},
                     "spec": {"containers": [{"name": name, "image": image}]}}
    return out


def daemon_of(pod: Obj) -> list[str]:
    return [d.name for d in daemons.DAEMONS if d.matches(pod)]


def test_each_daemon_recognises_its_pods_and_nothing_else() -> None:
    got = {name: daemon_of(p) for name, p in pods().items()}
    assert got == {
        "kube-flannel-ds": ["flannel"], "calico-node": ["calico"],
        "calico-kube-controllers": ["calico"],
        "nvidia-device-plugin-daemonset": ["NVIDIA device plugin"],
        "nvidia-dra-driver-gpu-kubelet-plugin": ["NVIDIA DRA kubelet plugin"],
        "dcgm-exporter": ["dcgm-exporter"], "prometheus": [],
        "coredns": ["CoreDNS"], "kube-proxy": ["kube-proxy"]}
    assert {n for n, p in pods().items() if daemons.emulated(p)} == set(got) - {"prometheus"}
    workload = {"spec": {"containers": [{"name": "smi",
                                         "image": "nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04"}]}}
    assert not daemons.emulated(workload)
    # an init container's image is enough (calico's install-cni)
    assert daemons.emulated({"spec": {"initContainers": [{"image": "docker.io/calico/cni:v3"}],
                                      "containers": [{"image": "busybox"}]}})


def program_name(entry: daemons.Container | None) -> str | None:
    if entry is None or entry.program is None:
        return None
    fn = getattr(entry.program, "__wrapped__", entry.program)   # as_pod's wrapping
    return f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"


def test_each_container_gets_its_program_and_start_log() -> None:
    got = {}
    for p in pods().values():
        for c in p["spec"].get("containers") or []:
            e = daemons.container(c)
            got[c["name"]] = (program_name(e), e is not None and
                              e.log is device_plugin.start_log)
    assert got == {
        "kube-flannel": ("programs.flanneld", False),
        "calico-node": ("programs.calico_node", False),
        "calico-kube-controllers": ("programs.calico_kube_controllers", False),
        # the sidecar (config-manager) logs as the plugin's image does; only the plugin runs
        "nvidia-device-plugin-sidecar": (None, True),
        "nvidia-device-plugin-ctr": ("device_plugin.program", True),
        "gpus": ("programs.dra_gpu_plugin", False),
        "dcgm-exporter": (None, False), "prometheus": (None, False),
        "coredns": (None, False), "kube-proxy": (None, False)}
    # the DRA image runs the kubelet plugin only as the gpu-kubelet-plugin command
    other = {"name": "cd", "image": "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:"
                                    "v0.4.0", "command": ["compute-domain-kubelet-plugin"]}
    assert daemons.container(other) is None
    assert daemons.container({"name": "x"}) is None


class FakeClient:
    def __init__(self, data: dict[str, Obj]) -> None:
        self.data = data
        self.calls: list[str] = []

    def get(self, path: str) -> Obj:
        self.calls.append(path)
        if path not in self.data:
            raise ApiError(404, {"message": "not found", "reason": "NotFound"})
        return self.data[path]


class FakeKubelet:
    node_name = "gpu-01"

    def __init__(self, data: dict[str, Obj] | None = None) -> None:
        self.client = FakeClient(data or {})
        self.programs: dict[tuple[str, str], list[Any]] = {}
        self.cfg: Obj = {}
        self.proxy_started = self.dns_started = False
        self.token = True

    def pod_api(self, pod: Obj) -> programs.Api | None:
        return programs.Api(self.client) if self.token else None  # type: ignore[arg-type]


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUK8S_LAB_ROOT", str(tmp_path))
    return tmp_path


def test_a_pods_start_does_what_its_init_containers_do(root: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    all_pods = pods()
    cms = "/api/v1/namespaces/ns/configmaps"
    calico = yaml.safe_load_all(render("cni", "cni/calico.yaml.j2", default_vars()))
    calico_cm = next(d for d in calico if d and d["kind"] == "ConfigMap")
    k = FakeKubelet({f"{cms}/kube-flannel-cfg": {"data": {"cni-conf.json": '{"name": "cbr0"}'}},
                     f"{cms}/{calico_cm['metadata']['name']}": calico_cm})
    adopted: list[str] = []
    monkeypatch.setattr(dcgm.Exporter, "adopt", lambda self, pod: adopted.append(
        pod["metadata"]["name"]))
    for name in ("kube-flannel-ds", "calico-node", "calico-kube-controllers", "dcgm-exporter",
                 "nvidia-device-plugin-daemonset", "coredns"):
        daemons.start(k, all_pods[name])   # type: ignore[arg-type]
    assert (root / "opt/cni/bin/flannel").read_text() == \
        (REPO / "tests/lab/standins/k8s/flannel_cni.py").read_text()
    assert (root / "etc/cni/net.d/10-flannel.conflist").read_text() == '{"name": "cbr0"}'
    assert '"nodename": "gpu-01"' in (root / "etc/cni/net.d/10-calico.conflist").read_text()
    assert sorted(p.name for p in (root / "etc/cni/net.d").iterdir()) == [
        "10-calico.conflist", "10-flannel.conflist"]
    assert adopted == ["dcgm-exporter"]
    # flannel's and calico-node's ConfigMaps (CNI_NETWORK_CONFIG, CNI_MTU) only:
    # kube-controllers' start reads nothing
    assert k.client.calls == [f"{cms}/kube-flannel-cfg",
                              *[f"{cms}/{calico_cm['metadata']['name']}"] * 2]


def test_sync_hooks_run_in_the_kubelets_order(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [d.name for d in daemons.DAEMONS if d.sync is not None] == [
        "flannel", "kube-proxy", "CoreDNS", "NVIDIA DRA kubelet plugin"]
    assert next(d for d in daemons.DAEMONS if d.sync is dra_node.sync)
    assert [d.name for d in daemons.DAEMONS if d.start is not None] == [
        "flannel", "calico", "dcgm-exporter"]
    assert [d.name for d in daemons.DAEMONS if d.resources is not None] == [
        "NVIDIA device plugin"]
    ran: list[str] = []

    def hook(name: str) -> Any:
        return lambda k, pods: ran.append(name)

    fake = tuple(daemons.Daemon(d.name, d.image, sync=hook(d.name)) if d.sync else d
                 for d in daemons.DAEMONS)
    monkeypatch.setattr(daemons, "DAEMONS", fake)
    daemons.sync(FakeKubelet(), [])   # type: ignore[arg-type]
    assert ran == ["flannel", "kube-proxy", "CoreDNS", "NVIDIA DRA kubelet plugin"]


def test_flanneld_leases_once_its_program_passed(root: Path) -> None:
    flannel = pods()["kube-flannel-ds"]
    flannel["status"] = {"phase": "Running"}
    nodes = {"items": [{"metadata": {"name": "gpu-01"}, "spec": {"podCIDR": "10.244.3.0/24"}}]}
    cm = {"data": {"net-conf.json": '{"Network": "10.244.0.0/16"}'}}
    lease = root / "run/flannel/subnet.env"
    for state, leased in (("crash", False), ("ok", True)):
        k = FakeKubelet({"/api/v1/nodes": nodes,
                         "/api/v1/namespaces/ns/configmaps/kube-flannel-cfg": cm})
        k.programs[("u", "kube-flannel")] = [programs.Outcome(state), 0, 0.0]
        daemons.flanneld(k, [flannel])   # type: ignore[arg-type]
        assert lease.exists() == leased
    assert lease.read_text() == ("FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.3.1/24\n"
                                 "FLANNEL_MTU=1500\nFLANNEL_IPMASQ=true\n")
    # on the host (GPUK8S_LAB_ROOT): no kube-proxy loop, no DNS on port 53
    k = FakeKubelet()
    proxy_pod = {**pods()["kube-proxy"], "status": {"phase": "Running"}}
    daemons.kube_proxy(k, [proxy_pod])   # type: ignore[arg-type]
    daemons.cluster_dns(k, [])   # type: ignore[arg-type]
    assert not k.proxy_started and not k.dns_started and k.client.calls == []


def test_an_api_program_exits_without_its_pods_token() -> None:
    entry = daemons.container(pods()["kube-flannel-ds"]["spec"]["containers"][0])
    assert entry is not None and entry.program is not None
    k = FakeKubelet()
    k.token = False
    out = entry.program(k, pods()["kube-flannel-ds"], {})   # type: ignore[arg-type]
    assert (out.state, out.log, out.exit_code) == (
        "crash", ["unable to load in-cluster configuration: no ServiceAccount token"], 1)


def test_the_readme_lists_every_daemon() -> None:
    readme = (REPO / "tests/lab/standins/k8s/README.md").read_text()
    for d in daemons.DAEMONS:
        assert f"`{d.image}`" in readme, d.name


def test_kube_proxy_syncs_on_its_watches_events_not_on_a_clock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """kube-proxy's loop lists services and pods once at its start, then again only when
    one of its two watches brings an event (its informers), not every second; a failed sync
    is tried again a second later."""
    import queue
    import threading
    import time

    events: dict[str, queue.Queue[bytes | None]] = {"services": queue.Queue(),
                                                      "pods": queue.Queue()}
    synced: queue.Queue[int] = queue.Queue()
    failures = [OSError("iptables-restore: busy")]

    class WatchClient(FakeClient):
        def stream(self, path: str, idle: float) -> Any:
            kind = path.split("?")[0].rsplit("/", 1)[1]
            assert "watch=true" in path
            while (line := events[kind].get()) is not None:
                yield line

    def sync(services: list[Obj], pods_: list[Obj], last: str) -> str:
        if failures:
            raise failures.pop()
        synced.put(len(pods_))
        return "rules"

    monkeypatch.setattr(daemons.proxy, "sync", sync)
    k = FakeKubelet()
    k.client = WatchClient({"/api/v1/services": {"items": []},
                            "/api/v1/pods": {"items": [{}]}})
    threading.Thread(target=daemons.proxy_loop, args=(k,), daemon=True).start()
    assert synced.get(timeout=5) == 1          # the first sync failed; the retry came
    time.sleep(2.5)                            # nothing changed: no list, no sync
    assert synced.empty() and k.client.calls.count("/api/v1/pods") == 2
    k.client.data["/api/v1/pods"] = {"items": [{}, {}]}
    events["pods"].put(b'{"type": "ADDED"}\n')
    assert synced.get(timeout=5) == 2
    events["services"].put(b'{"type": "MODIFIED"}\n')
    assert synced.get(timeout=5) == 2
    for q in events.values():
        q.put(None)
