"""Preflight refuses what bootstrap cannot do (issue 18): a host without systemd, kernel
modules that are neither in the kernel nor loadable, driver headers no package source has, a
loopback control-plane address; and facts that could not be read say "unknown", not a value.

The fact commands run here for real, in this machine's bash, once with every tool they use and
once with ss, systemd-detect-virt, modprobe and apt-cache taken off the PATH (a bare sandbox
like the Firecracker host of the issue)."""

from __future__ import annotations

import dataclasses
import io
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import api, runner
from gpuk8s.errors import PreflightError
from gpuk8s.facts import Fact, HostFacts
from gpuk8s.facts.nvidia import Nvidia, NvidiaState
from gpuk8s.facts.system import KernelModules, PciDevices, System
from gpuk8s.report import Reporter
from gpuk8s.roles import HostContext, load_role
from roles.preflight import role as preflight_role
from tests.unit.scenarios import default_vars, fresh_facts

#: what the H200 sandbox of the issue printed for PID 1 (`cat /proc/1/comm`)
SANDBOX = {"init": "process_api", "systemd": False, "virt": "vm", "virt_source": "guessed",
           "modprobe": False, "modules_dir": False, "listening": None}


def run_here(fact: Fact[Any], path: str | None = None) -> Any:
    env = dict(os.environ, PATH=path or os.environ["PATH"])
    # /bin/sh (dash on Debian and Ubuntu), as the probes run on the nodes
    out = subprocess.run(["/bin/sh", "-c", fact.command()], capture_output=True, text=True,
                         env=env, timeout=60)
    return fact.parse(out.stdout, out.returncode)


