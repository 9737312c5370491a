"""One user of the lab at a time: an exclusive flock held by a test session or the benchmark
(the lab has one bridge and fixed addresses)."""

from __future__ import annotations

import fcntl
import os
import time
from typing import IO

LOCK_PATH = os.environ.get("GPUK8S_LAB_LOCK", "/run/gpuk8s-lab.lock")


def acquire(who: str) -> IO[str]:
    """Block until this process owns the lab; the returned file holds the lock until closed."""
    lock = open(LOCK_PATH, "w")  # noqa: SIM115 - the caller holds it open
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"{who}: waiting for the lab's other user to release {LOCK_PATH}", flush=True)
        t0 = time.monotonic()
        fcntl.flock(lock, fcntl.LOCK_EX)
        print(f"{who}: got the lab after {time.monotonic() - t0:.0f} s", flush=True)
    return lock
