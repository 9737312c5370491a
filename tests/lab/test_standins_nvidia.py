"""Unit tests of the NVIDIA stand-ins (tests/lab/standins/nvidia) against a fake root.

The stand-ins prefix every absolute path with $GPUK8S_LAB_ROOT, so they run here on the host
against a fake /sys/bus/pci/devices built from the real H200 fixtures. Scripts are rendered by the
package builder (so @UPSTREAM_VERSION@ etc. are substituted exactly as in the .debs).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.lab import debs

#: real captures from H200 hosts, kept in the repository
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia"
DUAL = FIXTURES / "2xh200-ubuntu2404"
SINGLE = FIXTURES / "h200-ubuntu2404"
NEW, OLD = "580.159.04-1", "580.105.08-1"


def _defs() -> dict[str, debs.PackageDef]:
    return {
        str(d.raw["name"]): d for d in debs.load_definitions() if d.repo != "docker/debian/bookworm"
    }


def install_files(root: Path, package: str, version: str) -> debs.BuildSpec:
    """Render package=version with the builder and unpack its files under root (no scripts run)."""
    spec = debs.render(_defs()[package], version)
    for e in spec.entries:
        target = root / e.dest.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if e.link is not None:
            if target.is_symlink():
                target.unlink()
            target.symlink_to(e.link)
        else:
            target.write_bytes(e.data or b"")
            target.chmod(e.mode)
    return spec


def fake_pci(root: Path, lines: list[str]) -> None:
    """lines in the fixtures' sys-pci-nvidia.txt format:
    NAME VENDOR DEVICE CLASS SUBVEN SUBDEV DRIVER."""
    for line in lines:
        name, vendor, device, cls, subven, subdev, *_ = line.split()
        d = root / "sys/bus/pci/devices" / name
        d.mkdir(parents=True, exist_ok=True)
        for k, v in dict(
            vendor=vendor,
            device=device,
            class_=cls,
            subsystem_vendor=subven,
            subsystem_device=subdev,
            numa_node="0",
        ).items():
            (d / k.rstrip("_")).write_text(v + "\n")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / "etc").mkdir(parents=True)
    (r / "etc/machine-id").write_text("5f1c0c7e4a8b4d0f9e6b2a1c3d4e5f60\n")
    return r


def run(
    root: Path, *cmd: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ, GPUK8S_LAB_ROOT=str(root), LC_ALL="C")
    e.update(env or {})
    exe = str(root / cmd[0].lstrip("/"))
    return subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, env=e)


def smi(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run(root, "/usr/bin/nvidia-smi", *args)


def load_module(root: Path, version: str, persistence: bool = True) -> None:
    run_dir = root / "run/nvidia-lab"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "loaded-module-version").write_text(debs.upstream_version(version) + "\n")
    if persistence:
        (run_dir / "persistence-mode").write_text("Enabled\n")


@pytest.fixture
def dual(root: Path) -> Path:
    fake_pci(root, (DUAL / "sys-pci-nvidia.txt").read_text().splitlines())
    install_files(root, "nvidia-driver-cuda", NEW)
    load_module(root, NEW)
    return root


def _mask_table(text: str) -> list[str]:
    lines = text.rstrip("\n").split("\n")[1:]  # first line: timestamp
    return [re.sub(r"\d\dC    P0 +\d+W", "NNC    P0 NNNW", ln) for ln in lines]


# ------------------------------------------------------------------ nvidia-smi
def test_table_matches_fixture_layout(dual: Path) -> None:
    res = smi(dual)
    assert res.returncode == 0, res.stdout + res.stderr
    assert _mask_table(res.stdout) == _mask_table((DUAL / "nvidia-smi.txt").read_text())
    assert re.fullmatch(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4} {7}", res.stdout.split("\n")[0])


def test_table_single_gpu_matches_fixture(root: Path) -> None:
    fake_pci(root, (SINGLE / "sys-pci-nvidia.txt").read_text().splitlines())
    install_files(root, "nvidia-driver-cuda", NEW)
    load_module(root, NEW)
    assert _mask_table(smi(root).stdout) == _mask_table((SINGLE / "nvidia-smi.txt").read_text())


def test_header_line_carries_installed_version(root: Path) -> None:
    fake_pci(root, (SINGLE / "sys-pci-nvidia.txt").read_text().splitlines())
    install_files(root, "nvidia-driver-cuda", OLD)
    load_module(root, OLD)
    header = smi(root).stdout.split("\n")[2]
    want = (
        (SINGLE / "nvidia-smi.txt").read_text().split("\n")[2].replace("580.159.04", "580.105.08")
    )
    assert header == want


def test_list_gpus_format(dual: Path) -> None:
    res = smi(dual, "-L")
    assert res.returncode == 0
    pat = re.compile(
        r"GPU (\d+): (.+) "
        r"\(UUID: (GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\)"
    )
    got = [pat.fullmatch(x) for x in res.stdout.splitlines()]
    want = [pat.fullmatch(x) for x in (DUAL / "nvidia-smi-L.txt").read_text().splitlines()]
    assert all(got) and all(want) and len(got) == len(want)
    assert [(m[1], m[2]) for m in got] == [(m[1], m[2]) for m in want]  # type: ignore[index]
    assert len({m[3] for m in got}) == 2  # type: ignore[index]


def test_query_gpu_csv_matches_fixture(dual: Path) -> None:
    fixture = (DUAL / "query-gpu.csv").read_text().splitlines()
    header = fixture[0]
    fields = ",".join(re.sub(r" \[.*\]", "", f) for f in header.split(", "))
    res = smi(dual, f"--query-gpu={fields}", "--format=csv")
    assert res.returncode == 0, res.stdout
    out = res.stdout.splitlines()
    assert out[0] == header
    uuid = re.compile(r"GPU-[0-9a-f-]{36}")
    assert [uuid.sub("U", x) for x in out[1:]] == [uuid.sub("U", x) for x in fixture[1:3]]


def test_query_gpu_noheader_nounits_matches_fixture(dual: Path) -> None:
    fixture = (DUAL / "query-gpu.csv").read_text().splitlines()[3:]
    res = smi(
        dual,
        "--query-gpu=index,name,uuid,driver_version,memory.total,pci.bus_id,compute_cap",
        "--format=csv,noheader,nounits",
    )
    uuid = re.compile(r"GPU-[0-9a-f-]{36}")
    assert [uuid.sub("U", x) for x in res.stdout.splitlines()] == [
        uuid.sub("U", x) for x in fixture
    ]
    listed = smi(dual, "-L").stdout
    for line in res.stdout.splitlines():
        assert line.split(", ")[2] in listed


def test_query_persistence_mig_and_more(dual: Path) -> None:
    res = smi(
        dual,
        "--query-gpu=persistence_mode,mig.mode.current,memory.used,utilization.gpu",
        "--format=csv",
    )
    assert res.stdout.splitlines() == [
        "persistence_mode, mig.mode.current, memory.used [MiB], utilization.gpu [%]",
        "Enabled, Disabled, 0 MiB, 0 %",
        "Enabled, Disabled, 0 MiB, 0 %",
    ]
    res = smi(dual, "--query-gpu=count,serial,index", "--format=csv,noheader")
    rows = [r.split(", ") for r in res.stdout.splitlines()]
    assert [r[0] for r in rows] == ["2", "2"] and all(r[1].isdigit() for r in rows)


def test_invalid_field(dual: Path) -> None:
    res = smi(dual, "--query-gpu=index,bogus", "--format=csv")
    assert res.returncode == 2
    assert res.stdout.startswith('Field "bogus" is not a valid field to query.')


def test_not_loaded_exit_9(root: Path) -> None:
    fake_pci(root, (SINGLE / "sys-pci-nvidia.txt").read_text().splitlines())
    install_files(root, "nvidia-driver-cuda", NEW)
    for args in ((), ("-L",), ("--query-gpu=index", "--format=csv")):
        res = smi(root, *args)
        assert res.returncode == 9
        assert res.stdout == (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n"
        )


def test_version_mismatch_exit_18(root: Path) -> None:
    fake_pci(root, (SINGLE / "sys-pci-nvidia.txt").read_text().splitlines())
    install_files(root, "nvidia-driver-cuda", NEW)
    load_module(root, OLD)
    res = smi(root)
    assert res.returncode == 18
    assert res.stdout == (
        "Failed to initialize NVML: Driver/library version mismatch\n"
        "NVML library version: 580.159\n"
    )


def test_no_devices_exit_6(root: Path) -> None:
    fake_pci(root, ["0000:00:02.0 0x8086 0x1234 0x030000 0x8086 0x0001 i915"])
    install_files(root, "nvidia-driver-cuda", NEW)
    load_module(root, NEW)
    res = smi(root)
    assert (res.returncode, res.stdout) == (6, "No devices were found\n")


def test_models_bus_ids_and_uuids(root: Path) -> None:
    fake_pci(
        root,
        [
            "0000:1b:00.0 0x10de 0x2330 0x030200 0x10de 0x16c1 -",
            "0000:43:00.0 0x10de 0x20b2 0x030200 0x10de 0x1463 -",
            "0000:9a:00.0 0x10de 0x26b9 0x030000 0x10de 0x1851 -",
            "0000:c0:00.0 0x10de 0x22a3 0x068000 0x10de 0x1796 -",  # NVSwitch: not a GPU
        ],
    )
    install_files(root, "nvidia-driver-cuda", NEW)
    load_module(root, NEW, persistence=False)
    res = smi(
        root,
        "--query-gpu=index,name,memory.total,pci.bus_id,compute_cap,persistence_mode,mig.mode.current",
        "--format=csv,noheader,nounits",
    )
    assert res.stdout.splitlines() == [
        "0, NVIDIA H100 80GB HBM3, 81559, 00000000:1B:00.0, 9.0, Disabled, Disabled",
        "1, NVIDIA A100-SXM4-80GB, 81920, 00000000:43:00.0, 8.0, Disabled, Disabled",
        "2, NVIDIA L40S, 46068, 00000000:9A:00.0, 8.9, Disabled, [N/A]",
    ]
    first = smi(root, "-L").stdout
    assert smi(root, "-L").stdout == first  # deterministic
    (root / "etc/machine-id").write_text("00000000000000000000000000000001\n")
    assert smi(root, "-L").stdout != first  # per node


def test_q_and_topo(dual: Path) -> None:
    q = smi(dual, "-q").stdout.splitlines()
    fixture = (SINGLE / "nvidia-smi-q.txt").read_text().splitlines()
    assert q[:2] == fixture[:2]
    keyed = [ln for ln in q if " : " in ln]
    width = {ln.index(" : ") for ln in fixture if " : " in ln}
    assert {ln.index(" : ") for ln in keyed} == width
    assert "    Product Name                                       : NVIDIA H200" in q
    topo = smi(dual, "topo", "-m").stdout.splitlines()
    ftopo = (DUAL / "nvidia-smi-topo-m.txt").read_text().splitlines()
    assert topo[0] == ftopo[0]
    assert topo[1].split("\t")[:3] == ftopo[1].split("\t")[:3]
    assert topo[-7:] == ftopo[-7:]


def test_persistence_mode_set(dual: Path) -> None:
    res = smi(dual, "-pm", "0")
    assert (
        res.returncode == 0 and "Disabled persistence mode for GPU 00000000:00:06.0." in res.stdout
    )
    assert "Off  |" in smi(dual).stdout


# ------------------------------------------------------------------ driver lifecycle
STUBS = {
    "deb-systemd-helper": "exit 0",
    "deb-systemd-invoke": "exit 0",
    "systemctl": "exit 0",
    "update-alternatives": 'echo "update-alternatives $*" >> "$GPUK8S_LAB_ROOT/ua.log"',
}


def run_script(
    root: Path, spec: debs.BuildSpec, name: str, *args: str, krel: str = "6.1.0-lab"
) -> subprocess.CompletedProcess[str]:
    stubs = root.parent / "stubs"
    stubs.mkdir(exist_ok=True)
    for cmd, body in STUBS.items():
        (stubs / cmd).write_text(f"#!/bin/sh\n{body}\n")
        (stubs / cmd).chmod(0o755)
    script = root.parent / f"{spec.name}.{name}"
    script.write_text(spec.scripts[name])
    script.chmod(0o755)
    env = dict(
        os.environ,
        GPUK8S_LAB_ROOT=str(root),
        GPUK8S_LAB_KREL=krel,
        PATH=f"{stubs}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    )
    return subprocess.run([str(script), *args], capture_output=True, text=True, env=env)


def boot(root: Path) -> None:
    """A reboot: /run is empty again, then nvidia-lab-modload.service runs."""
    import shutil

    shutil.rmtree(root / "run", ignore_errors=True)
    (root / "run").mkdir()
    res = run(root, "/usr/lib/gpuk8s-lab/nvidia/nvidia-lab-modload")
    assert res.returncode == 0, res.stderr


def test_dkms_standin_needs_headers(root: Path) -> None:
    spec = install_files(root, "nvidia-kernel-open-dkms", NEW)
    res = run_script(root, spec, "postinst", "configure", "")
    assert res.returncode != 0
    assert (
        "Error! Your kernel headers for kernel 6.1.0-lab cannot be found at "
        "/lib/modules/6.1.0-lab/build" in res.stderr
    )
    assert not (root / "usr/lib/gpuk8s-lab/nvidia/module-version").exists()


def test_driver_install_reboot_upgrade_cycle(root: Path) -> None:
    fake_pci(root, (SINGLE / "sys-pci-nvidia.txt").read_text().splitlines())
    (root / "usr/src/linux-headers-6.1.0-lab").mkdir(parents=True)
    # first install: 580.105.08 open
    mod = install_files(root, "nvidia-kernel-open-dkms", OLD)
    install_files(root, "nvidia-driver-cuda", OLD)
    res = run_script(root, mod, "postinst", "configure", "")
    assert res.returncode == 0, res.stderr
    assert (root / "var/run/reboot-required").read_text() == "*** System restart required ***\n"
    assert (root / "var/run/reboot-required.pkgs").read_text() == "nvidia-kernel-open-dkms\n"
    assert (
        "Open Kernel Module for x86_64  580.105.08  Release Build"
        in (root / "usr/lib/gpuk8s-lab/nvidia/proc-driver-nvidia-version").read_text()
    )
    assert "nvidia-lab-modload.service" in mod.scripts["postinst"]
    assert smi(root).returncode == 9  # not loaded before the reboot
    boot(root)
    assert smi(root).returncode == 0
    assert (
        smi(root, "--query-gpu=driver_version,persistence_mode", "--format=csv,noheader").stdout
        == "580.105.08, Enabled\n"
    )
    # upgrade to 580.159.04: userspace new, module old until the next boot
    mod = install_files(root, "nvidia-kernel-open-dkms", NEW)
    install_files(root, "nvidia-driver-cuda", NEW)
    assert run_script(root, mod, "postinst", "configure", OLD).returncode == 0
    assert (root / "var/run/reboot-required.pkgs").read_text() == "nvidia-kernel-open-dkms\n"
    res = smi(root)
    assert res.returncode == 18 and "NVML library version: 580.159" in res.stdout
    boot(root)
    assert smi(root, "--query-gpu=driver_version", "--format=csv,noheader").stdout == "580.159.04\n"
    # proprietary flavour
    prop = install_files(root, "nvidia-kernel-dkms", NEW)
    assert run_script(root, prop, "postinst", "configure", "").returncode == 0
    assert (
        "NVIDIA UNIX x86_64 Kernel Module  580.159.04"
        in (root / "usr/lib/gpuk8s-lab/nvidia/proc-driver-nvidia-version").read_text()
    )


def test_meta_packages_pin_exact_versions() -> None:
    d = _defs()
    for version in (OLD, NEW):
        open_ = debs.render(d["nvidia-open-580"], version).control
        prop = debs.render(d["cuda-drivers-580"], version).control
        assert (
            f"Depends: nvidia-kernel-open-dkms (= {version}), nvidia-driver-cuda (= {version})"
            in open_
        )
        assert (
            f"Depends: nvidia-kernel-dkms (= {version}), nvidia-driver-cuda (= {version})" in prop
        )
    for name in ("nvidia-container-toolkit", "libnvidia-container-tools"):
        ctl = debs.render(d[name], "1.19.0-1").control
        assert "(= 1.19.0-1)" in ctl and "1.20.0" not in ctl


def test_fabricmanager(root: Path) -> None:
    install_files(root, "nvidia-fabricmanager", NEW)
    fake_pci(root, (SINGLE / "sys-pci-nvidia.txt").read_text().splitlines())
    env = {"GPUK8S_LAB_FM_ONESHOT": "1"}
    res = run(root, "/usr/bin/nv-fabricmanager", env=env)
    assert res.returncode == 1 and "don't match with driver version N/A" in res.stderr
    load_module(root, OLD)
    res = run(root, "/usr/bin/nv-fabricmanager", env=env)
    assert (
        res.returncode == 1
        and "interface version 580.159.04 don't match with driver version 580.105.08" in res.stderr
    )
    load_module(root, NEW)
    res = run(root, "/usr/bin/nv-fabricmanager", env=env)
    assert res.returncode == 1 and "NV_WARN_NOTHING_TO_DO" in res.stderr
    fake_pci(root, ["0000:c0:00.0 0x10de 0x22a3 0x068000 0x10de 0x1796 -"])
    res = run(root, "/usr/bin/nv-fabricmanager", env=env)
    assert res.returncode == 0, res.stderr
    assert (
        run(root, "/usr/bin/nv-fabricmanager", "--version").stdout
        == "Fabric Manager version is : 580.159.04\n"
    )


def test_cuda_toolkits(root: Path) -> None:
    spec = install_files(root, "cuda-toolkit-13-0", "13.0.2-1")
    res = run(root, "/usr/local/cuda-13.0/bin/nvcc", "--version")
    assert res.stdout.splitlines()[0] == "nvcc: NVIDIA (R) Cuda compiler driver"
    assert "Cuda compilation tools, release 13.0, V13.0.88" in res.stdout.splitlines()
    assert res.stdout.splitlines()[-1] == "Build cuda_13.0.r13.0/compiler.36424714_0"
    info = json.loads((root / "usr/local/cuda-13.0/version.json").read_text())
    assert info["cuda"] == {"name": "CUDA SDK", "version": "13.0.2"}
    assert run_script(root, spec, "postinst", "configure", "").returncode == 0
    assert (
        "--install /usr/local/cuda cuda /usr/local/cuda-13.0 130" in (root / "ua.log").read_text()
    )
    install_files(root, "cuda-toolkit-12-8", "12.8.1-1")
    res = run(root, "/usr/local/cuda-12.8/bin/nvcc", "--version")
    assert "Cuda compilation tools, release 12.8, V12.8.93" in res.stdout


def test_every_file_is_marked() -> None:
    here = Path(__file__).resolve().parent / "standins" / "nvidia"
    for f in here.iterdir():
        if f.suffix in (".json",):
            continue
        head = f.read_text().split("\n")[:3]
        assert any(
            "LAB STAND-IN: not the real" in ln or "LAB STAND-IN: not a real" in ln for ln in head
        ), f


# ------------------------------------------------------------------ nvidia-ctk
def ctk(root: Path, *args: str, lab_root: str | None = None) -> subprocess.CompletedProcess[str]:
    exe = root / "usr/bin/nvidia-ctk"
    e = dict(os.environ, GPUK8S_LAB_ROOT=lab_root or str(root))
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=e)


def test_ctk_version(root: Path) -> None:
    install_files(root, "nvidia-container-toolkit-base", "1.20.0-1")
    out = ctk(root, "--version").stdout.splitlines()
    assert out[0] == "NVIDIA Container Toolkit CLI version 1.20.0"
    assert re.fullmatch(r"commit: [0-9a-f]{40}", out[1])


@pytest.fixture(scope="module")
def containerd_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The REAL containerd 2.1 binary of the containerd.io package.

    Downloads sid's deb if needed."""
    from tests.lab import repos

    pkg = next(d for d in debs.load_definitions() if d.raw["name"] == "containerd.io")
    resolver = repos._resolver()
    return resolver.tree(pkg, "containerd") / "usr/bin/containerd"


