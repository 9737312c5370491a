"""Helpers for fault tests: bootstrap as a subprocess (the real CLI) with its own run folder,
watched through its per-host logs ("--> <op id>: ..." lines), killed with SIGKILL at a chosen
point; the cluster compared with what an uninterrupted run gives."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.lab.lab import Lab
from tests.lab.paths import REPO_ROOT

ROOT = REPO_ROOT
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").is_dir() else sys.executable

#: what every uninterrupted bootstrap of the default lab gives (day2.status rows)
EXPECTED = {"cp-01": {"state": "Ready", "allocatable_gpu": None, "gpus": 0},
            "gpu-01": {"state": "Ready", "allocatable_gpu": 2, "gpus": 2},
            "gpu-02": {"state": "Ready", "allocatable_gpu": 1, "gpus": 1},
            "cpu-01": {"state": "Ready", "allocatable_gpu": None, "gpus": 0}}


class Bootstrap:
    """One `gpuk8s bootstrap` subprocess with its own GPUK8S_RUNS_DIR."""

    def __init__(self, inventory: Path, runs: Path, *args: str,
                 env: dict[str, str] | None = None, command: str = "bootstrap") -> None:
        self.runs = runs
        runs.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.before = set(runs.iterdir())
        argv = [PYTHON, "-m", "gpuk8s.cli", command, "-i", str(inventory), *args]
        if command == "bootstrap":
            argv.append("--yes")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "GPUK8S_RUNS_DIR": str(runs),
                                          **(env or {})})
        self.stdout = self.stderr = ""

    @property
    def run_dir(self) -> Path | None:
        new = sorted(set(self.runs.iterdir()) - self.before)
        return new[-1] if new else None

    def log(self, host: str) -> str:
        rd = self.run_dir
        try:
            return (rd / f"{host}.log").read_text() if rd else ""
        except OSError:
            return ""

    def wait_for(self, what: str, cond: Callable[[], bool], timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if self.proc.poll() is not None:
                self.finish()
                raise AssertionError(f"bootstrap exited {self.proc.returncode} before {what}:"
                                     f"\n{self.stdout[-3000:]}\n{self.stderr[-3000:]}")
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"no {what} within {timeout:.0f}s")
            time.sleep(0.1)

    def wait_op(self, host: str, op_prefix: str, timeout: float = 300) -> None:
        """Until the host's log shows "--> <op_prefix>..." (its role script has started)."""
        pattern = re.compile(rf"^\S+ --> {re.escape(op_prefix)}", re.M)
        self.wait_for(f"{host}: --> {op_prefix}", lambda: bool(pattern.search(self.log(host))),
                      timeout)

    def kill(self) -> float:
        """SIGKILL (no cleanup, no report): return seconds since start."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        took = time.monotonic() - self.started
        self.finish()
        return took

    def finish(self, timeout: float = 900) -> int:
        out, err = self.proc.communicate(timeout=timeout)
        self.stdout += out or ""
        self.stderr += err or ""
        sys.stdout.write(self.stdout[-4000:])
        sys.stdout.write(self.stderr[-4000:])
        return self.proc.returncode


def remote_pids(lab: Lab, host: str, pattern: str) -> list[int]:
    _rc, out, _ = lab.ssh(host, f"pgrep -x {pattern} || true", timeout=15)
    return [int(p) for p in out.split()]


def rows(lab: Lab, inventory: Path) -> dict[str, dict[str, Any]]:
    import io

    from gpuk8s import day2
    from gpuk8s.report import Reporter

    return {r["host"]: r for r in day2.status(inventory, as_json=True,
                                              reporter=Reporter(io.StringIO()))}


def assert_converged_like_uninterrupted(lab: Lab, inventory: Path, runs: Path) -> None:
    """`plan` shows 0 changes, and status is what an uninterrupted bootstrap gives."""
    plan = Bootstrap(inventory, runs, command="plan")
    assert plan.finish() == 0, plan.stderr
    assert "plan: 0 change(s)" in plan.stdout, plan.stdout[-3000:]
    status = rows(lab, inventory)
    got = {h: {k: r.get(k) for k in ("state", "allocatable_gpu", "gpus")}
           for h, r in status.items()}
    assert got == EXPECTED
    assert all(r.get("drift") == 0 for r in status.values()), status
    drivers = {status[h].get("driver") for h in ("gpu-01", "gpu-02")}
    assert len(drivers) == 1 and str(drivers.pop()).startswith("580.")


def bootstrap_inline(inventory: Path, **kwargs: Any) -> tuple[dict[str, Any], str]:
    """`api.bootstrap` in this process (yes=True); returns its result and the report text."""
    import io

    from gpuk8s import api
    from gpuk8s.report import Reporter

    out = io.StringIO()
    try:
        result = api.bootstrap(inventory, yes=True, reporter=Reporter(out), **kwargs)
    finally:   # a failed run's report (preflight's problems) shows in the test's output
        sys.stdout.write(out.getvalue())
    return result, out.getvalue()


def ssh_ok(lab: Lab, node: str, cmd: str, timeout: float = 120.0) -> str:
    """Run a command on a node; fail the test with its output when it exits non-zero."""
    rc, out, err = lab.ssh(node, cmd, timeout=timeout)
    assert rc == 0, f"{node}: {cmd}: rc={rc}\n{out}\n{err}"
    return out


def _write_inventory(inv: dict[str, Any], dest: Path) -> Path:
    import yaml

    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def cut_inventory(lab: Lab, dest: Path, nodes: tuple[str, ...], **variables: Any) -> Path:
    """The lab's inventory cut down to ``nodes``, with extra all.vars; written under dest."""
    import yaml

    inv = yaml.safe_load(lab.inventory_path.read_text())
    inv["all"]["vars"].update(variables)
    for group in inv["all"]["children"].values():
        hosts = group.get("hosts") or {}
        for name in list(hosts):
            if name not in nodes:
                del hosts[name]
    kept = [h for g in inv["all"]["children"].values() for h in (g.get("hosts") or {})]
    assert sorted(kept) == sorted(nodes), kept
    return _write_inventory(inv, dest)


