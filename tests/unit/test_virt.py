"""`virt` without systemd (the real H200 host has no systemd-detect-virt): the System probe's
virtualisation lines run in sh over real captures laid out as a root file system
(tests/fixtures/real/firecracker-vm: a Firecracker VM booted from a container image, the kind
the H200 host is) and the H200's own `nvidia-smi -q`. Strong evidence first: an empty
/.dockerenv used to win over the hypervisor flag, the kernel command line and the GPU's
"Virtualization Mode: Pass-Through"."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpuk8s.facts.system import System, virt_script

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIRECRACKER = FIXTURES / "real" / "firecracker-vm"
NVIDIA_SMI_Q = FIXTURES / "nvidia" / "h200-ubuntu2404" / "nvidia-smi-q.txt"
#: the root line of /proc/self/mountinfo in a docker container (overlay2 storage driver) and
#: in a Kubernetes pod (containerd's overlayfs snapshotter), as the kernel prints them
DOCKER_ROOT = ("1391 1166 0:282 / / rw,relatime master:596 - overlay overlay rw,lowerdir="
               "/var/lib/docker/overlay2/l/QK3V7Z5Y:/var/lib/docker/overlay2/l/OSC3P2T4,upperdir="
               "/var/lib/docker/overlay2/5f1c0e/diff,workdir=/var/lib/docker/overlay2/5f1c0e/work\n")
POD_ROOT = ("3015 2833 0:598 / / rw,relatime master:1049 - overlay overlay rw,lowerdir=/var/lib/"
            "containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/812/fs,upperdir=/var/lib/"
            "containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/901/fs,workdir=/var/lib/"
            "containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/901/work\n")


def _root(tmp_path: Path, *, cpu_flag: bool = True, cmdline: bool = True,
          mountinfo: str | None = None, dockerenv: bool = True,
          environ: bytes | None = None) -> Path:
    """The Firecracker capture, copied, with parts taken away or replaced."""
    root = tmp_path / "root"
    root.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(FIRECRACKER, root)
    cpuinfo = root / "proc" / "cpuinfo"
    if not cpu_flag:
        cpuinfo.write_text(cpuinfo.read_text().replace(" hypervisor", ""))
    if not cmdline:
        (root / "proc" / "cmdline").write_text("BOOT_IMAGE=/vmlinuz-6.8.0-51-generic "
                                               "root=/dev/sda1 ro quiet splash\n")
    if mountinfo is not None:
        (root / "proc" / "self" / "mountinfo").write_text(mountinfo)
    if not dockerenv:
        (root / ".dockerenv").unlink()
    if environ is not None:
        (root / "proc" / "1").mkdir()
        (root / "proc" / "1" / "environ").write_bytes(environ)
    return root


def _bin(tmp_path: Path, *, nvidia: bool = True, detect_virt: tuple[str, str] | None = None
         ) -> Path:
    """A PATH with the tools the lines use, the H200's nvidia-smi -q, and no
    systemd-detect-virt unless ``detect_virt`` = (its answer, its --vm answer)."""
    folder = tmp_path / "bin"
    folder.mkdir(parents=True)
    for tool in ("sh", "grep", "awk", "cat", "sed", "head", "tr"):
        (folder / tool).symlink_to(shutil.which(tool) or f"/bin/{tool}")
    if nvidia:
        (folder / "nvidia-smi").write_text(
            f'#!/bin/sh\n[ "$1" = -q ] && exec cat {NVIDIA_SMI_Q}\nexit 9\n')
        (folder / "nvidia-smi").chmod(0o755)
    if detect_virt:
        answer, vm = detect_virt
        (folder / "systemd-detect-virt").write_text(
            f'#!/bin/sh\n[ "$1" = --vm ] && {{ echo {vm}; exit 0; }}\necho {answer}\n')
        (folder / "systemd-detect-virt").chmod(0o755)
    return folder


def _virt(root: Path, path: Path) -> tuple[str, str, str, bool]:
    out = subprocess.run([str(path / "sh"), "-c", virt_script(str(root))], capture_output=True,
                         text=True, env={"PATH": str(path)}, check=False, timeout=30)
    assert out.returncode == 0 and not out.stderr, out.stderr
    info = System().parse(out.stdout, 0)
    return info.virt, info.virt_source, info.virt_evidence, info.hypervisor


def test_the_h200_hosts_kind_of_vm_reads_as_a_vm_not_docker(tmp_path: Path) -> None:
    virt, source, evidence, flag = _virt(_root(tmp_path), _bin(tmp_path))
    assert (virt, source, flag) == ("vm", "guessed", True)
    assert evidence == ("the CPU's hypervisor flag, a microVM's kernel command line; "
                        "/.dockerenv ignored: no container runtime set up this root file "
                        "system (a VM booted from a container image has the file too)")


def test_a_gpu_passed_through_is_a_vm_on_its_own(tmp_path: Path) -> None:
    """The H200's nvidia-smi -q says "Virtualization Mode : Pass-Through": the GPU is a
    VM's, whatever the CPU flags and the command line say."""
    root = _root(tmp_path, cpu_flag=False, cmdline=False)
    virt, _, evidence, flag = _virt(root, _bin(tmp_path))
    assert (virt, flag) == ("vm", False)
    assert evidence.startswith("nvidia-smi's Virtualization Mode Pass-Through; /.dockerenv "
                               "ignored")
    # without it, a lone /.dockerenv is all there is, and says so
    virt, _, evidence, _ = _virt(root, _bin(tmp_path / "b", nvidia=False))
    assert (virt, evidence) == ("docker", "/.dockerenv alone (nothing else tells)")


