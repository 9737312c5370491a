"""One user of a lab at a time: an exclusive flock held by a test session or the benchmark,
one per lab instance (each has fixed addresses and node names); and one for the host's shared
part (bridge, services, caches), held while an instance starts or stops it."""

from __future__ import annotations

import fcntl
import os
import time
from typing import IO

from .paths import INSTANCE, INSTANCES, others_up


def lock_path(instance: int) -> str:
    return "/run/gpuk8s-lab" + ("" if instance == 0 else f"-{instance}") + ".lock"


LOCK_PATH = os.environ.get("GPUK8S_LAB_LOCK", lock_path(INSTANCE))
HOST_LOCK_PATH = "/run/gpuk8s-lab-host.lock"


def acquire(who: str, path: str = LOCK_PATH) -> IO[str]:
    """Block until this process owns the lab (or, with HOST_LOCK_PATH, the host's shared
    part); the returned file holds the lock until closed."""
    lock = open(path, "w")  # noqa: SIM115 - the caller holds it open
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"{who}: waiting for the lab's other user to release {path}", flush=True)
        t0 = time.monotonic()
        fcntl.flock(lock, fcntl.LOCK_EX)
        print(f"{who}: got the lab after {time.monotonic() - t0:.0f} s", flush=True)
    return lock


def others_in_use() -> bool:
    """Whether another lab instance is in use: its lock held (a test session between two
    restores has no node up, and still needs the host's services) or a node of it up."""
    for other in INSTANCES:
        if other == INSTANCE:
            continue
        try:
            with open(lock_path(other), "a") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released on close
        except BlockingIOError:
            return True
        except OSError:
            pass
    return others_up()
