"""in_parallel: the one thread-per-host helper of the executor, the transport and the commands."""

from __future__ import annotations

import threading
import time

import pytest

from gpuk8s.parallel import in_parallel


def test_every_key_in_its_own_named_daemon_thread_exceptions_as_values() -> None:
    seen: dict[str, tuple[str, bool]] = {}

    def fn(host: str) -> int:
        me = threading.current_thread()
        seen[host] = (me.name, me.daemon)
        if host == "bad":
            raise RuntimeError("boom")
        return len(host)

    out = in_parallel(["a", "bad", "ccc"], fn)
    assert out["a"] == 1 and out["ccc"] == 3
    assert isinstance(out["bad"], RuntimeError)
    assert seen == {h: (f"gpuk8s-{h}", True) for h in ("a", "bad", "ccc")}


def test_all_at_once_and_in_the_order_they_finished() -> None:
    started = time.monotonic()
    out = in_parallel([0.3, 0.1, 0.2], lambda s: time.sleep(s))
    assert time.monotonic() - started < 0.55  # one after the other would be 0.6 s
    assert list(out) == [0.1, 0.2, 0.3]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_call_ended_by_a_base_exception_has_no_entry() -> None:
    def fn(host: str) -> str:
        if host == "gone":
            raise SystemExit(1)  # ends that thread quietly, as threading does
        return host

    assert in_parallel(["ok", "gone"], fn) == {"ok": "ok"}
