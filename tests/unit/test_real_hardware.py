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


def _cells(table: str) -> dict[str, list[str]]:
    """check -> [problem, fix] from a Rich table as printed (each cell wrapped over rows)."""
    rows: dict[str, list[str]] = {}
    current = ""
    for line in table.splitlines():
        cols = [c.strip() for c in line.split("│")]
        if len(cols) != 5:
            continue
        current = cols[1] or current
        cells = rows.setdefault(current, ["", ""])
        rows[current] = [f"{cells[0]} {cols[2]}".strip(), f"{cells[1]} {cols[3]}".strip()]
    return rows


def test_preflight_today_refuses_the_recorded_host_as_it_did_there() -> None:
    """The 2026-11-27 session: preflight, fed the System fact recorded on the host, gives the
    message and the fix the host printed (the table wraps them; the words are the same)."""
    from dataclasses import fields

    from gpuk8s.facts.system import SystemInfo
    from roles.preflight.role import check
    from tests.unit.test_truthful_preflight import context

    recorded = json.loads(read("facts-2026-11-27.json"))["localhost"]["System"]
    names = {f.name for f in fields(SystemInfo)}
    system = {k: tuple(v) if isinstance(v, list) else v for k, v in recorded.items()
              if k in names}
    assert (system["init"], system["systemd"], system["virt"]) == \
        ("process_api", False, "docker")
    errors, _ = check(context("localhost", **system))
    found = {name: [message, fix] for name, message, fix in errors}
    session = read("session-2026-11-27.txt")
    printed = _cells(session[session.index("preflight problems"):
                             session.index("error: preflight found")])
    assert found["init"][0].startswith("no systemd (PID 1 is process_api): gpuk8s needs a "
                                       "systemd host")
    assert printed["init"] == found["init"]
    assert "(exit code 3)" in session and "+ enable kubelet" not in session
    # the PyTorch fallback found the system PyTorch from gpuk8s's venv (the cell wraps)
    assert "torch 2.11.0+cu130 (CUDA 13.0) with" in session
    assert "/opt/torch/.venv/bin/python3" in session
