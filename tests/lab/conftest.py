"""Session fixture ``lab``: the default lab booted once (fails loudly, never skips)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.lab.lab import Lab
from tests.lab.lock import acquire
from tests.lab.paths import LabError


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    """The booted default lab (topologies/default.yaml).

    Reused if it is already up; otherwise booted here and taken down at the end of the session
    (set GPUK8S_LAB_KEEP=1 to leave it up). Any failure to start is a test ERROR, not a skip.
    """
    if os.geteuid() != 0:
        pytest.fail("the lab needs root (netns, mounts, systemd-nspawn)", pytrace=False)
    lock = acquire("lab")  # one pytest session (or benchmark) at a time owns the lab
    the_lab = Lab()
    was_up = the_lab.is_up()
    try:
        the_lab.up()
    except (LabError, OSError) as exc:
        pytest.fail(f"lab could not start: {exc}", pytrace=False)
    yield the_lab
    if not was_up and os.environ.get("GPUK8S_LAB_KEEP") != "1":
        the_lab.down()
    lock.close()
