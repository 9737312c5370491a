"""The stand-ins `invoke accept` reads in the lab, against the real H200's output and against
the product's own parser: nvidia-smi's health fields (tests/fixtures/real/h200-accept/
health.csv), their faults (labgpu.FAULT_DIR), --query-compute-apps and -lms, the dmesg
stand-in, and the benchmark stand-in's lines as gpuk8s.accept.node parses them."""

from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path

from gpuk8s.accept.judge import judge
from gpuk8s.accept.node import HEALTH_FIELDS, SAMPLE_FIELDS, parse
from tests.lab.paths import REPO_ROOT
from tests.lab.selftest.standins.nvidia_helpers import smi

REAL = REPO_ROOT / "tests" / "fixtures" / "real" / "h200-accept"
STANDINS = REPO_ROOT / "tests" / "lab" / "standins" / "nvidia"


def _rows(out: str, fields: tuple[str, ...]) -> list[dict[str, str]]:
    return [dict(zip(fields, (c.strip() for c in line.split(", ")), strict=True))
            for line in out.splitlines()]


def _health(root: Path) -> list[dict[str, str]]:
    res = smi(root, f"--query-gpu={','.join(HEALTH_FIELDS)}", "--format=csv,noheader,nounits")
    assert res.returncode == 0, res.stdout
    return _rows(res.stdout, HEALTH_FIELDS)


def _fault(root: Path, index: int, kind: str) -> None:
    bus = sorted(p.name for p in (root / "sys/bus/pci/devices").iterdir()
                 if (p / "vendor").read_text().strip() == "0x10de"
                 and (p / "class").read_text().startswith("0x03"))[index]
    d = root / "var/lib/gpuk8s-lab/gpu-faults"
    d.mkdir(parents=True, exist_ok=True)
    (d / bus).write_text(kind + "\n")


def test_health_fields_read_as_on_the_real_h200(dual: Path) -> None:
    with (REAL / "health.csv").open() as fh:
        real = [{k.split(" [")[0].strip(): v.strip() for k, v in row.items()}
                for row in csv.DictReader(fh, skipinitialspace=True)]
    ours = _health(dual)
    assert len(ours) == len(real) == 2
    same = ("pcie.link.gen.max", "pcie.link.width.max", "pcie.link.width.current",
            "ecc.mode.current", "ecc.errors.corrected.volatile.total",
            "ecc.errors.uncorrected.volatile.total", "retired_pages.pending",
            "remapped_rows.pending", "remapped_rows.failure", "persistence_mode",
            "driver_version")
    for mine, theirs in zip(ours, real, strict=True):
        assert {k: mine[k] for k in same} == {k: theirs[k] for k in same}
    assert ours[0]["power.limit"] == ours[0]["power.default_limit"] == "700.00"


def test_faults_change_what_nvidia_smi_reports(dual: Path) -> None:
    _fault(dual, 1, "pcie")
    assert [r["pcie.link.width.current"] for r in _health(dual)] == ["16", "4"]
    _fault(dual, 1, "ecc")
    g1 = _health(dual)[1]
    assert g1["ecc.errors.uncorrected.volatile.total"] == "2"
    assert g1["remapped_rows.pending"] == "Yes"
    _fault(dual, 1, "missing")
    assert len(_health(dual)) == 1 and smi(dual, "-L").stdout.count("GPU ") == 1


def test_compute_apps_and_loop(dual: Path) -> None:
    res = smi(dual, "--query-compute-apps=gpu_bus_id,pid", "--format=csv,noheader")
    assert (res.returncode, res.stdout) == (0, "")
    bad = smi(dual, "--query-compute-apps=nope", "--format=csv")
    assert bad.returncode == 2 and 'Field "nope" is not a valid field' in bad.stdout
    env = dict(os.environ, GPUK8S_LAB_ROOT=str(dual), LC_ALL="C")
    try:
        out = subprocess.run([str(dual / "usr/bin/nvidia-smi"),
                              f"--query-gpu={','.join(SAMPLE_FIELDS)}",
                              "--format=csv,noheader,nounits", "-lms", "200"],
                             capture_output=True, text=True, env=env, timeout=1.1).stdout
    except subprocess.TimeoutExpired as exc:  # it loops until killed, as the real one
        out = (exc.stdout or b"").decode()
    assert len(out.splitlines()) >= 4  # two GPUs, at least twice


def test_the_benchmark_and_dmesg_stand_ins_speak_the_products_formats(dual: Path) -> None:
    env = dict(os.environ, GPUK8S_LAB_ROOT=str(dual))

    def bench(*args: str) -> str:
        return subprocess.run([str(STANDINS / "accept-bench"), *args], capture_output=True,
                              text=True, env=env, check=True).stdout

    smi_out = smi(dual, f"--query-gpu={','.join(HEALTH_FIELDS)}",
                  "--format=csv,noheader,nounits").stdout
    head = f"PCI-GPUS 2\nSMI-BEGIN\n{smi_out}SMI-END 0\nXID-BEGIN\nXID-END\nBUILD cached\n"
    r = parse(head + bench("--quick"))
    assert r.cuda_devices == 2 and len(r.figures["matmul_bf16"]) == 2 and len(r.p2p) == 2
    assert judge(r)["verdict"] in ("pass", "warn")
    _fault(dual, 1, "slow")
    j = judge(parse(head + bench()))
    assert j["verdict"] == "fail" and j["reasons"] == ["slow"]
    hidden = subprocess.run([str(STANDINS / "accept-bench")], capture_output=True, text=True,
                            env={**env, "CUDA_VISIBLE_DEVICES": "0"}, check=True).stdout
    assert judge(parse(head + hidden))["reasons"] == ["missing"]
    kmsg = dual / "run/gpuk8s-lab/kmsg"
    kmsg.parent.mkdir(parents=True, exist_ok=True)
    line = "[ 1843.308145] NVRM: Xid (PCI:0000:00:07): 119, pid=4242, name=python3, Timeout"
    kmsg.write_text(line + "\n")
    # the dmesg stand-in reads /run/gpuk8s-lab/kmsg of the node it runs on (no lab root)
    text = (STANDINS / "dmesg").read_text()
    assert "cat /run/gpuk8s-lab/kmsg" in text and "LAB STAND-IN" in text
    assert parse(head.replace("XID-BEGIN\n", f"XID-BEGIN\n{line}\n") + bench()).xids
