"""The lab's emulated dcgm-exporter (tests/lab/standins/k8s/dcgm.py, dcgm_metrics.py): the
exposition text it serves (dcgm-exporter 4.x's metric names, HELP/TYPE lines, label set and
order, value formats), the pod labels from the kubelet's GPU allocations, the settings it reads
from the pod, and the emulated process against the REAL nvidia-smi stand-in on a fake node
root: it serves /metrics while its pod lives, drops fields nvidia-smi refuses, and does not
listen (as the real exporter, which exits) when the driver is not loaded."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.lab.standins.k8s import dcgm
from tests.lab.standins.k8s.dcgm_metrics import (
    COUNTERS,
    PodInfo,
    Settings,
    metrics_text,
    owners,
    parse_smi,
    settings_for,
)

REPO = Path(__file__).resolve().parents[2]
NVIDIA_SMI = REPO / "tests/lab/standins/nvidia/nvidia-smi"
FIELDS = ["index", "uuid", "pci.bus_id", "name", "driver_version", "utilization.gpu",
          "utilization.memory", "memory.used", "memory.free", "temperature.gpu", "power.draw",
          "clocks.sm"]
G0, G1 = "GPU-7b61fb1c-f97c-1c30-2998-c5a0adc8b4ca", "GPU-ab4fd51f-200f-a6c2-ba24-af71c510169e"
#: what the nvidia-smi stand-in answers for two H100s (clocks.sm added as the real one has it)
CSV = (f"0, {G0}, 00000000:18:00.0, NVIDIA H100 80GB HBM3, 580.159.04, 37, 5, 1024, 79919, "
       f"39, 125.00, 1980\n"
       f"1, {G1}, 00000000:2A:00.0, NVIDIA H100 80GB HBM3, 580.159.04, 0, 0, 0, 80943, 33, "
       f"121.50, 345\n")
K8S = Settings(kubernetes=True, hostname="gpu-01", pod_resources=True)
TRAIN = PodInfo("train-0", "ml", "tf", "uid-train")
GPU0 = ('gpu="0",UUID="GPU-7b61fb1c-f97c-1c30-2998-c5a0adc8b4ca",pci_bus_id="00000000:18:00.0",'
        'device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-01",'
        'DCGM_FI_DRIVER_VERSION="580.159.04"')

# the text exposition format, strictly (prometheus_client is not installed in the venv)
NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(rf"({NAME})\{{({LABEL}(?:,{LABEL})*)?\}} (-?[0-9]+(?:\.[0-9]+)?)")
HELP = re.compile(rf"# HELP ({NAME}) [^\n]*")
TYPE = re.compile(rf"# TYPE ({NAME}) (counter|gauge|histogram|summary|untyped)")


def parse_exposition(text: str) -> dict[str, list[tuple[dict[str, str], str]]]:
    """metric -> [(labels, value)]; fails on anything the format does not allow, a sample
    before its family's HELP and TYPE, a family split in two or a repeated series."""
    assert text.endswith("\n")
    families: dict[str, list[tuple[dict[str, str], str]]] = {}
    current, seen = None, set()
    lines = text[:-1].split("\n")
    for i, line in enumerate(lines):
        if m := HELP.fullmatch(line):
            assert m.group(1) not in families, f"family {m.group(1)} split"
            assert TYPE.fullmatch(lines[i + 1]) and lines[i + 1].split()[2] == m.group(1)
            current = m.group(1)
            families[current] = []
        elif TYPE.fullmatch(line):
            assert line.split()[2] == current
        else:
            m2 = SAMPLE.fullmatch(line)
            assert m2, f"not a sample line: {line!r}"
            assert m2.group(1) == current, f"{m2.group(1)} outside its family"
            labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"',
                                     m2.group(2) or ""))
            key = (m2.group(1), tuple(sorted(labels.items())))
            assert key not in seen, f"repeated series {key}"
            seen.add(key)
            families[current].append((labels, m2.group(3)))
    return families


