"""The nvidia-ctk stand-in: --version, `runtime configure` checked against the REAL containerd's
`config dump` (config versions 2 and 3, Docker's default config) and byte for byte against the
real tool's output (tests/fixtures/nvidia-ctk-1.20.0), and CDI."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.lab import debs
from tests.lab.paths import REPO_ROOT
from tests.lab.selftest.standins.nvidia_helpers import install_files, smi


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
    docker_cfg = (Path(__file__).resolve().parents[2]
                  / "packages/docker/files/containerd-config.toml")
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


CTK_REAL = REPO_ROOT / "tests" / "fixtures" / "nvidia-ctk-1.20.0"


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
