"""One thread per host: a phase's hosts (the executor), the connections (the transport) and
the per-host steps of the commands (fact probes, resets, NFS clients) all run side by side
through in_parallel."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def in_parallel(keys: Iterable[K], fn: Callable[[K], V]) -> dict[K, V | Exception]:
    """Run ``fn(key)`` for every key, each in a daemon thread of its own named
    ``gpuk8s-<key>``, and wait for them all (a barrier).

    Returns ``{key: value}`` in the order the calls finished. A call that raised an Exception
    has the exception as its value; one ended by anything else (a BaseException) has no entry,
    and the caller says what a missing key means. A Ctrl-C while waiting reaches the caller
    at once; the threads are daemons, so they do not keep the process alive after it."""
    out: dict[K, V | Exception] = {}
    lock = threading.Lock()

    def one(key: K) -> None:
        value: V | Exception
        try:
            value = fn(key)
        except Exception as exc:
            value = exc
        with lock:
            out[key] = value

    threads = [threading.Thread(target=one, args=(k,), name=f"gpuk8s-{k}", daemon=True)
               for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out