def test_the_exporters_names_labels_and_formats() -> None:
    text = metrics_text(CSV, FIELDS, K8S, {"uid-train": [G1]}, {"uid-train": TRAIN})
    fams = parse_exposition(text)
    # DCGM field-id order, HELP texts from default-counters.csv
    assert list(fams) == ["DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_TEMP",
                          "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL",
                          "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_FREE",
                          "DCGM_FI_DEV_FB_USED"]
    assert "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n" \
           "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n" in text
    assert f"DCGM_FI_DEV_GPU_UTIL{{{GPU0}}} 37\n" in text
    assert f"DCGM_FI_DEV_POWER_USAGE{{{GPU0}}} 125.000000\n" in text  # a double: "%f"
    assert f"DCGM_FI_DEV_SM_CLOCK{{{GPU0}}} 1980\n" in text
    assert f"DCGM_FI_DEV_FB_USED{{{GPU0}}} 1024\n" in text
    # the GPU a pod holds: container, namespace, pod after the driver label
    gpu1 = GPU0.replace('"0"', '"1"').replace("nvidia0", "nvidia1").replace(G0, G1).replace(
        "18:00.0", "2A:00.0")
    assert f'DCGM_FI_DEV_FB_FREE{{{gpu1},container="tf",namespace="ml",pod="train-0"}} ' \
           "80943\n" in text
    assert [list(labels) for labels, _ in fams["DCGM_FI_DEV_GPU_TEMP"]] == [
        ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
         "DCGM_FI_DRIVER_VERSION"],
        ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
         "DCGM_FI_DRIVER_VERSION", "container", "namespace", "pod"]]


def test_every_counter_is_a_default_counter_of_dcgm_exporter() -> None:
    assert {c.name for c in COUNTERS} >= {
        "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_SM_CLOCK"}
    assert len({c.field_id for c in COUNTERS}) == len(COUNTERS)
    assert all(c.help.endswith(".") and c.prom_type == "gauge" for c in COUNTERS)


def test_blank_values_and_unknown_fields_leave_series_out() -> None:
    csv = CSV.replace(", 1980\n", ", [N/A]\n").replace("121.50", "[Not Supported]")
    fams = parse_exposition(metrics_text(csv, FIELDS, K8S, {}, {}))
    assert [labels["gpu"] for labels, _ in fams["DCGM_FI_DEV_SM_CLOCK"]] == ["1"]
    assert [labels["gpu"] for labels, _ in fams["DCGM_FI_DEV_POWER_USAGE"]] == ["0"]
    # a field nvidia-smi does not answer: its metric is not served at all (no HELP either)
    fields = FIELDS[:-1]
    csv = "".join(line.rsplit(",", 1)[0] + "\n" for line in CSV.splitlines())
    assert "DCGM_FI_DEV_SM_CLOCK" not in metrics_text(csv, fields, K8S, {}, {})
    # no GPU: an empty answer
    assert metrics_text("", FIELDS, K8S, {}, {}) == ""


def test_pod_labels_need_kubernetes_mode_and_the_pod_resources_socket() -> None:
    assign, pods = {"uid-train": [G0]}, {"uid-train": TRAIN}
    assert 'pod="train-0"' in metrics_text(CSV, FIELDS, K8S, assign, pods)
    for s in (Settings(hostname="gpu-01", pod_resources=True),
              Settings(kubernetes=True, hostname="gpu-01")):
        assert "pod=" not in metrics_text(CSV, FIELDS, s, assign, pods)
    old = Settings(kubernetes=True, hostname="gpu-01", pod_resources=True, old_namespace=True,
                   pod_uid=True, no_hostname=True)
    text = metrics_text(CSV, FIELDS, old, assign, pods)
    assert 'uuid="GPU-' in text and "Hostname=" not in text
    assert 'container_name="tf",pod_name="train-0",pod_namespace="ml",pod_uid="uid-train"}' \
        in text


def test_time_sliced_gpus_show_the_last_pod_and_mig_devices_no_gpu() -> None:
    a, b = PodInfo("a", "ml", "c", "ua"), PodInfo("b", "ml", "c", "ub")
    got = owners({"ua": [f"{G0}::0"], "ub": [f"{G0}::1"], "gone": [G1],
                  "uc": ["MIG-1b2c3d4e-0000-0000-0000-000000000000"]},
                 {"ua": a, "ub": b, "uc": a})
    assert got[G0] == b and G1 not in got


def test_what_nvidia_smi_prints_is_untrusted() -> None:
    # a line broken by a newline, garbage, a row naming no GPU: dropped
    evil = CSV.replace("NVIDIA H100 80GB HBM3", 'H100"} 1\nfake_metric{x="', 1)
    rows = parse_smi(evil + "garbage\n1, not-a-uuid, x, y, z, 1, 1, 1, 1, 1, 1, 1\n", FIELDS)
    assert [r["uuid"] for r in rows] == [G1]
    # quotes and backslashes in a value are escaped, never break out of the label
    text = metrics_text(CSV.replace("580.159.04", '5"80\\x', 1).replace(
        "NVIDIA H100 80GB HBM3", 'H100"} 1 #', 1), FIELDS, K8S, {}, {})
    parse_exposition(text)
    assert 'modelName="H100\\"} 1 #"' in text
    assert 'DCGM_FI_DRIVER_VERSION="5\\"80\\\\x"' in text


