"""A handler notified by a run that was killed before the handler ran (containerd's config
written, containerd not restarted: it keeps serving the package's config, CRI off) is run by
the next run: the notifying op leaves a marker on the host first, the handler removes it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpuk8s.facts.system import PENDING_HANDLERS, PendingHandlers, handler_marker
from gpuk8s.ops import Op, change, noop
from gpuk8s.runner import _persist_notifies

RESTART = change("container_runtime | restart containerd", "+ restart containerd",
                 "systemctl restart containerd")
REBOOT = Op("nvidia_driver | reboot", (), "+ reboot", reboot=True)
CONFIG = change("container_runtime | config.toml", "+ write config.toml", "write-it",
                notify=("restart containerd",))
MARKER = f"{PENDING_HANDLERS}/container_runtime--restart-containerd"


def test_the_notifying_op_marks_first_and_the_handler_unmarks() -> None:
    work = _persist_notifies("container_runtime", [CONFIG, noop("x", "= ok")],
                             {"restart containerd": RESTART}, frozenset())
    config, ok = work.ops
    assert config.commands == (f"mkdir -p {PENDING_HANDLERS} && touch {MARKER}", "write-it")
    assert ok.commands == ()
    assert work.handlers["restart containerd"].commands == (
        "(\nsystemctl restart containerd\n)", f"rm -f {MARKER}")
    assert handler_marker("container_runtime", "restart containerd") == \
        "container_runtime--restart-containerd"


def test_a_marker_left_by_a_killed_run_notifies_the_handler_again() -> None:
    pending = PendingHandlers().parse("container_runtime--restart-containerd\nx;rm -rf /\n", 0)
    assert pending == frozenset({"container_runtime--restart-containerd"})
    work = _persist_notifies("container_runtime", [noop("container_runtime | config.toml",
                                                        "= config.toml up to date")],
                             {"restart containerd": RESTART}, pending)
    _, again = work.ops
    assert again.changes and again.notify == ("restart containerd",)
    assert again.reason == ("+ restart containerd (an interrupted run made the change and "
                            "did not get to this)")
    assert work.handlers["restart containerd"].commands[-1] == f"rm -f {MARKER}"


def test_a_pending_handler_runs_after_the_reboot_the_run_asks_for() -> None:
    """CI's chain A: the kill in gpu-02's driver install left "verify driver" pending; run
    among the ops, it checked nvidia-smi before the reboot that loads the driver."""
    from gpuk8s.executor import HostRunner
    ran: list[str] = []

    class Runner(HostRunner):
        def __init__(self) -> None:
            self.host = "gpu-02"
            self.listener = lambda *a: None
            self.log = lambda text: None

        def run_ops(self, ops, result):  # type: ignore[no-untyped-def]
            ran.extend(op.id for op in ops)
            return [op for op in ops if op.commands]

        def reboot(self, op, result):  # type: ignore[no-untyped-def]
            ran.append(op.id)

    verify = change("r | verify", "+ verify", "check")
    load = change("r | load", "+ load", "true", notify=("reboot",))
    work = _persist_notifies("r", [load], {"reboot": REBOOT, "verify": verify},
                             frozenset({"r--verify"}))
    Runner().apply([work])
    assert ran == ["r | load", "r | pending handler", "nvidia_driver | reboot", "r | verify"]


def test_handlers_the_role_replans_leave_no_marker() -> None:
    """A failed driver upgrade must not leave "verify driver" for every later run."""
    op = change("nvidia_driver | packages", "+ install", "apt-get install x",
                notify=("reboot", "verify driver"))
    verify = change("nvidia_driver | verify", "+ check", "nvidia-smi -L")
    work = _persist_notifies("nvidia_driver", [op], {"reboot": REBOOT, "verify driver": verify},
                             frozenset({"nvidia_driver--verify-driver"}),
                             frozenset({"verify driver"}))
    assert work.ops == (op,)
    from gpuk8s.roles import load_role
    assert load_role("nvidia_driver").replanned_handlers() == {"reboot", "verify driver"}


def test_reboot_handlers_are_left_to_their_role() -> None:
    op = change("nvidia_driver | packages", "+ install", "apt-get install x",
                notify=("reboot",))
    work = _persist_notifies("nvidia_driver", [op], {"reboot": REBOOT},
                             frozenset({"nvidia_driver--reboot"}))
    assert work.ops == (op,) and work.handlers["reboot"] == REBOOT


def test_a_handler_that_exits_early_still_removes_its_marker(tmp_path: Path) -> None:
    """restart_containerd's wait ends with `exit 0`; the op's commands run as build_script
    runs them (one `set -e` subshell), and the marker goes."""
    from gpuk8s.executor import build_script

    marker = tmp_path / "marker"
    marker.touch()
    handler = change("r | restart", "+ restart", "true", "for i in 1 2; do exit 0; done",
                     "echo never")
    work = _persist_notifies("r", [], {"restart": handler}, frozenset())
    op = work.handlers["restart"]
    op = Op(op.id, tuple(c.replace(f"{PENDING_HANDLERS}/r--restart", str(marker))
                         for c in op.commands), op.reason)
    out = subprocess.run(["bash", "-c", build_script([op], "MARK")], capture_output=True,
                         text=True)
    assert "MARK E 0 0 " in out.stdout and "never" not in out.stdout, out.stdout
    assert not marker.exists()


def test_the_marker_commands_work_in_a_real_shell(tmp_path: Path) -> None:
    root = tmp_path / "root"
    work = _persist_notifies("container_runtime", [CONFIG], {"restart containerd": RESTART},
                             frozenset())
    mark = work.ops[0].commands[0].replace(PENDING_HANDLERS, f"{root}{PENDING_HANDLERS}")
    unmark = work.handlers["restart containerd"].commands[-1].replace(
        PENDING_HANDLERS, f"{root}{PENDING_HANDLERS}")
    subprocess.run(["sh", "-c", mark], check=True)
    listed = subprocess.run(["sh", "-c", PendingHandlers().command().replace(
        PENDING_HANDLERS, f"{root}{PENDING_HANDLERS}")], capture_output=True, text=True).stdout
    assert PendingHandlers().parse(listed, 0) == {"container_runtime--restart-containerd"}
    subprocess.run(["sh", "-c", unmark], check=True)
    assert not any((root / PENDING_HANDLERS.lstrip("/")).iterdir())
