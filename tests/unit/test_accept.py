"""gpuk8s accept: the node script's output parsed and judged. The fixtures are the real output
of the accept script on 2x H200 (tests/fixtures/real/h200-accept, docs/real-hardware.md); the
faults are those lines changed the way a faulty GPU changes them."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from gpuk8s.accept.command import cap, quarantine_script, release_script
from gpuk8s.accept.judge import judge
from gpuk8s.accept.node import HEALTH_FIELDS, SAMPLE_FIELDS, parse, script
from gpuk8s.accept.references import FATAL_XIDS, REFERENCES

REAL = Path(__file__).parents[1] / "fixtures" / "real" / "h200-accept"
FULL = (REAL / "2xh200-full.txt").read_text()
QUICK = (REAL / "2xh200-quick.txt").read_text()


def _verdict(text: str) -> tuple[str, list[str], dict]:
    j = judge(parse(text))
    return j["verdict"], j["reasons"], j


def _smi(text: str, index: int, field: str, value: str) -> str:
    """``text`` with one health field of one GPU changed."""
    col = HEALTH_FIELDS.index(field)
    out = []
    section = False
    for line in text.splitlines():
        if line == "SMI-BEGIN":
            section = True
        elif line.startswith("SMI-END"):
            section = False
        elif section and line.startswith(f"{index}, "):
            cells = line.split(", ")
            cells[col] = value
            line = ", ".join(cells)
        out.append(line)
    return "\n".join(out) + "\n"


def test_the_real_2x_h200_readings_pass_with_every_figure():
    for text in (FULL, QUICK):
        verdict, reasons, j = _verdict(text)
        assert (verdict, reasons) == ("pass", [])
        r = parse(text)
        assert r.pci_gpus == 2 and r.cuda_devices == 2 and len(r.gpus) == 2
        assert r.module == "580.159.04"
        assert set(r.figures) == {"matmul_bf16", "matmul_fp16", "matmul_tf32", "membw", "h2d",
                                  "d2h"}
        assert all(len(v) == 2 for v in r.figures.values())
        assert {(p["src"], p["dst"]) for p in r.p2p} == {(0, 1), (1, 0)}
        assert r.nccl["busbw"] > 300 and r.nccl["bytes"] == 8 << 30
        assert r.samples[0]["link_gen"] == 5 and r.samples[1]["link_width"] == 16
        checks = [c for g in j["gpus"] for c in g["checks"]]
        bf16 = [c for c in checks if c["check"] == "matmul_bf16"]
        assert len(bf16) == 2 and all(c["reference"] == 670.0 and "measured" in c["source"]
                                      for c in bf16)
        nccl = [c for c in j["node_checks"] if c["check"] == "nccl_busbw"]
        assert nccl and nccl[0]["verdict"] == "pass"


def test_the_real_hidden_gpu_run_failed_the_node():
    # CUDA_VISIBLE_DEVICES=1 on the real host: the judged output it printed there
    text = (REAL / "hidden-judged.txt").read_text()
    assert "verdict: fail (missing)" in text
    assert "CUDA sees 1 of the 2 GPUs" in text


def test_a_hidden_gpu_fails_the_node():
    lines = [x for x in FULL.splitlines()
             if not re.match(r"(DEVICE 1 |MATMUL 1 |MEMBW 1 |H2D 1 |D2H 1 |P2P |NCCL )", x)]
    text = "\n".join(lines).replace("CUDA devices=2", "CUDA devices=1")
    verdict, reasons, j = _verdict(text)
    assert verdict == "fail" and reasons == ["missing"]
    assert "CUDA sees 1 of the 2 GPUs" in j["reason_text"]


@pytest.mark.parametrize("field,value,code,words", [
    ("pcie.link.width.current", "4", "pcie", "PCIe link x4 of x16"),
    ("ecc.errors.uncorrected.volatile.total", "3", "ecc", "3 uncorrected ECC errors"),
    ("remapped_rows.pending", "Yes", "ecc", "remapped rows pending: Yes"),
])
def test_health_faults_on_one_gpu_fail_the_node_naming_that_gpu(field, value, code, words):
    text = _smi(FULL, 1, field, value)
    if field == "pcie.link.width.current":  # the samples under load see the same link
        text = text.replace("\n1, 5, 16, ", "\n1, 5, 4, ")
    verdict, reasons, j = _verdict(text)
    assert verdict == "fail" and reasons == [code]
    assert j["reason_text"].startswith("GPU 1 (") and words in j["reason_text"]
    assert j["gpus"][0]["verdict"] == "pass" and j["gpus"][1]["verdict"] == "fail"


def test_a_link_trained_to_a_lower_generation_under_load_fails():
    text = FULL.replace("\n1, 5, 16, ", "\n1, 3, 16, ")
    verdict, reasons, j = _verdict(text)
    assert (verdict, reasons) == ("fail", ["pcie"])
    assert "Gen3 under load" in j["reason_text"]


def test_fatal_xid_fails_its_gpu_and_a_harmless_one_warns():
    fatal = "[ 1843.308145] NVRM: Xid (PCI:0000:00:07): 79, GPU has fallen off the bus."
    app = ("[22859.081860] NVRM: Xid (PCI:0000:00:06): 31, pid=14292, name=python, Ch "
           "00000030, intr 00000000. MMU Fault")
    text = FULL.replace("XID-BEGIN\n", f"XID-BEGIN\n{fatal}\n{app}\n")
    verdict, reasons, j = _verdict(text)
    assert (verdict, reasons) == ("fail", ["xid-79"])
    g0, g1 = j["gpus"]
    assert g0["verdict"] == "warn" and g1["verdict"] == "fail"
    assert "Xid 79" in j["reason_text"] and "reset or a reboot" in j["reason_text"]


def test_thermal_slowdown_under_load_fails_but_power_capping_does_not():
    assert _verdict(FULL)[0] == "pass"  # the real run was power capped (0x4) throughout
    text = re.sub(r"(\n1, 5, 16, \d+, [\d.]+, )0x0000000000000004",
                  r"\g<1>0x0000000000000044", FULL, count=1)
    verdict, reasons, j = _verdict(text)
    assert (verdict, reasons) == ("fail", ["throttle"])
    assert "hardware thermal slowdown" in j["reason_text"]


def test_a_slow_gpu_fails_and_a_slightly_slow_one_warns():
    def scaled(factor: float) -> str:
        return re.sub(r"MATMUL 1 bf16 ([\d.]+)",
                      lambda m: f"MATMUL 1 bf16 {float(m.group(1)) * factor:.1f}", FULL)
    verdict, reasons, j = _verdict(scaled(0.7))
    assert (verdict, reasons) == ("fail", ["slow"])
    assert "dense BF16 matmul" in j["reason_text"] and "% of the NVIDIA H200 reference" in \
        j["reason_text"]
    assert _verdict(scaled(0.93))[0] == "warn"


def test_a_gpu_nvidia_smi_no_longer_lists_is_missing():
    text = "\n".join(x for x in FULL.splitlines()
                     if not x.startswith("1, 00000000:00:07.0"))
    verdict, reasons, _ = _verdict(text)
    assert verdict == "fail" and reasons[0] == "missing"


def test_driver_and_library_mismatch_fails():
    verdict, reasons, j = _verdict(FULL.replace("MODULE 580.159.04", "MODULE 580.95.05"))
    assert (verdict, reasons) == ("fail", ["driver"])
    assert "reboot" in j["reason_text"]


def test_no_nvcc_fails_with_the_fix():
    head = FULL[:FULL.index("BUILD ")]
    verdict, reasons, j = _verdict(head + "BUILD none: no nvcc (the CUDA toolkit: "
                                   "cuda_toolkit_enabled: true)\n")
    assert (verdict, reasons) == ("fail", ["benchmark"])
    assert "cuda_toolkit_enabled" in j["reason_text"]


def test_a_model_without_a_reference_is_held_to_its_best_gpu():
    text = FULL.replace("NVIDIA H200", "NVIDIA RTX PRO 6000")
    verdict, _, j = _verdict(text)
    assert verdict == "pass"
    c = next(c for c in j["gpus"][0]["checks"] if c["check"] == "matmul_bf16")
    assert c["source"] == "this node" and "best GPU" in c["detail"]
    slow = re.sub(r"MATMUL 1 bf16 [\d.]+", "MATMUL 1 bf16 500.0", text)
    assert _verdict(slow)[1] == ["slow"]


def test_node_output_is_data_malformed_lines_are_left_out():
    noisy = FULL.replace("MATMUL 0 bf16", "MATMUL 0 bf16 $(reboot)\nMATMUL 0 bf16", 1)
    noisy = noisy.replace("SMI-END 0", "0, x; rm -rf /, a\nSMI-END 0")
    r = parse(noisy)
    assert len(r.gpus) == 2 and r.figures["matmul_bf16"][0] > 600
    assert any("rm -rf" in e for e in r.errors)  # kept as an error line, never run


def test_the_script_reads_the_fields_nvidia_smi_580_has():
    help_fields = set(re.findall(r'^"([a-z_.]+)"', (REAL / "help-query-gpu.txt").read_text(),
                                 re.M))
    assert set(HEALTH_FIELDS) <= help_fields and set(SAMPLE_FIELDS) <= help_fields
    s = script(quick=True)
    assert "--quick" in s and "-lcublas -ldl" in s and "GPUK8S_ACCEPT_EOF" in s


def test_references_every_row_has_sources_and_the_fatal_xids_are_the_catalogs():
    for model, row in REFERENCES.items():
        assert row, model
        for metric, ref in row.items():
            assert ref.value > 0 and len(ref.source) > 10, (model, metric)
    for required in ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe",
                     "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB", "NVIDIA L40S"):
        assert required in REFERENCES
    assert {48, 79, 95, 119, 120} <= set(FATAL_XIDS) and 31 not in FATAL_XIDS


@pytest.mark.parametrize("nodes,limit", [(1, 1), (3, 1), (4, 1), (8, 2), (12, 3), (40, 10)])
def test_one_run_quarantines_at_most_a_quarter(nodes, limit):
    assert cap(nodes) == limit


def test_quarantine_and_release_quote_every_value():
    s = quarantine_script("gpu-01", "xid-79", "GPU 1: Xid 79 'quoted' $(x)", cordon=True)
    lines = s.splitlines()
    assert lines[0] == "set -e" and "cordon gpu-01" in lines[1]
    taint = shlex.split(lines[2])
    assert taint[-3:] == ["gpu-01", "gpuk8s.io/gpu-unhealthy=xid-79:NoSchedule", "--overwrite"]
    ann = shlex.split(lines[4])
    assert "gpuk8s.io/gpu-unhealthy-reason=GPU 1: Xid 79 'quoted' $(x)" in ann
    assert "gpuk8s.io/cordoned-by=gpuk8s-accept" in ann
    assert "cordon" not in quarantine_script("gpu-01", "slow", "x", cordon=False)
    r = release_script("gpu-01", uncordon=False)
    assert "uncordon" not in r and "gpuk8s.io/gpu-unhealthy:NoSchedule-" in r
    assert "uncordon gpu-01" in release_script("gpu-01", uncordon=True)


def test_nccl_is_the_libnccl2_built_for_cuda_version() -> None:
    from gpuk8s.ops.apt import version_matches

    assert version_matches("2.28.3-1+cuda13.0", "*+cuda13.0")
    assert not version_matches("2.28.3-1+cuda12.9", "*+cuda13.0")
    assert version_matches("1.36.2-1.1", "1.36.") and version_matches("x", "")


def test_a_busy_gpu_is_reported_not_judged_on_speed_but_still_on_health():
    apps = "APPS-BEGIN\n00000000:00:07.0, 4242\n00000000:00:07.0, 4243\nAPPS-END\n"
    slow = re.sub(r"MATMUL 1 bf16 [\d.]+", "MATMUL 1 bf16 300.0", FULL)
    busy = slow.replace("XID-BEGIN\n", apps + "XID-BEGIN\n")
    assert parse(busy).busy == {"00:07.0": 2}
    verdict, reasons, j = _verdict(busy)
    assert (verdict, reasons) == ("warn", [])  # without the processes: fail, slow
    assert _verdict(slow)[1] == ["slow"]
    c = next(c for c in j["gpus"][1]["checks"] if c["check"] == "matmul_bf16")
    assert c["verdict"] == "info" and "not judged" in c["detail"] and c["value"] == 300.0
    assert any("other processes use GPU 1 (2)" in c["detail"] for c in j["node_checks"])
    # health is judged whatever runs there
    narrow = _smi(busy, 1, "pcie.link.width.current", "4").replace("\n1, 5, 16, ", "\n1, 5, 4, ")
    assert _verdict(narrow)[1] == ["pcie"]