def pod(**spec: Any) -> dict[str, Any]:
    container = {"name": "dcgm-exporter",
                 "image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless",
                 "env": [{"name": "DCGM_EXPORTER_LISTEN", "value": ":9400"},
                         {"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"},
                         {"name": "NODE_NAME",
                          "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                 "volumeMounts": [{"name": "pod-resources",
                                   "mountPath": "/var/lib/kubelet/pod-resources"}]}
    container.update(spec.pop("container", {}))
    return {"metadata": {"name": "dcgm-exporter-x", "namespace": "gpuk8s-monitoring",
                         "uid": "uid-dcgm"},
            "spec": {"hostNetwork": True, "runtimeClassName": "nvidia",
                     "containers": [container],
                     "volumes": [{"name": "pod-resources",
                                  "hostPath": {"path": "/var/lib/kubelet/pod-resources"}}],
                     **spec}}


def test_settings_come_from_the_pods_env_and_args() -> None:
    s = settings_for(pod(), "gpu-01")
    assert (s.listen, s.kubernetes, s.hostname, s.pod_resources, s.version) == \
        (":9400", True, "gpu-01", True, "4.5.3-4.8.2")
    s = settings_for(pod(container={"args": ["-a", "127.0.0.1:9500", "--kubernetes=false"]},
                         volumes=[]), "gpu-01")
    assert (s.listen, s.kubernetes, s.pod_resources) == ("127.0.0.1:9500", False, False)


# ---------------------------------------------------------------- the emulated process
@pytest.fixture
def node_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A node root with two H100s for the nvidia-smi stand-in, the driver loaded."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/machine-id").write_text("5f1c0c7e4a8b4d0f9e6b2a1c3d4e5f60\n")
    (root / "run/nvidia-lab").mkdir(parents=True)
    (root / "run/nvidia-lab/loaded-module-version").write_text("580.159.04\n")
    for bus in ("0000:18:00.0", "0000:2a:00.0"):
        d = root / "sys/bus/pci/devices" / bus
        d.mkdir(parents=True)
        for k, v in (("vendor", "0x10de"), ("device", "0x2330"), ("class", "0x030200"),
                     ("subsystem_vendor", "0x10de"), ("subsystem_device", "0x16c1"),
                     ("numa_node", "0")):
            (d / k).write_text(v + "\n")
    monkeypatch.setenv("GPUK8S_LAB_ROOT", str(root))
    monkeypatch.setenv("GPUK8S_LAB_NVIDIA_VERSION", "580.159.04")
    return root


class FakeClient:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods

    def get(self, path: str) -> dict[str, Any]:
        assert path == "/api/v1/pods?fieldSelector=spec.nodeName=gpu-01"
        return {"items": self.pods}