def dump(containerd: Path, config: Path) -> str:
    res = subprocess.run(
        [str(containerd), "--config", str(config), "config", "dump"], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def _section(dump_text: str, header: str) -> str:
    """The table `header` of a `containerd config dump` with its sub-tables."""
    lines = dump_text[dump_text.index(header) :].split("\n")
    out = [lines[0]]
    for ln in lines[1:]:
        s = ln.strip()
        if s.startswith("[") and not s.startswith(header[:-1]):
            break
        out.append(ln)
    return "\n".join(out)


def test_ctk_configure_v3_real_containerd(root: Path, containerd_bin: Path, tmp_path: Path) -> None:
    install_files(root, "nvidia-container-toolkit-base", "1.20.0-1")
    etc = tmp_path / "etc-containerd"
    etc.mkdir()
    default = subprocess.run(
        [str(containerd_bin), "config", "default"], capture_output=True, text=True, check=True
    ).stdout
    assert "SystemdCgroup = false" in default
    (etc / "config.toml").write_text(
        default.replace("SystemdCgroup = false", "SystemdCgroup = true")
    )
    res = ctk(
        root,
        "runtime",
        "configure",
        "--runtime=containerd",
        "--set-as-default",
        f"--config={etc}/config.toml",
        f"--drop-in-config={etc}/conf.d/99-nvidia.toml",
        lab_root="/",
    )
    assert res.returncode == 0, res.stderr
    assert (
        f"INFO[0000] Wrote updated config to {etc}/conf.d/99-nvidia.toml" in res.stderr.splitlines()
    )
    assert (
        "INFO[0000] It is recommended that containerd daemon be restarted."
        in res.stderr.splitlines()
    )
    assert f'imports = ["{etc}/conf.d/*.toml"]' in (etc / "config.toml").read_text()
    out = dump(containerd_bin, etc / "config.toml")
    nv = _section(out, "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]")
    assert "runtime_type = 'io.containerd.runc.v2'" in nv
    assert "BinaryName = '/usr/bin/nvidia-container-runtime'" in nv
    assert "SystemdCgroup = true" in nv
    assert "default_runtime_name = 'nvidia'" in out
    # idempotent: a second run keeps one import
    ctk(
        root,
        "runtime",
        "configure",
        "--runtime=containerd",
        "--set-as-default",
        f"--config={etc}/config.toml",
        f"--drop-in-config={etc}/conf.d/99-nvidia.toml",
        lab_root="/",
    )
    assert (etc / "config.toml").read_text().count("conf.d/*.toml") == 1


def test_ctk_configure_docker_default_config(
    root: Path, containerd_bin: Path, tmp_path: Path
) -> None:
    """Docker's containerd.io config has no `version`: the real tool takes it as version 1
    (containerd.go parseVersion@v1.20.0), which has no drop-in support, and writes the whole
    config with the runtime added to the output path (the drop-in path); config.toml is left
    as it was."""
    install_files(root, "nvidia-container-toolkit-base", "1.20.0-1")
    etc = tmp_path / "etc-containerd"
    etc.mkdir()
    docker_cfg = Path(__file__).resolve().parent / "packages/docker/files/containerd-config.toml"
    (etc / "config.toml").write_text(docker_cfg.read_text())
    res = ctk(
        root,
        "runtime",
        "configure",
        "--runtime=containerd",
        f"--config={etc}/config.toml",
        f"--drop-in-config={etc}/conf.d/99-nvidia.toml",
        lab_root="/",
    )
    assert res.returncode == 0, res.stderr
    assert "INFO[0000] Using config version 1" in res.stderr.splitlines()
    assert (etc / "config.toml").read_text() == docker_cfg.read_text()
    dropin = (etc / "conf.d/99-nvidia.toml").read_text()
    assert 'disabled_plugins = ["cri"]' in dropin
    assert '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]' in dropin
    assert 'BinaryName = "/usr/bin/nvidia-container-runtime"' in dropin


def test_ctk_configure_creates_main_config(root: Path, containerd_bin: Path) -> None:
    install_files(root, "nvidia-container-toolkit-base", "1.20.0-1")
    res = ctk(root, "runtime", "configure", "--runtime=containerd", "--nvidia-runtime-name=nv")
    assert res.returncode == 0, res.stderr
    assert "INFO[0000] Wrote updated config to /etc/containerd/conf.d/99-nvidia.toml" in res.stderr
    # no config.toml: version 2 (the builder's default, containerd.go@v1.20.0), sorted keys
    main = (root / "etc/containerd/config.toml").read_text()
    assert main == 'imports = ["/etc/containerd/conf.d/*.toml"]\nversion = 2\n'
    dropin = (root / "etc/containerd/conf.d/99-nvidia.toml").read_text()
    assert '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nv.options]' in dropin
    # containerd accepts the drop-in itself (and migrates its version 2 to 3)
    out = dump(containerd_bin, root / "etc/containerd/conf.d/99-nvidia.toml")
    assert "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nv]" in out


CTK_REAL = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-ctk-1.20.0"


@pytest.mark.parametrize("default", [False, True])
def test_ctk_writes_the_bytes_the_real_one_writes(root: Path, default: bool) -> None:
    """The real v1.20.0's output (tests/fixtures/nvidia-ctk-1.20.0): config.toml re-marshalled
    in go-toml v1's layout on every run, the drop-in with a copy of the runc runtime."""
    install_files(root, "nvidia-container-toolkit-base", "1.20.0-1")
    config = root / "etc/containerd/config.toml"
    config.parent.mkdir(parents=True)
    config.write_bytes((CTK_REAL / "config.template.toml").read_bytes())
    config.chmod(0o640)
    flags = ["--set-as-default"] if default else []
    for _ in range(2):  # the second run rewrites to the same bytes
        res = ctk(root, "runtime", "configure", "--runtime=containerd", *flags)
        assert res.returncode == 0, res.stderr
        assert config.read_bytes() == (CTK_REAL / "config.after-ctk.toml").read_bytes()
        want = "99-nvidia.set-as-default.toml" if default else "99-nvidia.plain.toml"
        assert (root / "etc/containerd/conf.d/99-nvidia.toml").read_bytes() == \
            (CTK_REAL / want).read_bytes()
    assert config.stat().st_mode & 0o777 == 0o640  # truncated in place, mode kept


def test_ctk_configure_v2(root: Path, containerd_bin: Path, tmp_path: Path) -> None:
    install_files(root, "nvidia-container-toolkit-base", "1.19.0-1")
    etc = tmp_path / "c"
    etc.mkdir()
    (etc / "config.toml").write_text(
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
        '  runtime_type = "io.containerd.runc.v2"\n'
        '  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
        "    SystemdCgroup = true\n"
    )
    res = ctk(
        root,
        "runtime",
        "configure",
        "--runtime=containerd",
        "--set-as-default",
        f"--config={etc}/config.toml",
        f"--drop-in-config={etc}/conf.d/99-nvidia.toml",
        lab_root="/",
    )
    assert res.returncode == 0
    dropin = (etc / "conf.d/99-nvidia.toml").read_text()
    assert dropin.startswith("version = 2\n")
    assert '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]' in dropin
    out = dump(containerd_bin, etc / "config.toml")
    nv = _section(out, "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]")
    assert "SystemdCgroup = true" in nv and "BinaryName = '/usr/bin/nvidia-container-runtime'" in nv
    # dry run writes nothing
    before = dropin
    res = ctk(
        root,
        "runtime",
        "configure",
        "--runtime=containerd",
        "--dry-run",
        "--nvidia-runtime-name=x",
        f"--config={etc}/config.toml",
        f"--drop-in-config={etc}/conf.d/99-nvidia.toml",
        lab_root="/",
    )
    assert "runtimes.x]" in res.stdout and (etc / "conf.d/99-nvidia.toml").read_text() == before


def test_ctk_cdi(dual: Path) -> None:
    install_files(dual, "nvidia-container-toolkit-base", "1.20.0-1")
    res = ctk(dual, "cdi", "generate", "--output=/var/run/cdi/nvidia.yaml")
    assert res.returncode == 0, res.stderr
    res = ctk(dual, "cdi", "list")
    names = res.stdout.splitlines()
    uuids = re.findall(r"GPU-[0-9a-f-]{36}", smi(dual, "-L").stdout)
    assert names == [
        "nvidia.com/gpu=0",
        "nvidia.com/gpu=1",
        *[f"nvidia.com/gpu={u}" for u in uuids],
        "nvidia.com/gpu=all",
    ]
    (dual / "run/nvidia-lab/loaded-module-version").unlink()
    res = ctk(dual, "cdi", "generate")
    assert res.returncode == 1 and "ERROR_DRIVER_NOT_LOADED" in res.stderr


# ------------------------------------------------------------------ MIG (labmig, labmigcli)
H100 = "0x10de 0x2330 0x030200 0x10de 0x16c1 -"
MIG_LINE = re.compile(r"  MIG (\S+) +Device +(\d+): \(UUID: (MIG-[0-9a-f-]{36})\)")


def node(root: Path, *pci: str, persistence: bool = True) -> Path:
    fake_pci(root, list(pci))
    install_files(root, "nvidia-driver-cuda", NEW)
    load_module(root, NEW, persistence=persistence)
    return root


@pytest.fixture
def two_h100(root: Path) -> Path:
    return node(root, f"0000:1b:00.0 {H100}", f"0000:1c:00.0 {H100}")


def ok(root: Path, *args: str, env: dict[str, str] | None = None) -> str:
    res = run(root, "/usr/bin/nvidia-smi", *args, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def created(out: str) -> list[int]:
    return [int(x) for x in re.findall(r"Successfully created GPU instance ID +(\d+)", out)]


def test_mig_two_h100_all_3g(two_h100: Path) -> None:
    assert ok(two_h100, "-mig", "1") == (
        "Enabled MIG Mode for GPU 00000000:1B:00.0\nEnabled MIG Mode for GPU 00000000:1C:00.0\n"
        "All done.\n")
    assert ok(two_h100, "mig", "-i", "0", "-cgi", "9,9", "-C").splitlines() == [
        "Successfully created GPU instance ID  2 on GPU  0 using profile MIG 3g.40gb (ID  9)",
        "Successfully created compute instance ID  0 on GPU  0 GPU instance ID  2 using profile "
        "MIG 3g.40gb (ID  2)",
        "Successfully created GPU instance ID  1 on GPU  0 using profile MIG 3g.40gb (ID  9)",
        "Successfully created compute instance ID  0 on GPU  0 GPU instance ID  1 using profile "
        "MIG 3g.40gb (ID  2)"]
    ok(two_h100, "mig", "-i", "1", "-cgi", "3g.40gb,3g.40gb", "-C")
    listing = ok(two_h100, "-L").splitlines()
    assert [ln.split(" (UUID")[0] for ln in listing] == [
        "GPU 0: NVIDIA H100 80GB HBM3", "  MIG 3g.40gb     Device  0:",
        "  MIG 3g.40gb     Device  1:", "GPU 1: NVIDIA H100 80GB HBM3",
        "  MIG 3g.40gb     Device  0:", "  MIG 3g.40gb     Device  1:"]
    migs = [m[3] for m in map(MIG_LINE.fullmatch, listing) if m]
    assert len(set(migs)) == 4 and ok(two_h100, "-L").splitlines() == listing
    assert ok(two_h100, "mig", "-lgi").splitlines()[5:] == [
        "|   0  MIG 3g.40gb            9        1          0:4     |", "+" + "-" * 57 + "+",
        "|   0  MIG 3g.40gb            9        2          4:4     |", "+" + "-" * 57 + "+",
        "|   1  MIG 3g.40gb            9        1          0:4     |", "+" + "-" * 57 + "+",
        "|   1  MIG 3g.40gb            9        2          4:4     |", "+" + "-" * 57 + "+"]
    lgip = ok(two_h100, "mig", "-lgip", "-i", "1").splitlines()
    assert lgip[5] == ("|   1  MIG 1g.10gb         19     0/7        9.75       No     16     "
                       "1     0   |")
    assert "|   1  MIG 3g.40gb          9     0/2        39.50      No     60     3     0   |" \
        in lgip
    assert ok(two_h100, "--query-gpu=index,mig.mode.current,mig.mode.pending",
              "--format=csv,noheader") == "0, Enabled, Enabled\n1, Enabled, Enabled\n"
    assert ok(two_h100, "mig", "-lci").splitlines()[6] == (
        "|   0      1       MIG 3g.40gb          2         0          0:4     |")


def test_mig_geometries_on_one_gpu(two_h100: Path) -> None:
    ok(two_h100, "-i", "0", "-mig", "1")
    # all-balanced, largest first: 3g at 4:4, 2g at 0:2, the 1g's at 2 and 3
    assert created(ok(two_h100, "mig", "-i", "0", "-cgi", "9,14,19,19", "-C")) == [2, 3, 9, 10]
    assert len(MIG_LINE.findall(ok(two_h100, "-L"))) == 4
    ok(two_h100, "mig", "-i", "0", "-dci")
    ok(two_h100, "mig", "-i", "0", "-dgi")
    # seven 1g fill the GPU; an eighth does not fit
    assert sorted(created(ok(two_h100, "mig", "-i", "0", "-cgi", ",".join(["19"] * 7)))) == \
        list(range(7, 14))
    res = run(two_h100, "/usr/bin/nvidia-smi", "mig", "-i", "0", "-cgi", "19")
    assert (res.returncode, res.stdout) == (23, (
        "Unable to create a GPU instance on GPU  0 using profile 19: Insufficient Resources\n"
        "Failed to create GPU instances: Insufficient Resources\n"))
    assert "|   0  MIG 1g.10gb         19     0/7 " in ok(two_h100, "mig", "-lgip", "-i", "0")
    ok(two_h100, "mig", "-i", "0", "-dgi")
    # 1g.10gb+me once per GPU; unknown profiles and placements are invalid
    assert created(ok(two_h100, "mig", "-i", "0", "-cgi", "1g.10gb+me")) == [13]
    res = run(two_h100, "/usr/bin/nvidia-smi", "mig", "-i", "0", "-cgi", "20")
    assert res.returncode == 23 and "using profile 20: Insufficient Resources" in res.stdout
    res = run(two_h100, "/usr/bin/nvidia-smi", "mig", "-i", "0", "-cgi", "3g.71gb")
    assert res.stdout.splitlines() == [
        "Unable to create a GPU instance on GPU  0 using profile 3g.71gb: Invalid Argument",
        "Failed to create GPU instances: Invalid Argument"] and res.returncode == 2
    assert created(ok(two_h100, "mig", "-i", "0", "-cgi", "9:0")) == [1]
    res = run(two_h100, "/usr/bin/nvidia-smi", "mig", "-i", "0", "-cgi", "14:0")
    assert "using profile 14:0: Insufficient Resources" in res.stdout


def test_mig_driver_placements_of_the_user_guide(root: Path) -> None:
    """The MIG user guide's A100 examples: the same IDs, placements and -lgi order."""
    node(root, "0000:43:00.0 0x10de 0x20b2 0x030200 0x10de 0x1463 -")
    ok(root, "-mig", "1")
    ok(root, "-r")
    res = run(root, "/usr/bin/nvidia-smi", "mig", "-cgi", "19,19,14,9")
    assert created(res.stdout) == [13, 11, 3] and res.returncode == 23
    assert res.stdout.splitlines()[-2:] == [
        "Unable to create a GPU instance on GPU  0 using profile 9: Insufficient Resources",
        "Failed to create GPU instances: Insufficient Resources"]
    ok(root, "mig", "-dgi")
    assert created(ok(root, "mig", "-cgi", "9,19,14,19")) == [2, 7, 4, 8]
    rows = [ln for ln in ok(root, "mig", "-lgi").splitlines() if "MIG" in ln]
    assert rows == ["|   0  MIG 1g.10gb           19        7          0:1     |",
                    "|   0  MIG 1g.10gb           19        8          1:1     |",
                    "|   0  MIG 2g.20gb           14        4          2:2     |",
                    "|   0  MIG 3g.40gb            9        2          4:4     |"]
    ok(root, "mig", "-dgi")
    assert created(ok(root, "mig", "-cgi", "14,19,19,19,19,19")) == [5, 13, 7, 8, 9, 10]
    rows = [ln.split()[5:7] for ln in ok(root, "mig", "-lgi").splitlines() if "MIG" in ln]
    assert rows == [["7", "0:1"], ["8", "1:1"], ["9", "2:1"], ["10", "3:1"], ["13", "6:1"],
                    ["5", "4:2"]]
    ok(root, "mig", "-dgi")
    out = ok(root, "mig", "-cgi", "14,14,14,20", "-C")
    assert created(out) == [5, 3, 4, 13]
    assert out.splitlines()[-1] == ("Successfully created compute instance ID  0 on GPU  0 GPU "
                                    "instance ID 13 using profile MIG 1g.10gb (ID  0)")
    assert "  MIG 1g.10gb+me  Device  3: (UUID: MIG-" in ok(root, "-L")


def test_mig_ampere_pending_until_reset_hopper_at_once(root: Path) -> None:
    node(root, f"0000:1b:00.0 {H100}", "0000:43:00.0 0x10de 0x20b2 0x030200 0x10de 0x1463 -")
    out = ok(root, "-i", "1", "-mig", "1")
    assert out.splitlines()[0] == ("Warning: MIG mode is in pending enable state for GPU "
                                   "00000000:43:00.0:In use by another client")
    assert out.endswith("to make MIG mode effective.\nAll done.\n")
    query = ("--query-gpu=index,mig.mode.current,mig.mode.pending", "--format=csv,noheader")
    assert ok(root, *query) == "0, Disabled, Disabled\n1, Disabled, Enabled\n"
    assert ok(root, "mig", "-lgi") == "No MIG-enabled devices found.\n"
    res = run(root, "/usr/bin/nvidia-smi", "mig", "-cgi", "9")
    assert (res.returncode, res.stdout) == (6, "No MIG-enabled devices found.\n")
    assert ok(root, "-i", "1", "-r") == "GPU 00000000:43:00.0 was successfully reset.\nAll done.\n"
    assert ok(root, "-i", "00000000:1B:00.0", "-mig", "1") == (
        "Enabled MIG Mode for GPU 00000000:1B:00.0\nAll done.\n")
    assert ok(root, *query) == "0, Enabled, Enabled\n1, Enabled, Enabled\n"
    q = ok(root, "-q", "-i", "1").splitlines()
    assert q[q.index("    MIG Mode") + 1].endswith(": Enabled")
    assert "    Product Name                                       : NVIDIA A100-SXM4-80GB" in q


def test_mig_not_supported_on_l40s(root: Path) -> None:
    node(root, "0000:9a:00.0 0x10de 0x26b9 0x030000 0x10de 0x1851 -")
    res = run(root, "/usr/bin/nvidia-smi", "-i", "0", "-mig", "1")
    assert (res.returncode, res.stdout) == (3, (
        "Unable to enable MIG Mode for GPU 00000000:9A:00.0: Not Supported\n"
        "Terminating early due to previous errors.\n"))
    assert ok(root, "--query-gpu=mig.mode.current,mig.mode.pending",
              "--format=csv,noheader") == "[N/A], [N/A]\n"
    assert ok(root, "mig", "-lgip") == "No MIG-enabled devices found.\n"
    assert ok(root).splitlines()[10].endswith("|                  N/A |")
    assert not (root / "var/lib/gpuk8s-lab/nvidia/mig.json").exists()


def test_mig_destroy_order_and_not_found(two_h100: Path) -> None:
    smi_ = lambda *a: run(two_h100, "/usr/bin/nvidia-smi", *a)  # noqa: E731
    ok(two_h100, "-i", "1", "-mig", "1")
    ok(two_h100, "mig", "-i", "1", "-cgi", "14,14", "-C")
    res = smi_("mig", "-i", "1", "-dgi")
    assert (res.returncode, res.stdout) == (19, (
        "Unable to destroy GPU instance ID  3 from GPU  1: In use by another client\n"
        "Failed to destroy GPU instances: In use by another client\n"))
    res = smi_("-i", "1", "-mig", "0")
    assert (res.returncode, res.stdout) == (19, (
        "Unable to disable MIG Mode for GPU 00000000:1C:00.0: In use by another client\n"
        "Terminating early due to previous errors.\n"))
    assert ok(two_h100, "mig", "-i", "1", "-dci", "-gi", "5") == (
        "Successfully destroyed compute instance ID  0 from GPU  1 GPU instance ID  5\n")
    assert ok(two_h100, "mig", "-i", "1", "-dgi", "-gi", "5") == (
        "Successfully destroyed GPU instance ID  5 from GPU  1\n")
    assert ok(two_h100, "mig", "-dci") == (
        "Successfully destroyed compute instance ID  0 from GPU  1 GPU instance ID  3\n")
    assert ok(two_h100, "mig", "-dci") == "No compute instances found: Not Found\n"
    assert ok(two_h100, "mig", "-lci") == "No compute instances found: Not Found\n"
    # a GPU instance without its compute instance is no MIG device; -cci gives it one
    assert not MIG_LINE.search(ok(two_h100, "-L"))
    assert ok(two_h100, "mig", "-cci") == (
        "Successfully created compute instance ID  0 on GPU  1 GPU instance ID  3 using "
        "profile MIG 2g.20gb (ID  1)\n")
    assert len(MIG_LINE.findall(ok(two_h100, "-L"))) == 1
    ok(two_h100, "mig", "-dci")
    assert ok(two_h100, "mig", "-dgi") == "Successfully destroyed GPU instance ID  3 from GPU  1\n"
    assert ok(two_h100, "mig", "-dgi") == "No GPU instances found: Not Found\n"
    assert ok(two_h100, "mig", "-lgi") == "No GPU instances found: Not Found\n"
    assert ok(two_h100, "-i", "1", "-mig", "0") == (
        "Disabled MIG Mode for GPU 00000000:1C:00.0\nAll done.\n")
    res = smi_("mig", "-i", "7", "-lgi")
    assert (res.returncode, res.stdout) == (6, "No devices were found\n")


def test_mig_table_and_persistence_warning(root: Path) -> None:
    node(root, f"0000:1b:00.0 {H100}", persistence=False)
    out = ok(root, "-mig", "1")
    assert out.splitlines()[1:3] == ["", (
        "Warning: persistence mode is disabled on device 00000000:1B:00.0. See the Known Issues "
        "section of the nvidia-smi(1) man page for more information. Run with [--help | -h] "
        "switch to get more information on how to enable persistence mode.")]
    ok(root, "mig", "-cgi", "9,19", "-C")
    table = ok(root).splitlines()
    assert table[8].endswith("|   00000000:1B:00.0 Off |                   On |")
    assert table[9].endswith("|      59MiB /  81559MiB |     N/A      Default |")
    assert table[10].endswith("|              Enabled |")
    start = table.index("| MIG devices:" + " " * 76 + "|")
    assert table[start + 6:start + 12] == [
        "|  0    2   0   0  |              44MiB / 40448MiB    | 60      0 |  3   0    3    0"
        "    3 |",
        "|                  |               0MiB / 24673MiB    |           |                 "
        "      |",
        "+------------------+----------------------------------+-----------+-----------------"
        "------+",
        "|  0    7   0   1  |              15MiB /  9984MiB    | 16      0 |  1   0    1    0"
        "    1 |",
        "|                  |               0MiB /  6090MiB    |           |                 "
        "      |",
        "+------------------+----------------------------------+-----------+-----------------"
        "------+"]
    assert table[start + 12] == "" and table[start + 14].startswith("| Processes:")


def test_mig_instances_do_not_survive_a_reboot(two_h100: Path) -> None:
    boot = two_h100 / "proc/sys/kernel/random/boot_id"
    boot.parent.mkdir(parents=True)
    boot.write_text("6a4c1f6e-0000-4000-8000-000000000001\n")
    ok(two_h100, "-mig", "1")
    ok(two_h100, "mig", "-cgi", "0", "-C")
    assert len(MIG_LINE.findall(ok(two_h100, "-L"))) == 2
    boot.write_text("6a4c1f6e-0000-4000-8000-000000000002\n")
    assert not MIG_LINE.search(ok(two_h100, "-L"))   # MIG mode stays, instances are gone
    assert ok(two_h100, "--query-gpu=mig.mode.current", "--format=csv,noheader") == \
        "Enabled\nEnabled\n"
    assert ok(two_h100, "mig", "-lgi") == "No GPU instances found: Not Found\n"


def test_mig_container_sees_its_device_only(two_h100: Path) -> None:
    ok(two_h100, "-mig", "1")
    ok(two_h100, "mig", "-cgi", "9,9", "-C")
    host = ok(two_h100, "-L").splitlines()
    mig = MIG_LINE.fullmatch(host[5])
    assert mig
    # the container gets neither the state file nor the other devices: only its UUID
    (two_h100 / "var/lib/gpuk8s-lab/nvidia/mig.json").unlink()
    env = {"GPUK8S_LAB_VISIBLE_GPUS": mig[3]}
    assert ok(two_h100, "-L", env=env).splitlines() == [
        host[3].replace("GPU 1:", "GPU 0:"), host[5].replace("Device  1", "Device  0")]
    assert "|                  N/A   |     N/A      Default |" in ok(two_h100, env=env)
    whole = host[0].split("UUID: ")[1].rstrip(")")
    assert ok(two_h100, "-L", env={"GPUK8S_LAB_VISIBLE_GPUS": whole}) == host[0] + "\n"


# ------------------------------------------------------------------ kubelet: device plugin
sys.path.insert(0, str(Path(__file__).resolve().parent / "standins"))
from k8s import device_plugin, gpuview, kubelet  # noqa: E402

MIXED = {"version": "v1", "flags": {"migStrategy": "mixed"}}


def plugin(root: Path, config: dict[str, object]) -> dict[str, list[str]]:
    listing = ok(root, "-L")
    modes = gpuview.parse_modes(ok(root, "--query-gpu=uuid,mig.mode.current",
                                   "--format=csv,noheader"))
    return device_plugin.resources_for(gpuview.with_modes(gpuview.parse_list(listing), modes),
                                       config)


def test_device_plugin_resources_from_nvidia_smi(two_h100: Path) -> None:
    gpus = re.findall(r"GPU-[0-9a-f-]{36}", ok(two_h100, "-L"))
    assert plugin(two_h100, MIXED) == plugin(two_h100, {}) == {"nvidia.com/gpu": gpus}
    ok(two_h100, "-mig", "1")
    ok(two_h100, "mig", "-cgi", "9,9", "-C")
    migs = [m[3] for m in MIG_LINE.finditer(ok(two_h100, "-L"))]
    assert plugin(two_h100, MIXED) == {"nvidia.com/mig-3g.40gb": migs}
    assert plugin(two_h100, {"flags": {"migStrategy": "single"}}) == {"nvidia.com/gpu": migs}
    assert plugin(two_h100, {"version": "v1", "flags": {"migStrategy": "none"}}) == {
        "nvidia.com/gpu": gpus}
    # GPU 1 back to whole, GPU 0 split 3g + 2g + 1g+me: mixed offers each kind
    ok(two_h100, "mig", "-i", "1", "-dci")
    ok(two_h100, "mig", "-i", "1", "-dgi")
    ok(two_h100, "-i", "1", "-mig", "0")
    ok(two_h100, "mig", "-i", "0", "-dci")
    ok(two_h100, "mig", "-i", "0", "-dgi")
    ok(two_h100, "mig", "-i", "0", "-cgi", "9,14,20", "-C")
    got = plugin(two_h100, MIXED)
    assert {k: len(v) for k, v in got.items()} == {
        "nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb.me": 1, "nvidia.com/mig-2g.20gb": 1,
        "nvidia.com/mig-3g.40gb": 1}
    assert got["nvidia.com/gpu"] == [gpus[1]]
    assert plugin(two_h100, {"flags": {"migStrategy": "single"}}) == {}  # plugin exits
    sliced = {"version": "v1", "flags": {"migStrategy": "none"}, "sharing": {"timeSlicing": {
        "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    assert plugin(two_h100, sliced)["nvidia.com/gpu"][:3] == [
        f"{gpus[0]}::0", f"{gpus[1]}::0", f"{gpus[0]}::1"]
    assert device_plugin.config_ok(sliced) and device_plugin.config_ok(MIXED)
    assert not device_plugin.config_ok({"flags": {"migStrategy": "all"}})
    assert not device_plugin.config_ok({"sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 1}]}}})


def test_kubelet_admits_mig_pods_per_resource() -> None:
    k = kubelet.Kubelet.__new__(kubelet.Kubelet)
    k.devices = {"nvidia.com/gpu": ["GPU-a"], "nvidia.com/mig-3g.40gb": ["MIG-1", "MIG-2"]}
    k.gpu_assign = {"other": ["MIG-1"]}
    events: list[tuple[str, str]] = []
    k.set_status = lambda pod, phase, *a, **kw: events.append(  # type: ignore[method-assign]
        (phase, pod["status"].get("message", "")))
    pod = {"metadata": {"uid": "p1", "name": "p", "namespace": "default"}, "spec": {
        "containers": [{"resources": {"limits": {"nvidia.com/mig-3g.40gb": "2"}}}]}}
    avail = {"nvidia.com/gpu": 1, "nvidia.com/mig-3g.40gb": 2}
    assert k.held() == {"nvidia.com/mig-3g.40gb": 1}
    assert k.sync_pod(pod, {}, avail, {}) == {}
    assert events == [("Failed", "Allocate failed due to requested number of devices "
                       "unavailable for nvidia.com/mig-3g.40gb. Requested: 2, Available: 1, "
                       "which is unexpected")]
    assert k.allocate("nvidia.com/mig-3g.40gb", 1) == ["MIG-2"]
    assert k.allocate("nvidia.com/gpu", 2) == ["GPU-a"]
    assert kubelet.is_device_resource("nvidia.com/mig-1g.10gb.me")
    assert not kubelet.is_device_resource("nvidia.com/gpu.replicas")
