"""The node GPU check script: its CUDA source compiles in shape, nvcc builds for the GPU's own
architecture and the times are read back, the PyTorch fallback asks each interpreter in turn, and
the row logic fails loudly on a host where nvidia-smi misses a GPU or no computation can run. The
node's tools are fakes (small sh scripts named nvcc, nvidia-smi, python3 in tmp_path)."""

from __future__ import annotations

import glob
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuk8s import gpucheck
from gpuk8s.errors import Gpuk8sError
from gpuk8s.facts import HostFacts
from gpuk8s.facts.nvidia import Gpu, Nvidia, NvidiaState
from gpuk8s.facts.system import PciDevice, PciDevices
from gpuk8s.gpucheck import check_script, computation, parse_check
from gpuk8s.gpucheck_script import local_pythons
from gpuk8s.redact import Redactor
from gpuk8s.report import Reporter
from gpuk8s.session import Session
from gpuk8s.sinks import shell
from gpuk8s.transport import CommandResult, ConnectSpec, Counters
from tests.unit.fakes import sectioned


def test_script_is_valid_sh_and_carries_the_cuda_source() -> None:
    script = check_script()
    assert "__global__ void vecadd" in script and "RUNNER nvcc" in script
    proc = subprocess.run(["sh", "-n"], input=script.encode(), capture_output=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr


def test_without_nvidia_smi_the_check_finds_no_gpu(tmp_path: Path) -> None:
    """No nvidia-smi and no python3: where this machine has nvcc (the CUDA image does), the
    CUDA source must compile and nothing runs; without nvcc the check says it cannot run."""
    for tool in ("sh", "mktemp", "rm", "grep", "ls", "head", "sed", "cat", "tail", "date"):
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
        assert lines[0] == "SMI-GPUS 0" and lines[1] == "PYTHON python3: not on PATH"
        assert lines[-1] == "no CUDA compiler (nvcc) and no PyTorch with CUDA: cannot run a " \
            "computation"


def test_parse_check_reads_a_good_run_and_a_missing_gpu() -> None:
    out = "SMI-GPUS 2\nRUNNER nvcc 12.8\nOK GPU 0 H100: ok\nOK GPU 1 H100: ok\n"
    row = parse_check(out, 0, 2)
    assert row["ok"] and row["nvidia_smi_gpus"] == 2 and row["runner"] == "nvcc 12.8"
    assert row["error"] == "" and len(row["results"]) == 2
    row = parse_check(out.replace("SMI-GPUS 2", "SMI-GPUS 1"), 0, 2)
    assert not row["ok"] and row["nvidia_smi_gpus"] == 1 and "OK GPU 1" in row["error"]



# -- fakes of the node's tools ------------------------------------------------------------------
def _exe(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _node(tmp_path: Path, *, nvcc: str | None = None, caps: str = "9.0\n9.0\n",
          gpus: int = 2, refuse_native: bool = False) -> Path:
    """A bin/ folder with nvidia-smi (``gpus`` GPUs of compute capability ``caps``) and, given
    a release such as "13.0", an nvcc that logs its arguments to tmp_path/nvcc.args and writes
    a vecadd that prints what the real one prints."""
    bin_ = tmp_path / "bin"
    listing = "".join(f"echo 'GPU {i}: NVIDIA H200 (UUID: GPU-{i})'\n" for i in range(gpus))
    _exe(bin_ / "nvidia-smi", f"case \"$*\" in\n*-L*)\n{listing};;\n"
         f"*compute_cap*) printf '{caps}';;\nesac\n")
    if nvcc:
        refuse = ('case "$*" in *-arch=native*) echo "nvcc fatal   : Value \'native\' is not '
                  'defined for option \'gpu-architecture\'"; exit 1;; esac\n'
                  if refuse_native else "")
        _exe(bin_ / "nvcc", f"""if [ "$1" = --version ]; then
  echo "Cuda compilation tools, release {nvcc}, V{nvcc}.88"; exit 0; fi
echo "$*" >> {tmp_path / "nvcc.args"}
{refuse}out=""; prev=""; for a; do [ "$prev" = -o ] && out=$a; prev=$a; done
cat > "$out" <<'FAKE_END'
#!/bin/sh
echo "OK GPU $1 NVIDIA H200 (PCI 0000:00:06.0, sm_90): vecadd of 16777216 floats: 0 wrong"
echo "TIMING GPU $1 kernel_ms=0.171 first_launch_ms=0.9$1"
FAKE_END
chmod +x "$out"
""")
    return bin_


def _run(script: str, bin_: Path) -> tuple[int, str]:
    """The check as a node runs it: sh reading the script, PATH the fakes then the system's."""
    proc = subprocess.run(["sh", "-s"], input=script.encode(), capture_output=True,
                          env={"PATH": f"{bin_}:/usr/bin:/bin"}, check=False, timeout=60)
    return proc.returncode, proc.stdout.decode()


def _nvcc_builds(tmp_path: Path) -> list[str]:
    """The flags of each build nvcc was asked for (the arguments before -o)."""
    calls = (tmp_path / "nvcc.args").read_text().splitlines()
    return [" ".join(c.split(" -o ")[0].split()[1:]) for c in calls]


# -- nvcc: the architecture, the times -----------------------------------------------------------
@pytest.mark.parametrize(("release", "flags"), [
    ("13.0", "-arch=native"), ("12.8", "-arch=native"), ("11.6", "-arch=native"),
    ("11.5", "-arch=sm_90"), ("10.2", "-arch=sm_90")])
def test_arch_native_from_nvcc_11_6_else_the_compute_capability(
        tmp_path: Path, release: str, flags: str) -> None:
    rc, out = _run(check_script(nvcc_fallbacks=()), _node(tmp_path, nvcc=release))
    assert rc == 0, out
    assert _nvcc_builds(tmp_path) == [flags]
    assert f"RUNNER nvcc {release}" in out and f"ARCH {flags}" in out.splitlines()


def test_arch_from_the_facts_before_nvidia_smi_and_one_gencode_per_capability(
        tmp_path: Path) -> None:
    bin_ = _node(tmp_path, nvcc="11.4", caps="9.0\n")
    rc, out = _run(check_script(["8.0", "9.0", "8.0"], nvcc_fallbacks=()), bin_)
    assert rc == 0, out
    assert _nvcc_builds(tmp_path) == [
        "-gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90"]
    (tmp_path / "nvcc.args").unlink()
    rc, out = _run(check_script(["12.0"], nvcc_fallbacks=()), bin_)
    assert rc == 0, out
    assert _nvcc_builds(tmp_path) == ["-arch=sm_120"]


def test_malformed_capabilities_never_reach_nvcc(tmp_path: Path) -> None:
    """The facts' compute capabilities are node output: only N.N passes; nvidia-smi's too."""
    bin_ = _node(tmp_path, nvcc="11.4", caps="9.0;touch pwned\\n$(touch pwned)\\n")
    rc, out = _run(check_script(["'; touch pwned; '", "9.0 9.0", "x.y"], nvcc_fallbacks=()),
                   bin_)
    assert rc == 0, out
    assert _nvcc_builds(tmp_path) == [""] and "ARCH default" in out.splitlines()
    assert not list(tmp_path.rglob("pwned")) and not Path("pwned").exists()


def test_old_nvcc_without_a_known_capability_builds_for_its_default(tmp_path: Path) -> None:
    rc, out = _run(check_script(nvcc_fallbacks=()), _node(tmp_path, nvcc="11.4", caps=""))
    assert rc == 0, out
    assert _nvcc_builds(tmp_path) == [""]
    row = parse_check(out, rc, 2)
    assert row["ok"] and row["arch"] == "default"


def test_nvcc_refusing_native_falls_back_to_the_compute_capability(tmp_path: Path) -> None:
    bin_ = _node(tmp_path, nvcc="12.8", refuse_native=True)
    rc, out = _run(check_script(nvcc_fallbacks=()), bin_)
    assert rc == 0, out
    assert _nvcc_builds(tmp_path) == ["-arch=native", "-arch=sm_90"]
    assert "nvcc -arch=native not used:" in out and "ARCH -arch=sm_90" in out.splitlines()


def test_compile_and_kernel_times_read_from_the_run(tmp_path: Path) -> None:
    rc, out = _run(check_script(nvcc_fallbacks=()), _node(tmp_path, nvcc="13.0"))
    row = parse_check(out, rc, 2)
    assert row["ok"], row
    assert row["runner"] == "nvcc 13.0" and row["arch"] == "-arch=native"
    assert isinstance(row["compile_ms"], float) and row["compile_ms"] >= 0
    assert row["timings"] == [{"gpu": 0, "kernel_ms": 0.171, "first_launch_ms": 0.90},
                              {"gpu": 1, "kernel_ms": 0.171, "first_launch_ms": 0.91}]
    cell = computation(row)
    assert cell.startswith("nvcc 13.0, -arch=native, compile ")
    assert "  kernel 0.171 ms, first launch 0.910 ms" in cell.splitlines()


def test_parse_check_timing_lines() -> None:
    out = ("SMI-GPUS 1\nRUNNER nvcc 13.0\nARCH -arch=native\nCOMPILE-MS 1712\n"
           "OK GPU 0 NVIDIA H200 (PCI 0000:00:06.0, sm_90): vecadd of 16777216 floats: 0 wrong\n"
           "TIMING GPU 0 kernel_ms=0.170 first_launch_ms=1.234\n"
           "TIMING GPU 1 kernel_ms=nan first_launch_ms=1\nCOMPILE-MS 9e99\n")
    row = parse_check(out, 0, 1)
    assert row["ok"] and row["compile_ms"] == 1712.0 and row["arch"] == "-arch=native"
    assert row["timings"] == [{"gpu": 0, "kernel_ms": 0.17, "first_launch_ms": 1.234}]
    assert computation(row).splitlines() == [
        "nvcc 13.0, -arch=native, compile 1712 ms",
        "OK GPU 0 NVIDIA H200 (PCI 0000:00:06.0, sm_90): vecadd of 16777216 floats: 0 wrong",
        "  kernel 0.170 ms, first launch 1.234 ms"]
    # an older program (no TIMING line, time in the result) still reads as a good run
    old = parse_check("SMI-GPUS 1\nRUNNER nvcc 13.0\nOK GPU 0 H200: 0 wrong, 102.201 ms\n", 0, 1)
    assert old["ok"] and old["timings"] == [] and old["compile_ms"] is None


# -- the PyTorch fallback: interpreters in turn ---------------------------------------------------
FAKE_TORCH = {
    "none": None,
    "cpu": "__version__ = '2.5.0'\nclass version:\n    cuda = None\n",
    "nodriver": ("__version__ = '2.9.0+cu128'\nclass version:\n    cuda = '12.8'\n"
                 "class cuda:\n    is_available = staticmethod(lambda: False)\n"
                 "    @staticmethod\n    def init():\n        raise RuntimeError(\n"
                 "            'Found no NVIDIA driver on your system.\\n Please check.')\n"),
}


def _python(tmp_path: Path, name: str, torch: str) -> Path:
    """An interpreter: this Python (without site-packages) seeing only the fake torch
    ``torch`` of FAKE_TORCH, so the real probe prints what it would on such a node."""
    lib = tmp_path / "lib" / name
    lib.mkdir(parents=True)
    source = FAKE_TORCH[torch]
    if source is not None:
        (lib / "torch").mkdir()
        (lib / "torch" / "__init__.py").write_text(source)
    return _exe(tmp_path / name / "python3",
                f'PYTHONPATH={lib} exec {sys.executable} -S "$@"\n')


def _good_python(tmp_path: Path, name: str) -> Path:
    """An interpreter with PyTorch and CUDA (canned: the probe's line, then the vecadd's)."""
    return _exe(tmp_path / name / "python3", """case "$1" in
*torch_probe.py) echo "torch 2.9.0+cu128 (CUDA 12.8)";;
*torch_vecadd.py) echo "OK GPU 0 NVIDIA H200: vecadd of 16777216 floats: 0 wrong"
  echo "TIMING GPU 0 kernel_ms=0.200 first_launch_ms=3.500";;
*) exit 9;;
esac
""")


def test_fallback_tries_interpreters_in_order_until_one_has_torch_with_cuda(
        tmp_path: Path) -> None:
    venv = _python(tmp_path, "venv", "none")
    cpu = _python(tmp_path, "cpu", "cpu")
    nodriver = _python(tmp_path, "nodriver", "nodriver")
    good = _good_python(tmp_path, "system")
    after = _good_python(tmp_path, "never")
    bin_ = _node(tmp_path, gpus=1)
    pythons = [str(venv), str(tmp_path / "missing" / "python3"), str(cpu), str(venv),
               str(nodriver), str(good), str(after)]
    rc, out = _run(check_script(pythons=pythons, nvcc_fallbacks=()), bin_)
    assert rc == 0, out
    assert [x for x in out.splitlines() if x.startswith(("PYTHON", "RUNNER"))] == [
        f"PYTHON {venv}: ModuleNotFoundError: torch",
        f"PYTHON {tmp_path}/missing/python3: not found",
        f"PYTHON {cpu}: torch 2.5.0 built without CUDA",
        f"PYTHON {nodriver}: torch.cuda.is_available() is False: Found no NVIDIA driver on "
        "your system. Please check.",
        f"PYTHON {good}: torch 2.9.0+cu128 (CUDA 12.8)",
        f"RUNNER torch 2.9.0+cu128 (CUDA 12.8) with {good}"]
    row = parse_check(out, rc, 1)
    assert row["ok"] and row["timings"][0]["kernel_ms"] == 0.2
    cell = computation(row).splitlines()
    assert cell[0] == f"torch 2.9.0+cu128 (CUDA 12.8) with {good}"
    assert cell[1] == f"tried {venv}: ModuleNotFoundError: torch"
    assert "  kernel 0.200 ms, first launch 3.500 ms" in cell


def test_fallback_python3_on_path_and_nvcc_left_out(tmp_path: Path) -> None:
    """A bare name is looked up on the node's PATH; nvcc=False skips even a present nvcc."""
    bin_ = _node(tmp_path, nvcc="13.0", gpus=1)
    good = _good_python(tmp_path, "bin")
    rc, out = _run(check_script(pythons=["python3", "pythonX"], nvcc=False), bin_)
    assert rc == 0, out
    assert f"PYTHON {good}: torch 2.9.0+cu128 (CUDA 12.8)" in out.splitlines()
    assert "pythonX" not in out  # the first one worked
    assert not (tmp_path / "nvcc.args").exists() and "RUNNER nvcc" not in out


def test_no_interpreter_with_torch_names_each_and_the_fix(tmp_path: Path) -> None:
    venv = _python(tmp_path, "venv", "none")
    cpu = _python(tmp_path, "cpu", "cpu")
    rc, out = _run(check_script(pythons=[str(venv), str(cpu), "python3-nowhere"],
                                nvcc_fallbacks=()), _node(tmp_path, gpus=1))
    assert rc == 3, out
    row = parse_check(out, rc, 1, cuda_version="13.0")
    assert not row["ok"]
    assert row["pythons"] == [
        {"path": str(venv), "status": "ModuleNotFoundError: torch"},
        {"path": str(cpu), "status": "torch 2.5.0 built without CUDA"},
        {"path": "python3-nowhere", "status": "not on PATH"}]
    assert row["error"] == (
        "no CUDA compiler (nvcc) and no PyTorch with CUDA. Python interpreters tried: "
        f"{venv}: ModuleNotFoundError: torch; {cpu}: torch 2.5.0 built without CUDA; "
        "python3-nowhere: not on PATH. Fix: install nvcc (apt-get install cuda-nvcc-13-0, "
        "from NVIDIA's CUDA repository), or PyTorch with CUDA for one of these interpreters "
        "(or name one that has it: --python PATH)")
    assert row["cause"] == "no nvcc and no PyTorch with CUDA"
    assert "cuda-nvcc-<major>-<minor>" in parse_check(out, rc, 1)["error"]


def test_an_interpreter_path_is_one_shell_word(tmp_path: Path) -> None:
    odd = tmp_path / "we ird $(touch pwned) 'q'" / "python3"
    _good_python(tmp_path, odd.parent.name)
    rc, out = _run(check_script(pythons=[str(odd)], nvcc_fallbacks=()), _node(tmp_path, gpus=1))
    assert rc == 0, out
    assert f"RUNNER torch 2.9.0+cu128 (CUDA 12.8) with {odd}" in out.splitlines()
    assert not list(tmp_path.rglob("pwned")) and not Path("pwned").exists()


def test_local_interpreters_current_first_then_path_then_system_then_base(
        tmp_path: Path) -> None:
    assert local_pythons("/srv/gpuk8s/.venv/bin/python", "/usr", "") == (
        "/srv/gpuk8s/.venv/bin/python", "/usr/bin/python3", "/usr/local/bin/python3")
    assert local_pythons("/srv/.venv/bin/python", "/opt/py3.12", "") == (
        "/srv/.venv/bin/python", "/usr/bin/python3", "/usr/local/bin/python3",
        "/opt/py3.12/bin/python3")
    # the real H200 host: PyTorch with CUDA lives in /opt/torch/.venv, first on PATH
    torch_bin = tmp_path / "opt/torch/.venv/bin"
    torch_bin.mkdir(parents=True)
    (torch_bin / "python3").write_text("#!/bin/sh\n")
    (torch_bin / "python3").chmod(0o755)
    assert local_pythons("/srv/.venv/bin/python", "/usr", f"{torch_bin}:/nowhere") == (
        "/srv/.venv/bin/python", f"{torch_bin}/python3", "/usr/bin/python3",
        "/usr/local/bin/python3")
    assert local_pythons()[0] == sys.executable


# -- verify_local: what goes to the host, what comes back -----------------------------------------
class _Host:
    """A transport that keeps the script it is sent and answers with the check's lines."""

    def __init__(self, name: str, output: str, rc: int) -> None:
        self.name, self.output, self.rc = name, output, rc
        self.counters = Counters()
        self.scripts: list[str] = []

    def run(self, script: str, *, timeout: float | None = None) -> CommandResult:
        self.scripts.append(script)
        return sectioned(script, self.output, self.rc)

    def close(self) -> None:
        return None


def _verify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inventory: str, output: str,
            rc: int = 0, python: str | None = None
            ) -> tuple[list[_Host], str, list[dict[str, object]] | Exception]:
    monkeypatch.setenv("GPUK8S_RUNS_DIR", str(tmp_path / "runs"))
    tmp_path.mkdir(parents=True, exist_ok=True)
    inv = tmp_path / "hosts.yaml"
    inv.write_text(inventory)
    gpu = Gpu(0, "NVIDIA H200", "GPU-0", "580.159.04", 143771, "00000000:00:06.0", "9.0")

    def gather(session: Session, hosts: list[str]) -> None:
        for h in hosts:
            session.facts[h] = HostFacts(h, {
                PciDevices(): (PciDevice("0000:00:06.0", "0x10de", "0x2335", "0x030200"),),
                Nvidia(): NvidiaState(True, (gpu,), cuda_version="13.0")})

    monkeypatch.setattr(gpucheck, "gather", gather)
    hosts: list[_Host] = []

    def opener(spec: ConnectSpec, redact: Redactor) -> _Host:
        hosts.append(_Host(spec.name, output, rc))
        return hosts[-1]

    buf = io.StringIO()
    rep = Reporter(buf)
    rep.console.width = 300
    try:
        result: list[dict[str, object]] | Exception = gpucheck.verify_local(
            inv, reporter=rep, opener=opener, python=python)
    except Gpuk8sError as exc:
        result = exc
    return hosts, buf.getvalue(), result


ROOT = Path(__file__).resolve().parents[2]
LOCAL = (ROOT / "inventories" / "local.yaml").read_text()


def test_verify_local_here_asks_this_interpreter_first_and_builds_for_the_facts_gpu(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = ("SMI-GPUS 1\nRUNNER nvcc 13.0\nARCH -arch=native\nCOMPILE-MS 1712\n"
           "OK GPU 0 NVIDIA H200 (PCI 0000:00:06.0, sm_90): vecadd of 16777216 floats: 0 wrong\n"
           "TIMING GPU 0 kernel_ms=0.171 first_launch_ms=0.912")
    hosts, table, rows = _verify(tmp_path, monkeypatch, LOCAL, out)
    assert isinstance(rows, list) and rows[0]["ok"] and rows[0]["compile_ms"] == 1712.0
    script = hosts[0].scripts[0]
    assert "caps=9.0\n" in script
    assert f"for p in {' '.join(shell(p) for p in local_pythons())}; do" in script
    assert "nvcc 13.0, -arch=native, compile 1712 ms" in table
    assert "kernel 0.171 ms, first launch 0.912 ms" in table


def test_verify_local_without_compute_names_the_interpreters_and_the_package(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = ("SMI-GPUS 1\nPYTHON /srv/.venv/bin/python: ModuleNotFoundError: torch\n"
           "PYTHON /usr/bin/python3: torch 2.5.0 built without CUDA\n"
           "no CUDA compiler (nvcc) and no PyTorch with CUDA: cannot run a computation")
    _, table, err = _verify(tmp_path, monkeypatch, LOCAL, out, rc=3)
    assert isinstance(err, Gpuk8sError) and "GPU check failed on localhost" in str(err)
    flat = " ".join(str(err).split())
    for text in ("/srv/.venv/bin/python: ModuleNotFoundError: torch",
                 "/usr/bin/python3: torch 2.5.0 built without CUDA",
                 "apt-get install cuda-nvcc-13-0"):
        assert text in flat, text
    # the table's cell: the cause in a few words, not the output again
    assert "FAILED" in table and "no nvcc and no PyTorch with CUDA" in table
    assert "ModuleNotFoundError" not in table and "apt-get" not in table
    (log,) = (tmp_path / "runs").glob("*/localhost.log")
    assert f"(the check's whole output: {log})" in str(err)
    assert "PYTHON /usr/bin/python3: torch 2.5.0 built without CUDA" in log.read_text()


# -- --without-nvcc and --python ----------------------------------------------------------------
def test_without_nvcc_the_failure_never_says_nvcc_is_missing(tmp_path: Path) -> None:
    """The real H200 host has nvcc; with --without-nvcc and no PyTorch the error said "no CUDA
    compiler (nvcc)" and told to install it."""
    venv = _python(tmp_path, "venv", "none")
    bin_ = _node(tmp_path, nvcc="13.0", gpus=1)
    rc, out = _run(check_script(pythons=[str(venv)], nvcc=False), bin_)
    assert rc == 3, out
    assert out.splitlines()[-1] == ("nvcc left out (--without-nvcc) and no PyTorch with CUDA: "
                                    "cannot run a computation")
    row = parse_check(out, rc, 1, cuda_version="13.0")
    assert not row["ok"] and row["cause"] == ("nvcc left out (--without-nvcc) and no PyTorch "
                                              "with CUDA")
    assert row["error"] == (
        "nvcc left out (--without-nvcc) and no PyTorch with CUDA. Python interpreters tried: "
        f"{venv}: ModuleNotFoundError: torch. Fix: install PyTorch with CUDA for one of these "
        "interpreters, or name one that has it (--python PATH); or run without --without-nvcc")
    assert "no CUDA compiler" not in out + row["error"] and "apt-get" not in row["error"]


def test_python_names_the_one_interpreter_the_pytorch_path_uses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = _good_python(tmp_path, "torch")
    out = ("SMI-GPUS 1\nRUNNER torch 2.9.0+cu128 (CUDA 12.8) with x\n"
           "OK GPU 0 NVIDIA H200: vecadd of 16777216 floats: 0 wrong\n")
    monkeypatch.setattr(gpucheck, "local_pythons", lambda: pytest.fail("not asked"))
    hosts, _, rows = _verify(tmp_path, monkeypatch, LOCAL, out, python=str(good))
    assert isinstance(rows, list) and rows[0]["ok"]
    assert f"for p in {shell(str(good))}; do" in hosts[0].scripts[0]
    # over SSH the path is the node's, passed as it is
    ssh = ("all:\n  children:\n    control_plane:\n      hosts:\n"
           "        gpu-01: {ansible_host: 10.0.0.21}\n")
    hosts, _, rows = _verify(tmp_path / "ssh", monkeypatch, ssh, out, python="/opt/py/bin/python3")
    assert "for p in /opt/py/bin/python3; do" in hosts[0].scripts[0]
    # on this machine, a path that is not there is refused before the check runs
    hosts, _, err = _verify(tmp_path / "none", monkeypatch, LOCAL, out, python="/nowhere/py3")
    assert isinstance(err, Gpuk8sError) and not hosts[0].scripts
    assert str(err) == ("--python /nowhere/py3: no such executable on this machine; give the "
                        "path of a Python interpreter with PyTorch and CUDA, e.g. --python "
                        "/opt/torch/.venv/bin/python3")
    assert gpucheck.main(["--python", ""]) == 1


def test_python_option_reaches_verify_local_from_invoke_and_main(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import invoke

    from gpuk8s import cli

    got: list[dict[str, object]] = []
    def fake(inventory: str, **kw: object) -> list[object]:
        got.append(kw)
        return []

    monkeypatch.setattr(gpucheck, "verify_local", fake)
    monkeypatch.setitem(cli.COMMANDS, "verify_local", gpucheck.verify_local)
    assert gpucheck.main(["--python", "/opt/torch/.venv/bin/python3", "--without-nvcc"]) == 0
    cli.verify(invoke.Context(), local=True, python="/opt/t/bin/python3", without_nvcc=True)
    assert got == [{"limit": None, "nvcc": False, "python": "/opt/torch/.venv/bin/python3"},
                   {"limit": None, "python": "/opt/t/bin/python3", "nvcc": False}]
    with pytest.raises(invoke.Exit, match="add --local"):
        cli.verify(invoke.Context(), python="/opt/t/bin/python3")


# -- the PyTorch timing: the kernel, as nvcc's ---------------------------------------------------
FAKE_TIMING_TORCH = '''
"""A torch that records what torch_vecadd.py does, in order, to the log (no data)."""
import os
LOG = []
float32 = "float32"


def _log(what):
    LOG.append(what)
    with open(os.environ["FAKE_TORCH_LOG"], "a") as fh:
        fh.write(what + "\\n")


class Tensor:
    def __init__(self, what="t"):
        self.what = what
    def __mod__(self, other): return Tensor()
    def __rmul__(self, other): return Tensor()
    def __add__(self, other):
        _log("alloc: a + b")
        return Tensor()
    def __ne__(self, other): return Tensor()
    def to(self, dev): return Tensor()
    def cpu(self): return Tensor()
    def sum(self): return 0
    def __int__(self): return 0


def arange(n, dtype=None): return Tensor()


def empty_like(t):
    _log("alloc: empty_like")
    return Tensor()


def add(a, b, out=None):
    _log("add out=c" if out is not None else "alloc: add")
    return out


class _Device:
    def __init__(self, i): self.i = i
    def __enter__(self): _log(f"device {self.i}")
    def __exit__(self, *a): _log("device exit")


class _Event:
    n = 0
    def __init__(self, enable_timing=False):
        _Event.n += 1
        self.n = _Event.n
    def record(self): _log(f"record t{self.n % 2 ^ 1}")
    def synchronize(self): _log("event synchronize")
    def elapsed_time(self, other): return 0.091


class cuda:
    Event = _Event
    device = _Device
    @staticmethod
    def device_count(): return 1
    @staticmethod
    def synchronize(dev=None): _log("synchronize")
    @staticmethod
    def get_device_name(i): return "NVIDIA H200"
'''


def test_the_pytorch_path_times_the_add_kernel_alone(tmp_path: Path) -> None:
    """torch_vecadd.py, run by an interpreter whose torch records each call: between the two
    CUDA events there is one ``torch.add(a, b, out=c)`` and no allocation (``c = a + b``
    allocated 64 MiB inside the timed span: 0.35-0.56 ms on the H200 against nvcc's
    0.07 ms), after a warm-up of the same call, and the end event is waited for."""
    from importlib import resources

    lib = tmp_path / "lib"
    (lib / "torch").mkdir(parents=True)
    (lib / "torch" / "__init__.py").write_text(FAKE_TIMING_TORCH)
    script = tmp_path / "torch_vecadd.py"
    script.write_text(resources.files("gpuk8s").joinpath("data/torch_vecadd.py").read_text())
    log = tmp_path / "calls.log"
    proc = subprocess.run([sys.executable, "-S", str(script)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(lib), "FAKE_TORCH_LOG": str(log)},
                          check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("TIMING GPU 0 kernel_ms=0.091 ")
    calls = log.read_text().splitlines()
    start, end = calls.index("record t0"), calls.index("record t1")
    assert calls[start + 1:end] == ["add out=c"]
    before = calls[:start]
    # the warm-up (waited for), then one add queued ahead and not waited for, so the host's
    # dispatch of the timed add overlaps a running kernel
    assert "alloc: empty_like" in before and before.count("add out=c") == 2
    assert before.index("alloc: empty_like") < before.index("add out=c")
    assert before[before.index("add out=c") + 1] == "synchronize"
    assert before[-1] == "add out=c"
    assert calls[end + 1] == "event synchronize"
    assert not any(c.startswith("alloc: a") or c == "alloc: add" for c in calls[:end + 1])
    assert calls.index("device 0") < start < end < calls.index("device exit")


def test_a_failed_rows_cause_is_short() -> None:
    out = ("SMI-GPUS 2\nRUNNER nvcc 13.0\nOK GPU 0 NVIDIA H200 (PCI 0000:00:06.0, sm_90): "
           "vecadd of 16777216 floats: 0 wrong\nFAIL GPU 1 NVIDIA H200 (PCI 0000:00:07.0, "
           "sm_90): vecadd of 16777216 floats: 12 wrong\n")
    assert parse_check(out, 1, 2)["cause"] == "wrong results on GPU 1"
    assert parse_check("SMI-GPUS 1\n", 0, 2)["cause"] == "nvidia-smi sees 1 of 2 PCI GPUs"
    assert parse_check("SMI-GPUS 2\nRUNNER nvcc 13.0\nnvcc -arch=native not used:\n", 4,
                       2)["cause"] == "nvcc could not build the check"
    assert parse_check("SMI-GPUS x\n", 0, 1)["cause"] == "malformed nvidia-smi count line"
    assert parse_check(out.replace("FAIL", "OK"), 0, 2)["cause"] == ""