class FakeKubelet:
    """What the exporter reads of the kubelet stand-in."""

    def __init__(self, pods: list[dict[str, Any]], runtime: str = "nvidia") -> None:
        self.node_name, self.node_ip = "gpu-01", "127.0.0.1"
        self.started: dict[str, float] = {}
        self.gpu_assign: dict[str, list[str]] = {}
        self.client = FakeClient(pods)
        self.runtime = runtime

    def pod_runtime(self, pod: dict[str, Any], cfg: Any) -> str:
        return self.runtime

    def log_path(self, pod: dict[str, Any], container: str) -> str:
        md = pod["metadata"]
        return f"/var/log/pods/{md['namespace']}_{md['name']}_{md['uid']}/{container}/0.log"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def wait(cond: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def start(node_root: Path, kubelet: FakeKubelet, p: dict[str, Any]) -> dcgm.Exporter:
    log = node_root / kubelet.log_path(p, "dcgm-exporter").lstrip("/")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    kubelet.started[p["metadata"]["uid"]] = time.monotonic()
    ex = dcgm.Exporter(kubelet, smi=(sys.executable, str(NVIDIA_SMI)))
    ex.adopt(p)
    return ex


def test_the_exporter_serves_while_its_pod_lives(node_root: Path) -> None:
    port = free_port()
    train = {"metadata": {"name": "train-0", "namespace": "ml", "uid": "uid-train"},
             "spec": {"containers": [{"name": "tf", "resources": {
                 "limits": {"nvidia.com/gpu": 1}}}]}}
    kubelet = FakeKubelet([train])
    p = pod(container={"env": [{"name": "DCGM_EXPORTER_LISTEN", "value": f"127.0.0.1:{port}"},
                               {"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"}]})
    ex = start(node_root, kubelet, p)
    wait(lambda: ex.address is not None)
    uuids = re.findall(r"UUID: (GPU-[0-9a-f-]+)", subprocess.run(
        [sys.executable, str(NVIDIA_SMI), "-L"], capture_output=True, text=True).stdout)
    kubelet.gpu_assign["uid-train"] = [uuids[1]]
    code, ctype, text = get(f"http://127.0.0.1:{port}/metrics")
    assert (code, ctype) == (200, "text/plain; charset=utf-8")
    fams = parse_exposition(text)
    temps = fams["DCGM_FI_DEV_GPU_TEMP"]
    assert [(labels["gpu"], labels["modelName"], labels["Hostname"]) for labels, _ in temps] \
        == [("0", "NVIDIA H100 80GB HBM3", "gpu-01"), ("1", "NVIDIA H100 80GB HBM3", "gpu-01")]
    assert temps[1][0]["pod"] == "train-0" and "pod" not in temps[0][0]
    if "clocks.sm" not in ex.fields:  # the stand-in refused it: left out, not made up
        assert "DCGM_FI_DEV_SM_CLOCK" not in fams
    assert get(f"http://127.0.0.1:{port}/health")[::2] == (200, "OK")
    assert get(f"http://127.0.0.1:{port}/nope")[0] == 404
    log = (node_root / kubelet.log_path(p, "dcgm-exporter").lstrip("/")).read_text()
    assert 'msg="Starting dcgm-exporter" Version=4.5.3-4.8.2' in log
    assert 'msg="Kubernetes metrics collection enabled!"' in log
    # the pod is gone: nothing listens any more
    del kubelet.started["uid-dcgm"]
    wait(lambda: ex.thread is None)
    with pytest.raises(urllib.error.URLError):
        get(f"http://127.0.0.1:{port}/metrics")


def test_in_the_pod_network_it_listens_on_its_pod_ip_only(node_root: Path) -> None:
    """Without hostNetwork (gpuk8s's manifest, security review 2, L4) ":9400" is every
    address of the pod's own namespace: the lab binds the pod's IP, not the node's."""
    port = free_port()

    class PodNetKubelet(FakeKubelet):
        def _pod_ip(self, uid: str) -> str:
            assert uid == "uid-dcgm"
            return "127.0.0.2"

    kubelet = PodNetKubelet([])
    p = pod(hostNetwork=False, container={"env": [
        {"name": "DCGM_EXPORTER_LISTEN", "value": f":{port}"},
        {"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"}]})
    ex = start(node_root, kubelet, p)
    wait(lambda: ex.address is not None)
    assert ex.address == ("127.0.0.2", port)
    assert get(f"http://127.0.0.2:{port}/health")[::2] == (200, "OK")
    with pytest.raises(urllib.error.URLError):   # the node's own address: nothing
        get(f"http://127.0.0.1:{port}/health")
    del kubelet.started["uid-dcgm"]
    wait(lambda: ex.thread is None)


def test_without_a_driver_or_nvidia_runtime_it_does_not_listen(node_root: Path) -> None:
    (node_root / "run/nvidia-lab/loaded-module-version").unlink()
    for runtime, why in (("nvidia", "Driver Not Loaded"), ("runc", "ERROR_LIBRARY_NOT_FOUND")):
        port = free_port()
        kubelet = FakeKubelet([], runtime=runtime)
        p = pod(container={"env": [{"name": "DCGM_EXPORTER_LISTEN",
                                    "value": f"127.0.0.1:{port}"},
                                   {"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"}]})
        ex = start(node_root, kubelet, p)
        log = node_root / kubelet.log_path(p, "dcgm-exporter").lstrip("/")
        wait(lambda log=log, why=why: f"Cannot init NVML library; err: {why}" in
             log.read_text())
        assert ex.address is None
        with pytest.raises(urllib.error.URLError):
            get(f"http://127.0.0.1:{port}/metrics")
        del kubelet.started["uid-dcgm"]
        wait(lambda ex=ex: ex.thread is None)


def test_the_real_promtool_reads_it(tmp_path: Path) -> None:
    """promtool (Debian's prometheus .deb, fetched into the lab's cache once, as the lab's
    Prometheus image is): the text parses; its only complaints are the camelCase label names,
    which the real exporter has too."""
    from tests.lab import repos

    deb = repos.fetch_upstream_deb("prometheus", "bookworm")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    text = metrics_text(CSV, FIELDS, K8S, {"uid-train": [G1]}, {"uid-train": TRAIN})
    p = subprocess.run([str(tmp_path / "usr/bin/promtool"), "check", "metrics"], input=text,
                       capture_output=True, text=True, timeout=60)
    problems = [line for line in (p.stdout + p.stderr).splitlines() if line.strip()]
    assert p.returncode in (0, 3), problems
    assert all(line.endswith("label names should be written in 'snake_case' not "
                             "'camelCase'") for line in problems), problems
