"""Fact parsers against real command outputs (captures from real H200 hosts, in
tests/fixtures/nvidia/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuk8s.facts.kube import Containerd, parse_config_dump
from gpuk8s.facts.nvidia import Nvidia, parse_proc_version, parse_query_csv
from gpuk8s.facts.system import Files, OsRelease, Packages, PciDevices, System

#: real captures, kept in the repository (tests/fixtures/nvidia/README.md says where from)
SHARED = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia"


def fixture(name: str) -> str:
    path = SHARED / name
    assert path.exists(), f"fixture missing: {path}"
    return path.read_text()


def test_query_csv_two_h200() -> None:
    # the fixture holds the csv form (header, units) then the noheader,nounits form
    text = fixture("2xh200-ubuntu2404/query-gpu.csv")
    assert len(parse_query_csv(text)) == 4  # rows of both forms parse; units are stripped
    gpus = parse_query_csv("\n".join(text.splitlines()[-2:]))
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].name == "NVIDIA H200"
    assert gpus[0].memory_mib == 143771
    assert gpus[1].bus_id == "00000000:00:07.0"
    assert gpus[0].driver_version == "580.159.04"
    assert gpus[0].compute_cap == "9.0"


def test_proc_version_open_module() -> None:
    assert parse_proc_version(fixture("h200-ubuntu2404/proc-driver-nvidia-version.txt")) == \
        ("open", "580.159.04")
    text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC"
    assert parse_proc_version(text) == ("proprietary", "535.183.01")
    assert parse_proc_version("") == ("", "")


def test_nvidia_fact_loaded() -> None:
    query = "\n".join(fixture("2xh200-ubuntu2404/query-gpu.csv").splitlines()[-2:])
    header = fixture("h200-ubuntu2404/nvidia-smi.txt").splitlines()[2]
    out = (f"## query\n{query}\n## rc 0\n## header\n{header}\n## proc\n"
           + fixture("h200-ubuntu2404/proc-driver-nvidia-version.txt") + "## nvswitch\n")
    state = Nvidia().parse(out, 0)
    assert state.smi_present and state.exit_code == 0
    assert len(state.gpus) == 2
    assert state.cuda_version == "13.0"
    assert state.module == "open"
    assert state.loaded_version == "580.159.04"


def test_nvidia_fact_not_loaded_and_absent() -> None:
    msg = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
           "Make sure that the latest NVIDIA driver is installed and running.")
    state = Nvidia().parse(f"## query\n{msg}\n## rc 9\n## header\n## proc\n## nvswitch\n", 0)
    assert state.gpus == () and state.exit_code == 9 and "couldn't communicate" in state.error
    absent = Nvidia().parse("## absent\n## proc\n## nvswitch\n", 0)
    assert not absent.smi_present and absent.loaded_version == ""


def test_pci_devices_from_sysfs_listing() -> None:
    lines = [" ".join(line.split()[:4]) for line in
             fixture("2xh200-ubuntu2404/sys-pci-nvidia.txt").splitlines() if line.strip()]
    devices = PciDevices().parse("\n".join(lines), 0)
    gpus = [d for d in devices if d.is_gpu]
    assert len(gpus) == 2
    assert gpus[0].model == "NVIDIA H200"
    switch = PciDevices().parse("0000:05:00.0 0x10de 0x22a3 0x068000", 0)
    assert switch[0].is_nvswitch and not switch[0].is_gpu


def test_os_release() -> None:
    os_ = OsRelease().parse(fixture("h200-ubuntu2404/os-release.txt"), 0)
    assert os_["ID"] == "ubuntu" and os_["VERSION_ID"] == "24.04"


def test_system_fact() -> None:
    out = ("kernel=6.8.0-51-generic\narch=x86_64\nhostname=gpu-01\ncpus=16\nmem_kb=65843212\n"
           "cgroup=cgroup2fs\nproduct_uuid=ABC\nmachine_id=m1\nboot_id=b1\nvirt=none\n"
           "secure_boot=SecureBoot disabled\ntime_synced=yes\nswap=/swap.img \n"
           "swap_fstab=/swap.img \nheaders=1\nlisten=22 53 \nreboot_required=0\n")
    info = System().parse(out, 0)
    assert info.memory_mb == 64300 and info.cpus == 16
    assert info.swap_active == ("/swap.img",) and info.product_uuid == "abc"
    assert info.listening == (22, 53) and info.headers and not info.reboot_required


def test_files_fact_with_content() -> None:
    out = ("F /etc/a 644 root " + "0" * 64 + "\nC /etc/a aGVsbG8K\nN /etc/b\n"
           "F /etc/c 600 root " + "1" * 64 + "\nC /etc/c \n")
    states = Files("+/etc/a", "/etc/b", "+/etc/c").parse(out, 0)
    assert states["/etc/a"].text == "hello\n" and states["/etc/a"].mode == "644"
    assert not states["/etc/b"].exists
    assert states["/etc/c"].content == b""


def test_files_fact_in_a_real_shell(tmp_path: Path) -> None:
    """The command as a probe runs it, in a real sh, over real files: a file whose content
    is read gets its sha256 computed from that content (no sha256sum run for it), mode,
    owner and mtime from one stat; one without gets sha256sum's hash; a missing one is N."""
    import hashlib
    import os
    import subprocess

    shown, hashed = tmp_path / "with content", tmp_path / "hash only"
    shown.write_bytes(b"[plugins]\n\x00binary\n")
    hashed.write_text("secret-ish\n")
    os.chmod(shown, 0o640)
    os.utime(shown, (1_700_000_000, 1_700_000_000))
    fact = Files(f"+{shown}", str(hashed), f"+{tmp_path}/missing")
    run = subprocess.run(["sh", "-c", fact.command()], capture_output=True, text=True,
                         check=True)
    states = fact.parse(run.stdout, run.returncode)
    got = states[str(shown)]
    assert got.content == shown.read_bytes() and got.mode == "640" and got.exists
    assert got.sha256 == hashlib.sha256(shown.read_bytes()).hexdigest()
    assert got.mtime == 1_700_000_000 and got.owner == "root"
    assert states[str(hashed)].sha256 == hashlib.sha256(b"secret-ish\n").hexdigest()
    assert states[str(hashed)].content is None
    assert not states[f"{tmp_path}/missing"].exists
    assert run.stdout.count("\n") == 4  # P and C, F, N: no other lines


