"""Shared test settings: run folders go to a temporary directory, not the checkout."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tfenv import digits_npz, tf_venv  # noqa: F401 (fixtures for tests/tf and tests/lab)


@pytest.fixture(autouse=True, scope="session")
def _runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPUK8S_RUNS_DIR", str(path))
        yield path
