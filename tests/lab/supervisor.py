"""Per-node supervisor: runs systemd-nspawn, boots the node again when it reboots (exit 133).

Started as ``python supervisor.py CONFIG.json`` (stdlib only, no package imports). It
double-forks, writes its pid file, logs the console to the node's console.log and records its
state in a small JSON file. SIGTERM: shut the node down cleanly (nspawn forwards a poweroff to
the container's init), then exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REBOOT_EXIT = 133
STOP_GRACE_S = 60.0


def _write_state(path: Path, **state: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state) + "\n")
    tmp.replace(path)


def _daemonize() -> None:
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    os.chdir("/")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def cgroup_dirs() -> list[Path]:
    """This process's cgroup directory in every mounted hierarchy (v1 controllers and v2)."""
    mounts: list[tuple[set[str], str, str]] = []  # (super options, root, mount point)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        fields, post_fields = pre.split(), post.split()
        if len(post_fields) < 3 or post_fields[0] not in ("cgroup", "cgroup2"):
            continue
        opts = {"<v2>"} if post_fields[0] == "cgroup2" else set(post_fields[2].split(","))
        mounts.append((opts, fields[3], fields[4]))
    dirs = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        want = set(ctrls.split(",")) if ctrls else {"<v2>"}
        found = next(((root, point) for opts, root, point in mounts if want <= opts), None)
        if found is None:
            continue
        root, point = found
        rel = os.path.relpath(path, root) if path.startswith(root) else path.lstrip("/")
        dirs.append(Path(point) / ("" if rel == "." else rel))
    return dirs


def _enter_cgroups(name: str, log: Any) -> list[Path]:
    """Move this process (and so nspawn) into its own cgroup ``name`` in every hierarchy.

    Without a host systemd, nspawn would stay in the host's root cgroups, and every node's
    systemd would share one /system.slice tree.
    """
    created = []
    for parent in cgroup_dirs():
        target = parent / name
        try:
            target.mkdir(exist_ok=True)
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (target / knob).exists() and not (target / knob).read_text().strip():
                    (target / knob).write_text((parent / knob).read_text())
            (target / "cgroup.procs").write_text(f"{os.getpid()}\n")
            created.append(target)
        except OSError as exc:
            log.write(f"=== lab supervisor: cgroup {target}: {exc} ===\n".encode())
    return created


def _leave_cgroups(created: list[Path]) -> None:
    for target in created:
        with contextlib.suppress(OSError):
            (target.parent / "cgroup.procs").write_text(f"{os.getpid()}\n")
        for dirpath, _dirs, _files in os.walk(target, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)


def supervise(cfg: dict[str, Any]) -> int:
    pidfile = Path(cfg["pidfile"])
    statefile = Path(cfg["statefile"])
    log_path = Path(cfg["console_log"])
    argv: list[str] = cfg["argv"]
    env = {**os.environ, **cfg.get("env", {})}
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def on_term(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)  # nspawn --boot: poweroff the container

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    pidfile.write_text(f"{os.getpid()}\n")
    boots = 0
    rc = 0
    with log_path.open("ab") as log:
        cgroups = _enter_cgroups(cfg["cgroup"], log) if cfg.get("cgroup") else []
    try:
        while not stopping:
            boots += 1
            with log_path.open("ab") as log:
                log.write(f"\n=== lab supervisor: boot {boots} at {time.ctime()} ===\n".encode())
                log.flush()
                child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         env=env)
                _write_state(statefile, state="running", boots=boots, nspawn_pid=child.pid,
                             started=time.time())
                deadline: float | None = None
                while True:
                    try:
                        rc = child.wait(timeout=1.0)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    if stopping:
                        if deadline is None:
                            deadline = time.monotonic() + STOP_GRACE_S
                        elif time.monotonic() > deadline:
                            os.killpg(child.pid, signal.SIGKILL)
                log.write(f"=== lab supervisor: nspawn exited {rc} ===\n".encode())
            child = None
            if rc != REBOOT_EXIT:
                break
            # LAB FAULT HOOK (tests/lab/product/test_faults.py, Lab.stay_down_after_reboot): a
            # node whose "stay-down" file exists does not boot again after a reboot (a box that
            # never comes back); the file is used up
            stay = pidfile.with_name("stay-down")
            if stay.exists():
                with contextlib.suppress(OSError):
                    stay.unlink()
                with log_path.open("ab") as log:
                    log.write(b"=== lab supervisor: FAULT HOOK: staying down after reboot ===\n")
                break
            _write_state(statefile, state="rebooting", boots=boots, nspawn_pid=None,
                         started=time.time())
        _write_state(statefile, state="stopped", boots=boots, nspawn_pid=None, exit_code=rc,
                     stopped_by_lab=stopping, started=time.time())
    finally:
        _leave_cgroups(cgroups)
        try:
            if pidfile.read_text().strip() == str(os.getpid()):
                pidfile.unlink()
        except OSError:
            pass
    return 0


def main() -> int:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    _daemonize()
    return supervise(cfg)


if __name__ == "__main__":
    sys.exit(main())
