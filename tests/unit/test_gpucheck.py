"""The node GPU check script: its CUDA source compiles in shape, and the row logic fails loudly
on a host where nvidia-smi misses a GPU or no computation can run."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

from gpuk8s.gpucheck import check_script, parse_check


def test_script_is_valid_sh_and_carries_the_cuda_source() -> None:
    script = check_script()
    assert "__global__ void vecadd" in script and "RUNNER nvcc" in script
    proc = subprocess.run(["sh", "-n"], input=script.encode(), capture_output=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr


def test_without_nvidia_smi_the_check_finds_no_gpu(tmp_path: Path) -> None:
    """No nvidia-smi and no python3: where this machine has nvcc (the CUDA image does), the
    CUDA source must compile and nothing runs; without nvcc the check says it cannot run."""
    for tool in ("sh", "mktemp", "rm", "grep", "ls", "head", "sed", "cat"):
        (tmp_path / tool).symlink_to(shutil.which(tool) or f"/bin/{tool}")
    nvcc = [p for p in glob.glob("/usr/local/cuda*/bin/nvcc") if os.access(p, os.X_OK)]
    path = str(tmp_path) + (":/usr/bin" if nvcc else "")  # nvcc needs the host compiler
    proc = subprocess.run([str(tmp_path / "sh"), "-s"], input=check_script().encode(),
                          capture_output=True, env={"PATH": path}, check=False)
    out = proc.stdout.decode()
    lines = out.splitlines()
    if nvcc:
        assert proc.returncode == 0, out
        assert lines[0] == "SMI-GPUS 0" and lines[1].startswith("RUNNER nvcc ")
        assert not any(line.startswith(("OK", "FAIL")) for line in lines)
    else:
        assert proc.returncode == 3, out
        assert lines == ["SMI-GPUS 0", "no CUDA compiler (nvcc) and no PyTorch with CUDA: "
                         "cannot run a computation"]


def test_parse_check_reads_a_good_run_and_a_missing_gpu() -> None:
    out = "SMI-GPUS 2\nRUNNER nvcc 12.8\nOK GPU 0 H100: ok\nOK GPU 1 H100: ok\n"
    row = parse_check(out, 0, 2)
    assert row["ok"] and row["nvidia_smi_gpus"] == 2 and row["runner"] == "nvcc 12.8"
    assert row["error"] == "" and len(row["results"]) == 2
    row = parse_check(out.replace("SMI-GPUS 2", "SMI-GPUS 1"), 0, 2)
    assert not row["ok"] and row["nvidia_smi_gpus"] == 1 and "OK GPU 1" in row["error"]
