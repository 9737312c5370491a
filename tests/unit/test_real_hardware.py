"""Outputs recorded on a real NVIDIA H200 host (Ubuntu 24.04, driver 580.159.04, 2026-11-26; see
docs/real-hardware.md) parsed by the same facts and checks gpuk8s runs there."""

from __future__ import annotations

import json
from pathlib import Path

from gpuk8s.facts.nvidia import GpuTopology, Nvidia
from gpuk8s.facts.system import PciDevices
from gpuk8s.gpucheck import parse_check

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "h200-ubuntu2404"


def read(name: str) -> str:
    return (REAL / name).read_text()


def test_pci_probe_finds_the_h200() -> None:
    devices = PciDevices().parse(read("sys-pci-probe.txt"), 0)
    assert [(d.address, d.model, d.is_gpu) for d in devices] == \
        [("0000:00:06.0", "NVIDIA H200", True)]


def test_nvidia_fact_from_the_real_outputs() -> None:
    header = next(line for line in read("nvidia-smi.txt").splitlines() if "CUDA Version" in line)
    out = (f"## query\n{read('query-gpu.csv')}## rc 0\n## header\n{header}\n## proc\n"
           f"{read('proc-driver-nvidia-version.txt')}## nvswitch\n")
    state = Nvidia().parse(out, 0)
    gpu = state.gpus[0]
    assert (gpu.name, gpu.memory_mib, gpu.compute_cap, gpu.bus_id) == \
        ("NVIDIA H200", 143771, "9.0", "00000000:00:06.0")
    assert (gpu.persistence_mode, gpu.mig_mode) == ("Enabled", "Disabled")
    assert (state.module, state.loaded_version, state.cuda_version) == \
        ("open", "580.159.04", "13.0")


def test_single_gpu_topology_has_no_links() -> None:
    topo = GpuTopology().parse("## nvlink\n## topo\n" + read("nvidia-smi-topo-m.txt"), 0)
    assert topo.nvlinks == {} and topo.matrix == {"GPU0": {}}


def test_recorded_facts_json_matches_the_parsers() -> None:
    facts = json.loads(read("facts.json"))["localhost"]
    assert facts["Nvidia"]["gpus"][0]["driver_version"] == "580.159.04"
    assert facts["CudaToolkits"] == {"13.0": "13.0.88"}
    assert facts["System"]["cgroup"] == "cgroup2fs"


def test_verify_output_judged_ok_and_a_missing_gpu_fails() -> None:
    recorded = read("verify-local.txt")  # the table the real run printed (cells wrap)
    assert "│ localhost │ 1        │ 1          │ 580.159.04 │ nvcc 13.0" in recorded
    assert "│ ok     │" in recorded and "16777216 floats: 0" in recorded
    # the check's own lines, as the table shows them unwrapped
    out = ("SMI-GPUS 1\nRUNNER nvcc 13.0\nOK GPU 0 NVIDIA H200 (PCI 0000:00:06.0, sm_90): "
           "vecadd of 16777216 floats: 0 wrong, 102.201 ms\n")
    assert parse_check(out, 0, 1)["ok"]
    assert not parse_check(out, 0, 2)["ok"]  # a PCI GPU nvidia-smi did not list
    bad = out.replace("OK GPU 0", "FAIL GPU 0").replace("0 wrong", "12 wrong")
    assert not parse_check(bad, 1, 1)["ok"]
