"""Executor: failure isolation, handlers, barriers and reboots, over a fake transport that
runs the generated scripts in a local sh."""

from __future__ import annotations

import subprocess
import threading
import time

import gpuk8s.gather as gathering
from gpuk8s.errors import CommandFailed, ConnectError, ConnectionLost
from gpuk8s.executor import HostRunner, RoleWork, build_script, run_phase
from gpuk8s.ops import Op, change, noop
from gpuk8s.redact import Redactor
from gpuk8s.sections import split_sections
from gpuk8s.transport import CommandResult, Counters


class ShellTransport:
    """Runs scripts with the local sh; records them; can refuse to come back from a reboot."""

    def __init__(self, name: str, reboot_ok: bool = True, delay: float = 0.0) -> None:
        self.name = name
        self.counters = Counters()
        self.scripts: list[str] = []
        self.reboot_ok = reboot_ok
        self.delay = delay
        self.reboots = 0

    def run(self, script: str, *, timeout: float | None = None) -> CommandResult:
        self.counters.execs += 1
        self.scripts.append(script)
        time.sleep(self.delay)
        if "systemctl reboot" in script:
            return CommandResult(0, "")
        proc = subprocess.run(["sh", "-s"], input=script.encode(), capture_output=True,
                              check=False)
        return CommandResult(proc.returncode, (proc.stdout + proc.stderr).decode())

    def wait_reboot(self, old_boot_id: str, timeout: float) -> str:
        if not self.reboot_ok:
            raise ConnectError(self.name, f"did not come back within {timeout:.0f}s after reboot")
        self.reboots += 1
        return "new-boot"

    def close(self) -> None:
        pass


def runner(t: ShellTransport, redact: Redactor | None = None,
           log: list[str] | None = None, events: list[tuple[str, str, str]] | None = None
           ) -> HostRunner:
    logs = log if log is not None else []
    ev = events if events is not None else []
    return HostRunner(t.name, t, redact or Redactor(), logs.append,
                      lambda h, k, x: ev.append((h, k, x)), reboot_timeout=5)


def test_script_stops_at_first_failure() -> None:
    ops = [change("a", "+ a", "echo A"), change("b", "+ b", "echo B >&2", "false", "echo no"),
           change("c", "+ c", "echo C")]
    script = build_script(ops, "@@M")
    proc = subprocess.run(["sh", "-s"], input=script.encode(), capture_output=True, check=False)
    sections = split_sections(proc.stdout.decode(), "@@M")
    assert sections[0] == ("A", 0)
    assert sections[1] == ("B", 1)
    assert 2 not in sections
    assert proc.returncode == 1


def test_one_exec_per_role_and_noops_cost_nothing() -> None:
    t = ShellTransport("h1")
    work = [RoleWork("r1", (noop("r1 | x", "= fine"), change("r1 | y", "+ y", "true"))),
            RoleWork("r2", (noop("r2 | z", "= fine"),))]
    res = runner(t).apply(work)
    assert res.error is None
    assert t.counters.execs == 1
    assert [r.status for r in res.results] == ["ok", "changed", "ok"]


def test_failure_stops_only_that_host_and_names_op_and_output() -> None:
    good, bad = ShellTransport("good"), ShellTransport("bad")
    work = {
        "good": [RoleWork("r", (change("r | a", "+ a", "echo fine"),))],
        "bad": [RoleWork("r", (change("r | a", "+ a", "echo broken apt >&2; exit 100"),
                               change("r | b", "+ b", "echo never")))],
    }
    results = run_phase(work, {"good": runner(good), "bad": runner(bad)})
    assert results["good"].error is None and results["good"].changed == 1
    err = results["bad"].error
    assert isinstance(err, CommandFailed)
    assert err.op_id == "r | a" and err.exit_code == 100 and "broken apt" in err.stderr_tail
    assert [r.op.id for r in results["bad"].results] == ["r | a"]


def test_hosts_run_in_parallel() -> None:
    hosts = {f"h{i}": ShellTransport(f"h{i}", delay=0.3) for i in range(6)}
    work = {h: [RoleWork("r", (change("r | a", "+ a", "true"),))] for h in hosts}
    started = time.monotonic()
    run_phase(work, {h: runner(t) for h, t in hosts.items()})
    assert time.monotonic() - started < 1.2  # 6 x 0.3 s serially would be 1.8 s


def test_handlers_run_once_only_when_notified_and_in_order() -> None:
    t = ShellTransport("h")
    handlers = {"restart": change("r | restart", "restart", "echo restarted"),
                "other": change("r | other", "other", "echo other")}
    ops = (change("r | a", "+ a", "true", notify=("restart",)),
           change("r | b", "+ b", "true", notify=("restart",)),
           noop("r | c", "= c"))
    res = runner(t).apply([RoleWork("r", ops, handlers)])
    ids = [r.op.id for r in res.results if r.status == "changed"]
    assert ids == ["r | a", "r | b", "r | restart"]
    unchanged = runner(t).apply([RoleWork("r", (noop("r | a", "= a"),), handlers)])
    assert all(r.status == "ok" for r in unchanged.results)


def test_reboot_handler_waits_for_new_boot() -> None:
    t = ShellTransport("h")
    handlers = {"reboot": Op("d | reboot", (), "reboot", reboot=True),
                "verify": change("d | verify", "verify", "echo verified")}
    res = runner(t).apply([RoleWork("d", (change("d | install", "+ i", "true",
                                                 notify=("reboot", "verify")),), handlers)])
    assert res.error is None and t.reboots == 1
    assert [r.op.id for r in res.results] == ["d | install", "d | reboot", "d | verify"]


