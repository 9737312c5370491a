"""invoke bundle: the pip commands it builds, the errors it explains, and one real bundle built
from a local wheel cache and installed, with no index, into a fresh venv."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
from pathlib import Path

import pytest

from gpuk8s import bundle as b
from gpuk8s.errors import BundleError

ROOT = Path(__file__).resolve().parents[2]


def _proc(rc: int, out: str) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(["pip"], rc, out, None)


def test_download_command_for_another_python_and_platform(tmp_path: Path) -> None:
    target = b.Target("3.12", ("manylinux_2_28_x86_64",))
    cmd = b.download_command(["invoke>=2.2", "pyyaml>=6.0"], tmp_path, target,
                             ["--no-index", "--find-links", "/w"])
    assert cmd[:4] == [sys.executable, "-m", "pip", "download"]
    assert "--only-binary=:all:" in cmd
    joined = " ".join(cmd)
    assert "--python-version 3.12 --implementation cp --abi cp312" in joined
    platforms = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--platform"]
    # pip matches tags literally: the older manylinux tags a glibc 2.28 box runs are added
    assert platforms[0] == "manylinux_2_28_x86_64"
    assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64",
            "manylinux1_x86_64"} <= set(platforms)
    assert "manylinux_2_29_x86_64" not in platforms
    assert cmd[-4:] == ["-d", str(tmp_path), "invoke>=2.2", "pyyaml>=6.0"]
    assert "--no-index --find-links /w" in joined
    assert target.tag == "py312" and target.arch == "x86_64"


def test_expand_platforms() -> None:
    arm = b.expand_platforms(["manylinux_2_28_aarch64"])
    assert arm[-2:] == ["manylinux_2_17_aarch64", "manylinux2014_aarch64"]  # no aarch64 before
    assert b.expand_platforms(["manylinux2014_x86_64"])[0] == "manylinux_2_17_x86_64"
    assert b.expand_platforms(["musllinux_1_2_x86_64"]) == ["musllinux_1_2_x86_64",
                                                           "musllinux_1_1_x86_64"]
    assert b.expand_platforms(["win_amd64", "win_amd64"]) == ["win_amd64"]
    both = b.expand_platforms(["manylinux_2_28_x86_64", "manylinux_2_17_x86_64"])
    assert len(both) == len(set(both))


def test_default_target_is_this_python_on_this_machine(tmp_path: Path) -> None:
    cmd = b.download_command(["rich"], tmp_path, b.Target())
    assert "--platform" not in cmd and "--python-version" not in cmd
    assert b.Target().version == "{}.{}".format(*sys.version_info[:2])


def test_requirements_come_from_pyproject() -> None:
    meta = b.project(ROOT)
    assert meta["name"] == "gpuk8s"
    reqs = meta["requirements"]
    for name in ("invoke", "fabric", "paramiko", "pyyaml", "jinja2", "rich"):
        assert any(r.startswith(name) for r in reqs), name
    assert any(r.startswith("setuptools") for r in reqs)  # pip install -e . builds with it
    assert not any(r.startswith(("pytest", "ruff", "mypy")) for r in reqs)  # dev extras stay


@pytest.mark.parametrize("bad", ["3", "3.12.1", "python3.12", "3.9"])
def test_bad_python_version(bad: str) -> None:
    with pytest.raises(BundleError) as err:
        b.bundle("/nonexistent", python_version=bad, runner=lambda cmd: pytest.fail("ran pip"))
    assert "fix:" in str(err.value)


UNREACHABLE = """Looking in indexes: http://127.0.0.1:9/simple
WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after \
connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPConnection object \
at 0x7f>: Failed to establish a new connection: [Errno 111] Connection refused')': /simple/invoke/
ERROR: Could not find a version that satisfies the requirement invoke>=2.2 (from versions: none)
ERROR: No matching distribution found for invoke>=2.2
"""


def test_index_unreachable_names_the_fix_and_shows_pips_tail() -> None:
    with pytest.raises(BundleError) as err:
        b.check_pip(_proc(1, UNREACHABLE), b.Target())
    text = str(err.value)
    assert text.startswith("pip cannot reach the package index")
    assert "Connection refused" in text and "No matching distribution found" in text
    assert "PIP_INDEX_URL" in text and "--find-links" in text


def test_no_wheel_for_the_target_names_the_package() -> None:
    out = ("Collecting pyyaml>=6.0\n"
           "ERROR: Could not find a version that satisfies the requirement pyyaml>=6.0 (from "
           "versions: 6.0.1)\nERROR: No matching distribution found for pyyaml>=6.0\n")
    with pytest.raises(BundleError) as err:
        b.check_pip(_proc(1, out), b.Target("3.14", ("manylinux_2_28_x86_64",)))
    text = str(err.value)
    assert text.startswith("no wheel of pyyaml ")
    assert "CPython 3.14 on manylinux_2_28_x86_64" in text
    assert "--python-version 3.X" in text and "ldd --version" in text


def test_a_backtracking_failure_names_what_has_no_wheel() -> None:
    # pip's own output (trimmed) for a target where cffi has no wheel at all
    out = ("ERROR: Cannot install paramiko because these package versions have conflicting "
           "dependencies.\n\nThe conflict is caused by:\n"
           '    cryptography 50.0.2 depends on cffi>=2.0.0; platform_python_implementation '
           '!= "PyPy"\n    cryptography 38.0.0 depends on cffi>=1.12\n\n'
           "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/\n")
    with pytest.raises(BundleError) as err:
        b.check_pip(_proc(1, out), b.Target("3.12", ("manylinux_2_28_x86_64",)))
    assert str(err.value).startswith("no wheel of cffi (")


def test_other_pip_failures_and_success() -> None:
    b.check_pip(_proc(0, "Successfully downloaded rich"), b.Target())
    with pytest.raises(BundleError, match=r"pip failed \(exit 2\):\n    ERROR: boom"):
        b.check_pip(_proc(2, "ERROR: boom\n"), b.Target())
    with pytest.raises(BundleError, match="has no pip"):
        b.check_pip(_proc(1, "/usr/bin/python3: No module named pip\n"), b.Target())


def _fake_pip(calls: list[list[str]]) -> b.Runner:
    def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d" if "download" in cmd else "-w") + 1])
        names = ["gpuk8s-0.1.0-py3-none-any.whl"] if "wheel" in cmd else \
            ["invoke-2.2.1-py3-none-any.whl", "pyyaml-6.0.4-cp312-cp312-manylinux_2_17.whl"]
        for n in names:
            (dest / n).write_bytes(b"x" * 1000)
        return _proc(0, "ok")
    return run


def test_bundle_layout_with_a_fake_pip(tmp_path: Path) -> None:
    calls: list[list[str]] = []
    out = io.StringIO()
    result = b.bundle(tmp_path, python_version="3.12", platforms=["manylinux_2_28_x86_64"],
                      tarball=True, find_links=["wheelhouse"], runner=_fake_pip(calls), out=out)
    name = "gpuk8s-bundle-0.1.0-py312-x86_64"
    assert result["path"] == str(tmp_path / f"{name}.tar.gz")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{name}.tar.gz"]
    assert result["wheels"] == 3
    download, wheel = calls
    assert "--python-version" in download and "--find-links" in download
    assert str(Path("wheelhouse").absolute()) in download and "--no-index" not in download
    assert wheel[3] == "wheel" and "--no-deps" in wheel
    with tarfile.open(result["path"]) as tar:
        members = {m.name: m for m in tar.getmembers()}
        install = tar.extractfile(f"{name}/INSTALL.txt").read().decode()  # type: ignore[union-attr]
    src = f"{name}/gpuk8s-0.1.0"
    for path in ("tasks.py", "pyproject.toml", "roles/base/role.py", "gpuk8s/bundle.py",
                 "inventories/lab.yaml", "gpuk8s/data/bundle-install.sh"):
        assert f"{src}/{path}" in members, path
    assert not [m for m in members if "/.venv/" in m or "__pycache__" in m or ".egg-info" in m]
    assert members[f"{name}/install.sh"].mode & 0o111
    assert f"{name}/wheels/gpuk8s-0.1.0-py3-none-any.whl" in members
    assert ("python3 -m venv .venv && .venv/bin/pip install --no-index --find-links ../wheels "
            "-e .") in install
    assert "must be 3.12" in install and "GPUK8S_HOME" in install
    summary = out.getvalue()
    assert "3 wheels" in summary and f"tar xzf {name}.tar.gz" in summary
    assert b.INSTALL in summary


def test_the_checkout_copy_skips_the_bundles_folder(tmp_path: Path) -> None:
    files, _ = b.source_files(ROOT, skip=ROOT / "dist")
    assert "tasks.py" in files and "roles/base/role.py" in files
    assert not [f for f in files if f.startswith(("dist/", ".venv/", "runs/"))]
    no_git = tmp_path / "co"
    (no_git / "roles").mkdir(parents=True)
    for rel in ("pyproject.toml", "roles/a.py", ".venv/bin/python", "dist/x/y",
                "x.egg-info/PKG-INFO", "inventories/artifacts/admin.conf", "inventories/l.yaml"):
        (no_git / rel).parent.mkdir(parents=True, exist_ok=True)
        (no_git / rel).write_text("x")
    files, _ = b.source_files(no_git, skip=no_git / "dist")
    assert sorted(files) == ["inventories/l.yaml", "pyproject.toml", "roles/a.py"]


def test_invoke_and_cli_wiring(monkeypatch: pytest.MonkeyPatch) -> None:
    import tasks
    from gpuk8s import cli

    assert cli.COMMANDS["bundle"] is b.bundle
    assert cli.run("bundle", python_version="2.7") == 1  # a BundleError: message, exit 1
    seen: list[dict[str, object]] = []
    monkeypatch.setitem(cli.COMMANDS, "bundle", lambda **kw: seen.append(kw))
    assert cli.main(["bundle", "--python-version", "3.12", "--platform", "a", "--platform",
                     "b", "--tarball", "-o", "out"]) == 0
    assert seen[-1] == {"output": "out", "python_version": "3.12", "platforms": ["a", "b"],
                        "tarball": True, "find_links": [], "no_index": False}
    assert "bundle" in tasks.ns.task_names


# -- the real thing ------------------------------------------------------------------------

def _wheel_cache(reqs: list[str]) -> Path:
    """Every wheel the bundle needs for this Python, downloaded once (from the index pip is
    set up with) into ~/.cache/gpuk8s/bundle-wheels/<key>, key: requirements, Python, platform."""
    key = hashlib.sha256(repr((sorted(reqs), sys.version_info[:2],
                               sysconfig.get_platform())).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "gpuk8s" / \
        "bundle-wheels" / key
    if not cache.is_dir():
        partial = cache.with_name(f"{key}.partial-{os.getpid()}")
        proc = subprocess.run(b.download_command(reqs, partial, b.Target()),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode:
            shutil.rmtree(partial, ignore_errors=True)
            pytest.fail("cannot fill the wheel cache (needs the package index once):\n" +
                        proc.stdout[-3000:])
        with contextlib.suppress(OSError):  # unless another run filled it first
            partial.rename(cache)
        shutil.rmtree(partial, ignore_errors=True)
    return cache


def _sh(cmd: list[str], cwd: Path, **env: str) -> str:
    proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env={**os.environ, **env})
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout[-4000:]}"
    return proc.stdout


def test_a_real_bundle_installs_with_no_index(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    cache = _wheel_cache(b.project(ROOT)["requirements"])
    start = time.monotonic()
    # from here on pip sees no config, no index and no find-links but the ones passed
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # refused if ever asked
    for var in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT", "GPUK8S_HOME"):
        monkeypatch.delenv(var, raising=False)
    result = b.bundle(tmp_path / "out", tarball=True, find_links=[str(cache)], no_index=True,
                      out=io.StringIO())
    admin = tmp_path / "admin"
    admin.mkdir()
    with tarfile.open(result["path"]) as tar:
        tar.extractall(admin, filter="tar")
    top = admin / Path(result["path"]).name.removesuffix(".tar.gz")
    checkout = top / "gpuk8s-0.1.0"
    # the documented way: install.sh, a venv in the checkout with gpuk8s editable
    installer = subprocess.Popen([str(top / "install.sh")], cwd=top, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True,
                                 env={**os.environ, "PYTHON": sys.executable})
    # meanwhile the other way: the gpuk8s wheel in a bare venv, GPUK8S_HOME at the checkout
    venv = tmp_path / "venv"
    _sh([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    _sh([sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install", "-q",
         "--no-index", "--find-links", str(top / "wheels"), "gpuk8s"], tmp_path)
    code = "import gpuk8s, fabric, invoke, paramiko; print(gpuk8s.__file__)"
    assert str(venv) in _sh([str(venv / "bin/python"), "-c", code], tmp_path)
    out = _sh([str(venv / "bin/gpuk8s"), "check", "-i", "inventories/lab.yaml"], checkout,
              GPUK8S_HOME=str(checkout))
    assert "no problems" in out
    log, _ = installer.communicate(timeout=300)
    assert installer.returncode == 0, log[-4000:]
    python = checkout / ".venv/bin/python"
    assert str(checkout) in _sh([str(python), "-c", code], tmp_path)  # editable: the checkout
    assert "bootstrap" in _sh([str(checkout / ".venv/bin/invoke"), "--list"], checkout)
    elapsed = time.monotonic() - start
    print(f"bundle {result['bytes'] / 2**20:.1f} MiB, {result['wheels']} wheels; "
          f"built and installed twice in {elapsed:.1f} s")
