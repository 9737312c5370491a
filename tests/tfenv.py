"""The real TensorFlow for the workload tests (fixtures registered by tests/conftest.py, used by
tests/tf and tests/lab): a virtualenv with tests/tf/requirements.txt,
built once per requirements hash under the lab cache (GPUK8S_LAB_CACHE or /var/cache/gpuk8s-lab)
and reused; its build failing fails the tests (never a skip). Plus a data set of real
handwritten digits (scikit-learn's load_digits, 1,797 8x8 images) as MNIST's mnist.npz."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REQUIREMENTS = Path(__file__).resolve().parent / "tf" / "requirements.txt"

DIGITS_AS_MNIST = """
import sys
import numpy as np
from sklearn.datasets import load_digits

digits = load_digits()
# 8x8 images of 0..16, scaled 3x and centred on MNIST's 28x28 canvas of 0..255
big = np.kron(digits.images, np.ones((3, 3)))
images = np.zeros((len(big), 28, 28), dtype=np.uint8)
images[:, 2:26, 2:26] = np.clip(big * 16, 0, 255).astype(np.uint8)
order = np.random.default_rng(0).permutation(len(images))
train, test = order[:1500], order[1500:]
labels = digits.target.astype(np.uint8)
np.savez(sys.argv[1], x_train=images[train], y_train=labels[train],
         x_test=images[test], y_test=labels[test])
"""


def _cache_root() -> Path:
    return Path(os.environ.get("GPUK8S_LAB_CACHE", "/var/cache/gpuk8s-lab")) / "tensorflow"


@pytest.fixture(scope="session")
def tf_venv() -> Path:
    """A virtualenv holding the real TensorFlow 2.21.0 (built on first use, then cached)."""
    key = hashlib.sha256(REQUIREMENTS.read_bytes()
                         + sys.version.split()[0].encode()).hexdigest()[:16]
    venv = _cache_root() / f"venv-{key}"
    if (venv / "ok").is_file():
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    # two test sessions side by side: one builds, the other waits for it
    with open(venv.parent / f"venv-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / "ok").is_file():
            return venv
        return _build(venv)


def _build(venv: Path) -> Path:
    # built where it will live (a venv's scripts name its path); "ok" marks it complete
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q",
                          "--disable-pip-version-check", "-r", str(REQUIREMENTS)],
                         capture_output=True, text=True)
    if pip.returncode != 0:
        raise AssertionError("cannot build the TensorFlow test environment "
                             f"({venv}):\n{pip.stderr[-3000:]}")
    (venv / "ok").write_text(REQUIREMENTS.read_text())
    return venv


@pytest.fixture(scope="session")
def digits_npz(tf_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real handwritten digits in mnist.npz form (1,500 to train, 297 to test)."""
    path = tmp_path_factory.mktemp("digits") / "mnist.npz"
    subprocess.run([str(tf_venv / "bin" / "python"), "-c", DIGITS_AS_MNIST, str(path)],
                   check=True)
    return path