def test_reboot_that_never_returns_fails_that_host() -> None:
    t = ShellTransport("h", reboot_ok=False)
    handlers = {"reboot": Op("d | reboot", (), "reboot", reboot=True)}
    events: list[tuple[str, str, str]] = []
    res = runner(t, events=events).apply(
        [RoleWork("d", (change("d | install", "+ i", "true", notify=("reboot",)),), handlers)])
    assert isinstance(res.error, ConnectError) and "did not come back" in str(res.error)
    assert ("h", "fail", str(res.error)) in events


def test_secrets_never_reach_logs_or_errors() -> None:
    redact = Redactor()
    redact.add("s3cr3t-token")
    log: list[str] = []
    t = ShellTransport("h")
    ops = (change("j | join", "+ join", "echo using s3cr3t-token; exit 2", secret=True),)
    res = runner(t, redact, log).apply([RoleWork("j", ops)])
    assert isinstance(res.error, CommandFailed)
    text = "\n".join(log) + str(res.error)
    assert "s3cr3t-token" not in text and "<redacted>" in text


def test_barrier_reports_every_host() -> None:
    lock = threading.Lock()
    seen: list[str] = []

    class Slow(ShellTransport):
        def run(self, script: str, *, timeout: float | None = None) -> CommandResult:
            with lock:
                seen.append(self.name)
            return super().run(script, timeout=timeout)

    hosts = {h: Slow(h) for h in ("a", "b", "c")}
    work = {h: [RoleWork("r", (change("r | x", "+ x", "exit 1" if h == "b" else "true"),))]
            for h in hosts}
    results = run_phase(work, {h: runner(t) for h, t in hosts.items()})
    assert sorted(results) == ["a", "b", "c"] and sorted(seen) == ["a", "b", "c"]
    assert [h for h, r in results.items() if r.error] == ["b"]


class DroppingTransport(ShellTransport):
    """The connection dies under the first script, as paramiko reports it (EOFError inside
    the transport, surfaced as ConnectionLost)."""

    def run(self, script: str, *, timeout: float | None = None) -> CommandResult:
        self.counters.execs += 1
        raise ConnectionLost(self.name, "EOFError()")


def test_connection_dropped_mid_script_names_the_op_and_spares_other_hosts() -> None:
    lost, good = DroppingTransport("lost"), ShellTransport("good")
    ops = (change("container_runtime | install", "+ containerd", "true"),)
    work = {"lost": [RoleWork("container_runtime", ops)],
            "good": [RoleWork("container_runtime", ops)]}
    results = run_phase(work, {"lost": runner(lost), "good": runner(good)})
    assert results["good"].error is None
    err = results["lost"].error
    assert isinstance(err, ConnectError)
    assert str(err).startswith("lost: connection lost while running "
                               "[container_runtime | install]")
    assert "internal error" not in str(err)


def test_peak_rss_is_this_programs_own_not_the_forking_parents() -> None:
    """A child of a big process: getrusage's ru_maxrss keeps the parent's pre-exec pages,
    peak_rss_kb (VmHWM) does not; the benchmark reads report.json's figure."""
    import sys

    ballast = bytearray(200 * 1024 * 1024)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    code = ("import resource; from gpuk8s.report import peak_rss_kb; "
            "print(peak_rss_kb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    own, inherited = int(out[0]), int(out[1])
    del ballast
    assert own < 100 * 1024 < 200 * 1024 <= inherited


def test_a_host_lost_during_the_fact_probe_is_named_as_such() -> None:
    from types import SimpleNamespace

    import pytest

    from gpuk8s.errors import PhaseFailed
    from tests.unit.scenarios import default_vars

    session = SimpleNamespace(
        host=lambda name: SimpleNamespace(vars=default_vars(), user="root"),
        transports={"lost": DroppingTransport("lost")},
        runlog=SimpleNamespace(mark=lambda what: None), facts={})
    with pytest.raises(PhaseFailed) as err:
        gathering.gather(session, ["lost"])  # type: ignore[arg-type]
    error = err.value.results["lost"].error
    assert isinstance(error, ConnectError) and not isinstance(error, ConnectionLost)
    assert str(error) == "lost: connection lost during the fact probe: EOFError()"


def test_ops_run_outside_a_phase_reach_the_report(tmp_path: object) -> None:
    """Day-2 steps and workload applies (run_now) are logged, redacted and listed in
    report.json's steps, failures included."""
    import json
    from pathlib import Path

    from gpuk8s.report import RunLog

    redact = Redactor()
    redact.add("s3cret")
    runlog = RunLog(Path(str(tmp_path)), "upgrade", redact)
    t = ShellTransport("gpu-01")
    r = HostRunner("gpu-01", t, redact, runlog.host_logger("gpu-01"), lambda *a: None,
                   record=runlog.add_step)
    assert r.run_now([Op("day2 | drain", ("echo drained",), "+ drain s3cret")]) == \
        [(0, "drained")]
    try:
        r.run_now([Op("day2 | kubeadm", ("exit 3",), "+ kubeadm upgrade node")])
    except CommandFailed:
        pass
    else:
        raise AssertionError("a failed step must raise")
    report = json.loads(runlog.write_report().read_text())
    assert [(s["host"], s["id"], s["exit"], s["status"]) for s in report["steps"]] == [
        ("gpu-01", "day2 | drain", 0, "ok"), ("gpu-01", "day2 | kubeadm", 3, "failed")]
    assert report["steps"][0]["reason"] == "+ drain <redacted>"
    assert "s3cret" not in (runlog.path / "gpu-01.log").read_text()
