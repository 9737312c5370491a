"""MIG (issue 19, part 2): layouts per model, placement, the MIG fact read from real
nvidia-smi output, the mig role's plan (a matching layout is a no-op) and preflight's refusal
of a GPU without MIG before any host changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuk8s import mig
from gpuk8s.facts import HostFacts
from gpuk8s.facts.nvidia import GpuMig, MigState, parse_mig
from gpuk8s.facts.system import PciDevice, PciDevices
from gpuk8s.gpusharing import sharing_of
from gpuk8s.roles import HostContext, load_role
from tests.unit.scenarios import default_vars, fresh_value

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia" / "h200-mig"
H100 = "NVIDIA H100 80GB HBM3"


def test_named_layouts_per_model() -> None:
    assert mig.wanted("all-3g.40gb", H100, 2) == [("3g.40gb", "3g.40gb")] * 2
    assert mig.wanted("all-1g.10gb", H100, 1) == [("1g.10gb",) * 7]
    assert mig.wanted("all-1g.20gb", H100, 1) == [("1g.20gb",) * 4]
    assert mig.wanted("all-2g.20gb", H100, 1) == [("2g.20gb",) * 3]
    assert mig.wanted("all-7g.80gb", H100, 1) == [("7g.80gb",)]
    assert mig.wanted("all-balanced", "NVIDIA H200", 1) == [
        ("3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb")]
    assert mig.resources(mig.wanted("all-3g.40gb", H100, 2)) == {"nvidia.com/mig-3g.40gb": 4}


@pytest.mark.parametrize("layout, model, gpus, message", [
    ("all-3g.40gb", "NVIDIA L40S", 1, "NVIDIA L40S does not support MIG (MIG runs on A100, "
     "H100 and H200)"),
    ("all-3g.40gb", "NVIDIA H200", 1, "NVIDIA H200 has no MIG profile 3g.40gb (its profiles: "
     "1g.18gb"),
    ([["3g.40gb", "3g.40gb", "1g.10gb"]], H100, 1, "do not fit on one GPU"),
    ([["4g.40gb", "3g.40gb"], ["4g.40gb", "4g.40gb"]], H100, 2, "GPU 1 (NVIDIA H100 80GB "
     "HBM3): 4g.40gb, 4g.40gb do not fit"),
    ([["3g.40gb"]], H100, 2, "the layout lists 1 GPU(s) but the host has 2"),
])
def test_layouts_a_gpu_cannot_take_name_the_model(layout: Any, model: str, gpus: int,
                                                  message: str) -> None:
    with pytest.raises(ValueError) as err:
        mig.wanted(layout, model, gpus)
    assert message in str(err.value)


def test_placement_follows_the_real_rules() -> None:
    fam = {p.name: p for p in mig.MODELS[H100]}
    placed = mig.place([fam["1g.10gb"], fam["1g.10gb"], fam["2g.20gb"], fam["3g.40gb"]])
    assert placed is not None
    spans = sorted((start, p.size) for p, start in placed)
    # the real H200 put a lone 3g at slice 4 (lgi-one-3g.txt): largest first, highest start
    assert spans == [(0, 1), (1, 1), (2, 2), (4, 4)]
    assert mig.place([fam["1g.10gb"]] * 8) is None       # 1g may not start at slice 7
    assert mig.place([fam["4g.40gb"], fam["4g.40gb"]]) is None  # 4g starts at slice 0 only
    assert mig.place([fam["4g.40gb"], fam["3g.40gb"]]) is not None


def test_the_fact_reads_real_nvidia_smi_output() -> None:
    lgi = (REAL / "lgi-one-3g.txt").read_text()
    state = parse_mig("## mode\n0, Enabled, Enabled\n## list\n"
                      + (REAL / "L-gi-without-ci.txt").read_text() + "## gi\n" + lgi)
    (gpu,) = state
    # a GPU instance without its compute instance is no MIG device (the real -L shows none)
    assert gpu.instances == ("3g.71gb",) and gpu.devices == () and not gpu.tidy
    off = parse_mig("## mode\n0, Disabled, Disabled\n## list\nGPU 0: NVIDIA H200 (UUID: x)\n"
                    "## gi\n" + (REAL / "lgi-disabled.txt").read_text())
    assert off[0].layout == () and off[0].tidy


def _role_plan(role: str, sharing: dict[str, Any], model_id: str, gpus: int,
               state: tuple[GpuMig, ...]) -> Any:
    vars = default_vars(gpu_sharing=sharing)
    devices = tuple(PciDevice(f"0000:00:0{i}.0", "0x10de", model_id, "0x030200")
                    for i in range(gpus))
    values = {f: fresh_value(f, "ubuntu2404", gpus, "gpu-01") for f in load_role(role).facts(vars)}
    facts = HostFacts("gpu-01", {**values, PciDevices(): devices, MigState(): state})
    ctx = HostContext("gpu-01", role, vars, facts, {"nodes": {}}, ("workers",))
    return load_role(role).plan(ctx)


def test_the_role_splits_whole_gpus_and_a_matching_layout_is_a_no_op() -> None:
    whole = tuple(GpuMig(i, "Disabled", "Disabled") for i in range(2))
    ops = _role_plan("mig", {"mode": "mig", "layout": "all-3g.40gb"}, "0x2330", 2, whole)
    assert [op.reason for op in ops] == [
        "+ GPU 0: whole -> 3g.40gb + 3g.40gb", "+ GPU 1: whole -> 3g.40gb + 3g.40gb",
        "+ nvidia-smi -L lists 4 MIG device(s)", "+ create /etc/gpuk8s/mig-apply.sh",
        "+ create /etc/systemd/system/gpuk8s-mig.service",
        "+ enable gpuk8s-mig.service (runs at the next boot, before the kubelet)"]
    script = ops[0].commands[0]
    assert script.startswith("nvidia-smi -i 0 -mig 1 && ")
    assert script.endswith("nvidia-smi mig -i 0 -cgi 9,9 -C")
    done = tuple(GpuMig(i, "Enabled", "Enabled", ("3g.40gb",) * 2, ("3g.40gb",) * 2)
                 for i in range(2))
    ops = _role_plan("mig", {"mode": "mig", "layout": "all-3g.40gb"}, "0x2330", 2, done)
    assert [op.changes for op in ops[:2]] == [False, False]
    assert [op.id for op in ops[2:]] == ["mig | boot script", "mig | boot unit",
                                         "mig | boot unit enabled"]
    assert ops[2].diff and "nvidia-smi mig -i 1 -cgi 9,9 -C" in ops[2].diff
    assert ops[3].diff and "Before=kubelet.service" in ops[3].diff
    assert ops[0].reason == "= GPU 0: MIG 3g.40gb + 3g.40gb"
    # back to none: instances go first, then MIG mode off
    ops = _role_plan("mig", {"mode": "none"}, "0x2330", 2, done)
    assert ops[0].commands[0].startswith("nvidia-smi mig -i 0 -dci && nvidia-smi mig -i 0 -dgi"
                                         " && nvidia-smi -i 0 -mig 0 && ")
    assert ops[2].reason == "+ nvidia-smi -L lists 0 MIG device(s)"


def test_a_half_made_layout_is_redone() -> None:
    half = (GpuMig(0, "Enabled", "Enabled", ("3g.71gb",), ("3g.71gb", "3g.71gb")),)
    ops = _role_plan("mig", {"mode": "mig", "layout": "all-3g.71gb"}, "0x2335", 1, half)
    assert ops[0].changes
    assert ops[0].commands[0].startswith("nvidia-smi mig -i 0 -dci && nvidia-smi mig -i 0 -dgi"
                                         " && nvidia-smi mig -i 0 -cgi 9,9 -C")


def test_preflight_refuses_mig_on_an_l40s_and_it_cannot_be_ignored() -> None:
    from roles.preflight.role import NEVER_IGNORED, UNPLANNABLE, _sharing_problems

    vars = default_vars(gpu_sharing={"mode": "mig", "layout": "all-3g.40gb"})
    ctx = HostContext("gpu-03", "preflight", vars, HostFacts("gpu-03", {}), {}, ("workers",))
    l40s = [PciDevice("0000:00:06.0", "0x10de", "0x26b9", "0x030200")]
    (problem,) = _sharing_problems(ctx, l40s)
    assert problem[0] == "gpu_sharing"
    assert "NVIDIA L40S does not support MIG" in problem[1]
    assert "gpu_sharing" in NEVER_IGNORED and "gpu_sharing" in UNPLANNABLE
    h100 = [PciDevice("0000:00:06.0", "0x10de", "0x2330", "0x030200")]
    assert _sharing_problems(ctx, h100) == []


def test_mig_nodes_use_the_mixed_strategy_config_and_their_layout_label() -> None:
    sharing = sharing_of({"mode": "mig", "layout": "all-3g.40gb"})
    assert sharing.key == "mig-mixed"
    assert sharing.config() == {"version": "v1", "flags": {"migStrategy": "mixed"}}
    assert sharing.resources(2, H100) == {"nvidia.com/mig-3g.40gb": 4}
    from gpuk8s.gpusharing import node_labels

    assert node_labels(sharing)["nvidia.com/mig.config"] == "all-3g.40gb"
    assert node_labels(sharing_of({"mode": "none"}))["nvidia.com/mig.config"] is None