def bare_path(tmp_path: Path) -> str:
    """A PATH with the ordinary tools but none of the optional ones the facts fall back from."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in ("cat", "echo", "uname", "hostname", "nproc", "awk", "stat", "od", "tr", "ls",
                 "head", "tail", "grep", "sort", "cut", "printf", "sha256sum", "mokutil",
                 "timedatectl", "dpkg-query", "sed"):
        found = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True,
                               text=True).stdout.strip()
        if found.startswith("/"):
            (folder / tool).symlink_to(found)
    return str(folder)


def test_the_system_fact_on_this_machine_reads_pid_1_and_the_ports() -> None:
    info = run_here(System())
    pid1 = Path("/proc/1/comm").read_text().strip()
    assert info.init == pid1
    assert info.systemd == Path("/run/systemd/system").is_dir()
    assert info.listening is not None and info.virt_source == "systemd-detect-virt"


def test_without_its_tools_the_fact_falls_back_or_says_unknown(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        full = run_here(System())
        bare = run_here(System(), bare_path(tmp_path))
    # virt: guessed from /proc and marker files, never "none" (that is the tool's answer only)
    assert bare.virt_source == "guessed" and bare.virt != "none"
    assert not bare.modprobe
    # the ports: read from /proc/net/tcp without ss; ours is seen both ways
    assert bare.listening is not None and full.listening is not None
    assert port in bare.listening and port in full.listening
    # apt-cache is asked only where an NVIDIA device waits for a driver (the next tests)
    assert bare.headers or bare.headers_candidate in ("unknown", "-")


def fake_pci(tmp_path: Path, *devices: tuple[str, str, str, str]) -> Path:
    """A /sys/bus/pci/devices of (address, vendor, device, class) folders."""
    root = tmp_path / "pci"
    for address, vendor, device, cls in devices:
        d = root / address
        d.mkdir(parents=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", cls)):
            (d / name).write_text(value + "\n")
    return root


def run_with_pci(fact: Fact[Any], pci: Path, path: str | None = None) -> Any:
    """``fact`` with its PCI reads pointed at ``pci``, in /bin/sh, as on a node."""
    command = fact.command().replace("/sys/bus/pci/devices", str(pci))
    assert command != fact.command()
    out = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True,
                         env=dict(os.environ, PATH=path or os.environ["PATH"]), timeout=60)
    return fact.parse(out.stdout, out.returncode)


INTEL = ("0000:00:00.0", "0x8086", "0x1237", "0x060000")
H200 = ("0000:19:00.0", "0x10de", "0x2335", "0x030200")


def test_pci_devices_lists_the_nvidia_functions_of_a_sysfs(tmp_path: Path) -> None:
    switch = ("0000:05:00.0", "0x10de", "0x22a3", "0x068000")
    devices = run_with_pci(PciDevices(), fake_pci(tmp_path, INTEL, switch, H200))
    assert [(d.address, d.device, d.is_gpu, d.is_nvswitch) for d in devices] == [
        ("0000:05:00.0", "0x22a3", False, True), ("0000:19:00.0", "0x2335", True, False)]
    assert run_with_pci(PciDevices(), fake_pci(tmp_path / "none", INTEL)) == ()


@pytest.mark.skipif(Path(f"/lib/modules/{os.uname().release}/build").exists()
                    or Path(f"/usr/src/linux-headers-{os.uname().release}").is_dir()
                    or Path("/proc/driver/nvidia/version").exists(),
                    reason="this machine has its kernel's headers or an NVIDIA driver loaded")
def test_apt_is_asked_for_headers_only_where_an_nvidia_device_waits_for_a_driver(
        tmp_path: Path) -> None:
    """apt-cache policy reads every package list; a node without an NVIDIA device does not
    need its answer, so the probe does not ask (on every probe of every such node)."""
    calls = tmp_path / "calls"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apt-cache").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n"
                                    "echo '  Candidate: 6.8.0-90.91'\n")
    (fake / "apt-cache").chmod(0o755)
    path = f"{fake}:{os.environ['PATH']}"
    cpu = run_with_pci(System(), fake_pci(tmp_path / "cpu", INTEL), path)
    assert cpu.headers_candidate == "-" and not calls.exists()
    gpu = run_with_pci(System(), fake_pci(tmp_path / "gpu", INTEL, H200), path)
    assert gpu.headers_candidate == "6.8.0-90.91"
    assert calls.read_text().split() == ["policy", f"linux-headers-{os.uname().release}"]
    bare = run_with_pci(System(), fake_pci(tmp_path / "bare", H200),
                        bare_path(tmp_path / "bare"))
    assert bare.headers_candidate == "unknown"  # no apt-cache: not "" (no source has them)


def test_kernel_modules_count_what_the_kernel_shows_it_has() -> None:
    here = run_here(KernelModules("overlay", "br_netfilter", "no_such_module_x"))
    filesystems = Path("/proc/filesystems").read_text()
    assert here["overlay"] == ("overlay" in filesystems.split()
                               or Path("/sys/module/overlay").is_dir())
    assert here["br_netfilter"] == (Path("/proc/sys/net/bridge").is_dir()
                                    or Path("/sys/module/br_netfilter").is_dir())
    assert here["no_such_module_x"] is False


def test_system_parse_of_a_sandbox_without_tools() -> None:
    out = ("kernel=6.18.44-fc-v657-gpu\narch=x86_64\nhostname=vm\ncpus=16\nmem_kb=131980000\n"
           "cgroup=cgroup2fs\ninit=process_api\nsystemd=0\nmodprobe=0\nmodules_dir=0\nvirt=vm\n"
           "virt_source=guessed\nheaders=0\nheaders_candidate=\nlisten=unknown\n")
    info = System().parse(out, 0)
    assert (info.init, info.systemd, info.virt, info.virt_source) == \
        ("process_api", False, "vm", "guessed")
    assert info.listening is None and info.headers_candidate == ""
    assert System().parse("kernel=x\nvirt=\n", 0).virt == "unknown"


def context(host: str = "gpu-01", gpus: int = 1, **system: Any) -> HostContext:
    vars = default_vars()
    facts = fresh_facts("ubuntu2404", gpus, host, vars)
    values = dict(facts.items())
    values[System()] = dataclasses.replace(values[System()], **system)
    cluster = {"control_planes": [{"host": "cp-01", "address": "10.0.0.1"}],
               "endpoint_mode": "direct", "advertise_address": "10.0.0.1"}
    return HostContext(host, "preflight", vars, HostFacts(host, values), cluster,
                       ("gpu_workers",))


def problems(ctx: HostContext) -> dict[str, str]:
    errors, _ = preflight_role.check(ctx)
    return {name: message for name, message, _fix in errors}


def test_no_systemd_is_refused_naming_pid_1() -> None:
    found = problems(context(**SANDBOX))
    assert found["init"].startswith("no systemd (PID 1 is process_api): gpuk8s needs a "
                                    "systemd host; this looks like a VM started without an init")
    assert "nouveau" not in found
    in_docker = problems(context(init="sh", systemd=False, virt="docker"))
    assert "this looks like a docker container" in in_docker["init"]
    assert "init" not in problems(context())


def test_modules_neither_built_in_nor_loadable_are_refused() -> None:
    missing = dict.fromkeys(("overlay", "br_netfilter"), False)
    ctx = context(modprobe=False)
    values = dict(ctx.facts.items())
    values[KernelModules("overlay", "br_netfilter")] = missing
    ctx = dataclasses.replace(ctx, facts=HostFacts("gpu-01", values))
    assert "modprobe is not installed" in problems(ctx)["modules"]
    built_in = {**values, KernelModules("overlay", "br_netfilter"): dict.fromkeys(
        ("overlay", "br_netfilter"), True)}
    ctx = dataclasses.replace(ctx, facts=HostFacts("gpu-01", built_in))
    assert "modules" not in problems(ctx)


def test_driver_headers_no_archive_has_are_refused_unless_a_driver_is_loaded() -> None:
    found = problems(context(headers=False, headers_candidate=""))
    assert found["kernel_headers"].startswith("no package source has linux-headers-")
    assert "kernel_headers" not in problems(context(headers=False, headers_candidate="6.8.0-1"))
    assert "kernel_headers" not in problems(context(gpus=0, headers=False, headers_candidate=""))
    ctx = context(headers=False, headers_candidate="")
    values = dict(ctx.facts.items())
    values[Nvidia()] = dataclasses.replace(NvidiaState(True), module_version="580.105.08")
    assert values[Nvidia()].loaded_version == "580.105.08"
    loaded = dataclasses.replace(ctx, facts=HostFacts("gpu-01", values))
    assert "kernel_headers" not in problems(loaded)


def test_a_loopback_control_plane_address_is_refused() -> None:
    ctx = context("cp-01", gpus=0)
    ctx.cluster.update(control_planes=[{"host": "cp-01", "address": "localhost"}],
                       advertise_address="localhost")
    assert "loopback" in problems(ctx)["endpoint"]
    ctx.cluster.update(endpoint_mode="local_lb")
    assert "endpoint" not in problems(ctx)


def test_unknown_ports_are_a_warning_not_a_silent_pass() -> None:
    _, warnings = preflight_role.check(context(listening=None))
    assert any(name == "ports" and "could not read" in msg for name, msg, _ in warnings)


def test_plan_lists_nothing_for_a_host_without_systemd(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """plan normally shows what a fixed host would get; not for a host that cannot be fixed by
    gpuk8s: it stops at the preflight table."""
    from tests.unit.test_max_fail import MINIMAL, FakeTransport

    monkeypatch.setenv("GPUK8S_RUNS_DIR", str(tmp_path / "runs"))
    inv = tmp_path / "hosts.yaml"
    inv.write_text(MINIMAL.replace("absent: true", "absent: false"))
    planned: list[str] = []
    sandbox = context(**SANDBOX)

    def gather(session: Any, hosts: list[str]) -> None:
        for h in hosts:
            session.facts[h] = sandbox.facts

    def preflight(session: Any) -> None:
        raise PreflightError({"gpu-01": [("init", problems(sandbox)["init"], "fix")]})

    for name, fn in {"gather": gather, "cluster_values": lambda s: None,
                     "preflight": preflight,
                     "plan_phase": lambda s, p, h: planned.append(p.name) or {}}.items():
        monkeypatch.setattr(runner, name, fn)
    out = io.StringIO()
    with pytest.raises(PreflightError):
        api.plan(inv, opener=lambda spec, redact: FakeTransport(spec.name),
                 reporter=Reporter(out))
    assert planned == []


def test_cuda_from_nvidias_nvcc_package_is_not_called_a_hand_install() -> None:
    from gpuk8s.facts.nvidia import CudaToolkits
    from gpuk8s.facts.system import Packages, PackageState

    vars = default_vars(cuda_version="13.0")
    values = dict(fresh_facts("ubuntu2404", 1, "gpu-01", vars).items())
    values[CudaToolkits()] = {"13.0": "13.0.88"}
    values[Packages("cuda-nvcc-13-0")] = {"cuda-nvcc-13-0": PackageState("13.0.88-1", False,
                                                                         "ii")}
    ctx = HostContext("gpu-01", "cuda", vars, HostFacts("gpu-01", values), {}, ("gpu_workers",))
    [op] = load_role("cuda").plan(ctx)
    assert op.reason == ("= CUDA 13.0.88 is present (cuda-nvcc-13-0 13.0.88-1 from apt, "
                         "without the cuda-toolkit-13-0 metapackage): left as it is")


def test_a_container_image_on_a_vm_is_named_as_either() -> None:
    """The real H200 sandbox: /.dockerenv (its root file system came from a container image)
    and the CPU's hypervisor flag (a Firecracker VM)."""
    found = problems(context(**{**SANDBOX, "virt": "docker", "hypervisor": True}))
    assert found["init"] == ("no systemd (PID 1 is process_api): gpuk8s needs a systemd host; "
                             "this looks like a docker container or a VM booted from a "
                             "container image (the CPU reports a hypervisor)")


def test_every_spelling_of_loopback_is_refused() -> None:
    for address in ("localhost", "LOCALHOST.", "127.0.1.1", "::1", "[::1]",
                    "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1"):
        ctx = context("cp-01", gpus=0)
        ctx.cluster.update(advertise_address=address)
        assert "loopback" in problems(ctx).get("endpoint", ""), address
    ctx = context("cp-01", gpus=0)
    ctx.cluster.update(advertise_address="10.0.0.1")
    assert "endpoint" not in problems(ctx)
