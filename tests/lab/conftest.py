"""Session fixture ``lab``: the default lab booted once (fails loudly, never skips)."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator

import pytest

from tests.lab.lab import Lab
from tests.lab.paths import LabError


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    """The booted default lab (topologies/default.yaml).

    Reused if it is already up; otherwise booted here and taken down at the end of the session
    (set GPUK8S_LAB_KEEP=1 to leave it up). Any failure to start is a test ERROR, not a skip.
    """
    if os.geteuid() != 0:
        pytest.fail("the lab needs root (netns, mounts, systemd-nspawn)", pytrace=False)
    # one pytest session at a time owns the lab (it has one bridge and fixed addresses)
    lock_path = os.environ.get("GPUK8S_LAB_LOCK", "/run/gpuk8s-lab.lock")
    lock = open(lock_path, "w")  # noqa: SIM115 - held for the whole session
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"lab: waiting for another test session to release {lock_path}", flush=True)
        t0 = time.monotonic()
        fcntl.flock(lock, fcntl.LOCK_EX)
        print(f"lab: got the lab after {time.monotonic() - t0:.0f} s", flush=True)
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
