"""Real installs for the tests: a local cache of the wheels gpuk8s needs, pip kept off every
index, a wheel of gpuk8s built from the checkout and a bare venv that installs it."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpuk8s import bundle as b


def wheel_cache(reqs: list[str]) -> Path:
    """Every wheel the bundle needs for this Python, downloaded once (from the index pip is
    set up with) into ~/.cache/gpuk8s/bundle-wheels/<key>, key: requirements, Python, platform.
    It holds setuptools too (pyproject's build-system requires), so a wheel of gpuk8s builds
    from it with no index."""
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


def no_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on pip sees no config, no index and no find-links but the ones passed."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # refused if ever asked
    for var in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
        monkeypatch.delenv(var, raising=False)


def sh(cmd: Sequence[str], cwd: Path, **env: str) -> str:
    """Run ``cmd``; its output (stdout and stderr), or a failed assert with its tail."""
    proc = subprocess.run(list(cmd), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env={**os.environ, **env})
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout[-4000:]}"
    return proc.stdout


def build_wheel(root: Path, dest: Path, cache: Path) -> Path:
    """A wheel of the gpuk8s package at ``root`` (pyproject.toml and gpuk8s/, copied: pip
    builds in the tree), built with setuptools from ``cache``, no index."""
    src = dest.parent / f"{dest.name}-src"
    shutil.copytree(root / "gpuk8s", src / "gpuk8s",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy2(root / "pyproject.toml", src / "pyproject.toml")
    sh([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
        "--no-index", "--find-links", str(cache), "-w", str(dest), str(src)], dest.parent)
    [wheel] = dest.glob("gpuk8s-*.whl")
    return wheel


def bare_venv(venv: Path, find_links: Path, *packages: str) -> Path:
    """A venv with no pip and no system site-packages, ``packages`` installed in it from
    ``find_links`` only; its python."""
    sh([sys.executable, "-m", "venv", "--without-pip", str(venv)], venv.parent)
    python = venv / "bin" / "python"
    sh([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
        "--disable-pip-version-check", "--no-index", "--find-links", str(find_links),
        *packages], venv.parent)
    return python