@pytest.mark.parametrize(("mountinfo", "dockerenv", "want"), [
    (DOCKER_ROOT, True, "docker"), (POD_ROOT, False, "container-other")])
def test_a_container_on_a_vm_is_still_a_container(tmp_path: Path, mountinfo: str,
                                                   dockerenv: bool, want: str) -> None:
    """A docker container, or a pod, on a cloud VM: the CPU's hypervisor flag, the host's
    command line and its GPU are all there too; the root file system is a runtime's
    snapshot, which a VM's is not."""
    root = _root(tmp_path, mountinfo=mountinfo, dockerenv=dockerenv)
    virt, _, evidence, flag = _virt(root, _bin(tmp_path))
    assert (virt, flag, evidence) == (want, True, "the root file system is a container "
                                                  "runtime's snapshot")


def test_pid_1s_container_variable_names_the_container(tmp_path: Path) -> None:
    root = _root(tmp_path, environ=b"PATH=/usr/bin\0container=systemd-nspawn\0TERM=vt220\0")
    assert _virt(root, _bin(tmp_path))[:3] == (
        "systemd-nspawn", "guessed", "PID 1's environment has container=systemd-nspawn")


def test_systemd_detect_virts_docker_from_dockerenv_alone_is_checked(tmp_path: Path) -> None:
    """systemd-detect-virt takes /.dockerenv alone as docker too (it says so on gpuk8s's own
    Firecracker build machine): its VM answer is taken where no runtime set up the root."""
    virt, source, evidence, _ = _virt(_root(tmp_path), _bin(tmp_path, detect_virt=("docker",
                                                                                     "kvm")))
    assert (virt, source) == ("kvm", "systemd-detect-virt")
    assert evidence.startswith("systemd-detect-virt --vm; /.dockerenv ignored")
    inside = _root(tmp_path / "c", mountinfo=DOCKER_ROOT)
    assert _virt(inside, _bin(tmp_path / "c", detect_virt=("docker", "kvm")))[:3] == (
        "docker", "systemd-detect-virt", "")
    bare = _bin(tmp_path / "d", detect_virt=("docker", "none"))
    assert _virt(_root(tmp_path / "d"), bare)[0] == "docker"


def test_the_probe_reads_the_hosts_own_files() -> None:
    """The System probe runs the same lines on / (no root folder in them)."""
    assert virt_script() in System().command()
    assert " /proc/cmdline" in virt_script() and "[ -e /.dockerenv ]" in virt_script()


def test_preflight_names_the_h200_host_a_vm_without_an_init() -> None:
    from tests.unit.test_truthful_preflight import SANDBOX, context, problems

    found = problems(context(**{**SANDBOX, "virt": "vm", "hypervisor": True}))
    assert found["init"] == ("no systemd (PID 1 is process_api): gpuk8s needs a systemd host; "
                             "this looks like a VM started without an init system")


H200_SESSION = FIXTURES / "real" / "h200-ubuntu2404" / "session-2026-11-28"


def test_the_h200_hosts_own_kernel_command_line_is_a_microvms(tmp_path: Path) -> None:
    """The command line captured on the H200 host itself (2026-11-28), with the hypervisor
    flag taken away so that the command line alone decides."""
    root = _root(tmp_path, cpu_flag=False)
    (root / "proc" / "cmdline").write_text((H200_SESSION / "proc-cmdline.txt").read_text())
    virt, _source, evidence, flag = _virt(root, _bin(tmp_path, nvidia=False))
    assert (virt, flag) == ("vm", False)
    assert evidence.startswith("a microVM's kernel command line;"), evidence


def test_the_h200_sessions_facts_check_and_plan_agree() -> None:
    """What the bundle printed on the H200 host (2026-11-28): facts read a VM, and check
    refuses the loopback endpoint with the same text plan's preflight gives."""
    facts = (H200_SESSION / "facts.txt").read_text()
    assert "  virt               vm (guessed" in facts and "virt               docker" not in facts
    check, plan = ((H200_SESSION / name).read_text() for name in ("check.txt", "plan.txt"))
    endpoint = ("the control plane's address is localhost, so the API endpoint would be "
                "localhost:6443: loopback")
    assert endpoint in check and endpoint in plan
    assert check.rstrip().endswith("(exit code 1)") and plan.rstrip().endswith("(exit code 3)")