def derived_inventory(lab: Lab, dest: Path, hosts: dict[str, dict[str, Any]] | None = None,
                      **variables: Any) -> Path:
    """The lab's inventory with extra all.vars and per-host variables (``hosts``:
    ``{"gpu-02": {"gpu_sharing": {...}}}``; a value of None removes the host's variable);
    written under dest."""
    import yaml

    inv = yaml.safe_load(lab.inventory_path.read_text())
    inv["all"]["vars"].update(variables)
    seen = set()
    for group in inv["all"]["children"].values():
        for name, host_vars in (hosts or {}).items():
            group_hosts = group.get("hosts") or {}
            if name not in group_hosts:
                continue
            seen.add(name)
            host = group_hosts[name] = dict(group_hosts[name] or {})
            for key, value in host_vars.items():
                if value is None:
                    host.pop(key, None)
                else:
                    host[key] = value
    assert seen == set(hosts or {}), f"not in the lab's inventory: {set(hosts or {}) - seen}"
    return _write_inventory(inv, dest)


#: what a "bootstrapped" snapshot was made by: gpuk8s's own code, roles and templates and the
#: inventories (a snapshot of a cluster an older gpuk8s bootstrapped must not stand for this
#: one), and what the nodes installed in that bootstrap: the stand-ins (the kubelet, the API
#: server... a snapshot keeps the version it installed), their packages and the repos that
#: build them, and the lab's topologies
PRODUCT_DIRS = ("gpuk8s", "roles", "templates", "inventories", "tests/lab/standins",
                "tests/lab/packages", "tests/lab/topologies", "tests/lab/debs.py",
                "tests/lab/repos.py")


def product_key() -> str:
    h = hashlib.sha256()
    for entry in PRODUCT_DIRS:
        path = REPO_ROOT / entry
        for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if f.is_file() and "__pycache__" not in f.parts:
                h.update(str(f.relative_to(REPO_ROOT)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def snapshot_bootstrapped(lab: Lab) -> Path:
    """Snapshot the lab's cluster as "bootstrapped", stamped with this checkout's product_key."""
    dest = lab.snapshot("bootstrapped")
    (dest / "product").write_text(product_key())
    return dest


def bootstrapped_is_current(lab: Lab) -> bool:
    """A "bootstrapped" snapshot exists and this checkout's gpuk8s made it."""
    snap = lab.snapshot_dir("bootstrapped")
    stamp = snap / "product"
    return (snap / "topology.yaml").exists() and stamp.is_file() and \
        stamp.read_text() == product_key()


def restore_fresh(lab: Lab) -> Lab:
    """The lab as booted, before any bootstrap: the "fresh" snapshot (taken now if missing)."""
    if (lab.snapshot_dir("fresh") / "topology.yaml").exists():
        lab.restore("fresh")
    else:
        lab.up(reuse=False)
        lab.snapshot("fresh")
    return lab


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, str]:
    """Call a gpuk8s API function with a reporter writing to a string; (result, output)."""
    import io

    from gpuk8s.report import Reporter

    out = io.StringIO()
    result = fn(*args, reporter=Reporter(out), **kwargs)
    sys.stdout.write(out.getvalue())
    return result, out.getvalue()


#: Rich's box drawing; a terminal's escape sequences (colour, cursor) and carriage returns
BOX = re.compile(r"[\u2500-\u257f]")
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


def invoke_at(columns: int, *args: str, tty: bool, timeout: float = 600) -> tuple[int, str]:
    """The real ``invoke ARGS`` from the checkout with COLUMNS=``columns``: its output
    (stdout and stderr) through a pipe, or on a terminal (a pty that wide) with the escape
    sequences removed; and its exit code. What a person sees at that width."""
    argv = [sys.executable, "-m", "invoke", *args]
    env = {**os.environ, "COLUMNS": str(columns), "PYTHONPATH": str(ROOT), "TERM": "xterm"}
    if not tty:
        proc = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        return proc.returncode, proc.stdout
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    child = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=slave, stderr=slave,
                             stdin=subprocess.DEVNULL)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    rc = child.wait(timeout=max(1.0, deadline - time.monotonic()))
    return rc, _ESCAPES.sub("", b"".join(chunks).decode(errors="replace"))

