"""`invoke accept` and `invoke release` on the bootstrapped lab, over real SSH, with the real
kubectl: every fault kind `invoke lab.gpu-fault` injects on one GPU of the 2-GPU node fails that
node with its reason, cordons and taints it and leaves the other GPU node alone; clearing the
fault and `release` bring it back; with every GPU node faulted, one run quarantines no more than
its cap. The lab's nvidia-smi, dmesg and benchmark are stand-ins (tests/lab/standins/nvidia);
the judging, the node script and the quarantine are the product's."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import api, day2
from gpuk8s.accept.command import accept, release
from gpuk8s.errors import Gpuk8sError
from tests.lab.lab import Lab
from tests.lab.product.runs import ROOT, call, derived_inventory
from tests.lab.product.test_bootstrap import GATE_VARS, kubectl_cp
from tests.lab.product.test_day2 import restore_bootstrapped

pytestmark = pytest.mark.lab

TAINT = "gpuk8s.io/gpu-unhealthy"


@pytest.fixture(scope="module")
def inv(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    restore_bootstrapped(lab)
    return derived_inventory(lab, tmp_path_factory.mktemp("accept"), feature_gates=GATE_VARS)


def node(lab: Lab, name: str) -> dict[str, Any]:
    n = json.loads(kubectl_cp(lab, f"get node {name} -o json"))
    return {"cordoned": bool(n["spec"].get("unschedulable")),
            "taints": {t["key"]: t.get("value", "") for t in n["spec"].get("taints", [])},
            "label": n["metadata"].get("labels", {}).get(TAINT),
            "reason": n["metadata"].get("annotations", {}).get(f"{TAINT}-reason", "")}


def gpu_fault(*args: str) -> None:
    """The documented switch, as an admin types it: invoke lab.gpu-fault ..."""
    proc = subprocess.run([sys.executable, "-m", "invoke", "lab.gpu-fault", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_healthy_lab_passes_with_every_figure_against_its_reference(lab: Lab, inv: Path
                                                                      ) -> None:
    results, out = call(accept, inv, quick=True)
    assert set(results) == {"gpu-01", "gpu-02"}  # the GPU nodes; cp-01 and cpu-01 have none
    for host, r in results.items():
        assert r["verdict"] in ("pass", "warn"), (host, r["reason_text"])
        assert r["action"] == "none"
        checks = {c["check"] for g in r["gpus"] for c in g["checks"]}
        assert {"pcie", "ecc", "matmul_bf16", "membw", "h2d", "d2h"} <= checks
    h100 = next(c for g in results["gpu-01"]["gpus"] for c in g["checks"]
                if c["check"] == "matmul_bf16")
    assert h100["reference"] == 670.0 and "H200" in h100["source"]
    # 2 GPUs and libnccl2 for CUDA 13.0 (cuda_nccl): an all-reduce figure, with no
    # reference for 2 H100s, so reported and not judged
    nccl = [c for c in results["gpu-01"]["node_checks"] if c["check"] == "nccl_busbw"]
    assert nccl and nccl[0]["verdict"] == "info" and nccl[0]["value"] == 340.0
    assert "no reference for 2x NVIDIA H100 80GB HBM3" in nccl[0]["detail"]
    _, nccl_version, _ = lab.ssh("gpu-01", "dpkg-query -W -f '${Version}' libnccl2")
    assert nccl_version == "2.28.3-1+cuda13.0"  # for cuda_version 13.0, not the newest (13.1)
    assert "GPU acceptance" in out
    for name in ("gpu-01", "gpu-02"):
        assert node(lab, name) == {"cordoned": False, "taints": {}, "label": None,
                                   "reason": ""}


@pytest.mark.parametrize("kind,code,words", [
    ("slow", "slow", "dense BF16 matmul"),
    ("pcie", "pcie", "PCIe link x4 of x16"),
    ("ecc", "ecc", "uncorrected ECC errors"),
    ("xid", "xid-119", "Xid 119"),
    ("missing", "missing", "nvidia-smi sees 1 of the 2 PCI GPUs"),
])
def test_a_fault_on_one_gpu_quarantines_that_node_until_release(lab: Lab, inv: Path, kind: str,
                                                                code: str, words: str) -> None:
    gpu_fault("gpu-01", "--gpu", "1", "--kind", kind)
    try:
        results, _ = call(accept, inv, quick=True)
        r = results["gpu-01"]
        assert r["verdict"] == "fail" and r["reasons"][0] == code, r["reason_text"]
        assert words in r["reason_text"]
        if kind != "missing":
            assert r["reason_text"].startswith("GPU 1 ("), r["reason_text"]
        assert r["action"].startswith("quarantined")
        assert results["gpu-02"]["verdict"] in ("pass", "warn")
        got = node(lab, "gpu-01")
        assert got["cordoned"] and got["taints"] == {TAINT: code} and got["label"] == code
        assert words in got["reason"]
        assert node(lab, "gpu-02") == {"cordoned": False, "taints": {}, "label": None,
                                       "reason": ""}
        rows, out = call(day2.status, inv)
        row = next(x for x in rows if x["host"] == "gpu-01")
        assert row["gpu_quarantine"]["reason"] == code and "(GPU quarantine)" in out
        assert "gpu-01 is quarantined" in out and "invoke release --host gpu-01" in out
        with pytest.raises(Gpuk8sError, match="still fails accept"):
            call(release, inv, host="gpu-01", quick=True)
        assert node(lab, "gpu-01")["taints"] == {TAINT: code}
    finally:
        gpu_fault("gpu-01", "--clear")
    done, _ = call(release, inv, host="gpu-01", quick=True)
    assert done["released"] and done["result"]["action"] == "released and uncordoned"
    assert node(lab, "gpu-01") == {"cordoned": False, "taints": {}, "label": None, "reason": ""}


def test_every_gpu_node_faulted_quarantines_no_more_than_the_cap(lab: Lab, inv: Path) -> None:
    gpu_fault("gpu-01", "--gpu", "0", "--kind", "ecc")
    gpu_fault("gpu-02", "--gpu", "0", "--kind", "pcie")
    try:
        results, _ = call(accept, inv, quick=True)
        assert [r["verdict"] for r in results.values()] == ["fail", "fail"]
        actions = sorted(r["action"] for r in results.values())
        # 2 GPU nodes: max(1, 25%) = 1
        assert actions[0].startswith("NOT quarantined") and "limit of 1" in actions[0]
        assert actions[1].startswith("quarantined")
        tainted = [n for n in ("gpu-01", "gpu-02") if node(lab, n)["taints"]]
        assert tainted == ["gpu-01"]
    finally:
        gpu_fault("gpu-01", "--clear")
        gpu_fault("gpu-02", "--clear")
    call(release, inv, host="gpu-01", quick=True)
    assert node(lab, "gpu-01")["taints"] == {} and node(lab, "gpu-02")["taints"] == {}


def test_a_fatal_xid_quarantines_a_watched_node_with_no_gpuk8s_command_running(
        lab: Lab, tmp_path: Path) -> None:
    watched = derived_inventory(lab, tmp_path, hosts={"gpu-02": {"gpu_health_watch": True}},
                                feature_gates=GATE_VARS)
    _, text = call(api.bootstrap, watched, limit="gpu-02", yes=True)
    assert "(re)start gpuk8s-gpu-health.service" in text
    _, out, _ = lab.ssh("gpu-02", "systemctl is-active gpuk8s-gpu-health.service")
    assert out.strip() == "active", out
    # gpu-01 does not watch (gpu_health_watch is per host): the same Xid leaves it alone
    gpu_fault("gpu-01", "--gpu", "0", "--kind", "xid")
    start = time.monotonic()
    gpu_fault("gpu-02", "--gpu", "0", "--kind", "xid")
    try:
        while node(lab, "gpu-02")["label"] is None and time.monotonic() - start < 30:
            time.sleep(1)
        took = time.monotonic() - start
        got = node(lab, "gpu-02")
        assert got["label"] == "xid-119", f"not quarantined {took:.0f} s after the Xid"
        assert took <= 30 and got["cordoned"]
        assert "Xid 119 in the kernel log" in got["reason"] and "NVRM: Xid (PCI:" in got["reason"]
        # the node's kubelet credentials cannot taint (NodeRestriction): no gpuk8s taint yet
        assert TAINT not in got["taints"]
        assert node(lab, "gpu-01")["label"] is None
        rows, out = call(day2.status, watched)
        assert next(r for r in rows if r["host"] == "gpu-02")["gpu_quarantine"]["reason"] == \
            "xid-119"
        assert "gpu-02: 1 Xid event(s) since boot (1 needing a GPU reset or a reboot)" in out
        assert next(r for r in rows if r["host"] == "gpu-01")["xids"][0]["xid"] == 119
        # accept, run now, fails it on the same Xid and adds gpuk8s's taint
        results, _ = call(accept, watched, host="gpu-02", quick=True)
        assert results["gpu-02"]["reasons"] == ["xid-119"]
        assert node(lab, "gpu-02")["taints"] == {TAINT: "xid-119"}
    finally:
        gpu_fault("gpu-01", "--clear")
        gpu_fault("gpu-02", "--clear")
    done, _ = call(release, watched, host="gpu-02", quick=True)
    assert done["result"]["action"] == "released and uncordoned"
    assert node(lab, "gpu-02") == {"cordoned": False, "taints": {}, "label": None, "reason": ""}
    # the watch remembers the Xid it acted on: released, the node stays released
    time.sleep(12)
    assert node(lab, "gpu-02")["label"] is None