def test_packages_fact_hold_state() -> None:
    out = ("kubeadm 1.36.2-1.1 hi  hold ok installed\nkubelet 1.36.2-1.1 ii  install ok "
           "installed\ncurl 7.88 rc  deinstall ok config-files\n")
    pkgs = Packages("kubeadm", "kubelet", "curl").parse(out, 0)
    assert pkgs["kubeadm"].held and not pkgs["kubelet"].held
    assert "curl" not in pkgs


DUMP_V3 = """
version = 3
disabled_plugins = []
[plugins]
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = 'registry.k8s.io/pause:3.10.1'
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      SystemdCgroup = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]
      BinaryName = '/usr/bin/nvidia-container-runtime'
"""


def test_containerd_config_dump_v3() -> None:
    cfg = parse_config_dump(DUMP_V3)
    assert cfg["systemd_cgroup"] is True and cfg["runtimes"] == ("nvidia", "runc")
    state = Containerd().parse("containerd containerd.io v2.1.4 abc\n## dump\n" + DUMP_V3, 0)
    assert state.version == "2.1.4" and not state.cri_disabled
    docker_default = Containerd().parse(
        "containerd github.com/containerd/containerd/v2 v2.1.4 x\n## dump\n"
        'version = 3\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n', 0)
    assert docker_default.cri_disabled


@pytest.mark.parametrize("text", ["", "garbage", "containerd x"])
def test_containerd_absent(text: str) -> None:
    assert Containerd().parse(text, 0).version == ""


def test_nvlink_and_topology_two_h200() -> None:
    from gpuk8s.facts.nvidia import GpuTopology

    out = ("## nvlink\n" + fixture("2xh200-ubuntu2404/nvidia-smi-nvlink-s.txt")
           + "## topo\n" + fixture("2xh200-ubuntu2404/nvidia-smi-topo-m.txt"))
    topo = GpuTopology().parse(out, 0)
    assert topo.nvlinks == {0: 18, 1: 18}
    assert topo.matrix == {"GPU0": {"GPU1": "NV18"}, "GPU1": {"GPU0": "NV18"}}
    single = GpuTopology().parse("## nvlink\n## topo\n"
                                 + fixture("h200-ubuntu2404/nvidia-smi-topo-m.txt"), 0)
    assert single.nvlinks == {} and single.matrix.get("GPU0", {}) == {}
    assert GpuTopology().parse("", 0) == GpuTopology().parse("", 0)


def test_packages_facts_share_one_dpkg_query_and_read_as_each_alone() -> None:
    """In one probe, Packages facts take their lines of one dpkg-query run (this machine's
    real dpkg); each fact's own command, run alone, reads the same."""
    import subprocess

    from gpuk8s.facts.probe import build_probe, parse_probe

    facts = [Packages("ca-certificates", "dpkg"), Packages("no-such-package-here", "dpkg"),
             Packages("coreutils")]
    script, marker = build_probe(facts)  # test_probe_tool_runs counts the runs
    out = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True,
                         check=True).stdout
    probed = parse_probe("here", out, facts, marker)
    for fact in facts:
        alone = subprocess.run(["sh", "-c", fact.command()], capture_output=True, text=True)
        assert probed[fact] == fact.parse(alone.stdout, alone.returncode)
    assert set(probed[facts[0]]) == {"ca-certificates", "dpkg"}
    assert set(probed[facts[1]]) == {"dpkg"} and set(probed[facts[2]]) == {"coreutils"}
    assert probed[facts[0]]["dpkg"].version == subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", "dpkg"], capture_output=True, text=True).stdout
