# LAB STAND-IN: not part of real Kubernetes. Test infrastructure for gpuk8s; never shipped.
"""Facts about the node the stand-ins read from its real state (containerd, swap, sysctls); its
GPUs are gpuview.py's."""

from __future__ import annotations

import copy
import os
import re
import shutil
import socket
import tomllib
from collections.abc import Callable
from typing import Any

from .common import ROOT_ENV, P, read, run

CRI_SOCKET = "unix:///var/run/containerd/containerd.sock"
# Lab-only hook: tests point this at a fake /proc/swaps (nodes read the real one).
SWAPS_ENV = "GPUK8S_LAB_PROC_SWAPS"


#: what the containerd reads below (and the GPU view's nvidia-smi questions) last gave, with
#: the key they were read for: the kubelet stand-in asks every sync (every 2 s on every node),
#: and each ask was a run of a program; the answers change only with what their keys hold
_MEMO: dict[str, tuple[Any, Any]] = {}


def memo(name: str, key: Any, read_it: Callable[[], Any], rooted: bool = False) -> Any:
    """``read_it()``, or what it gave last for the same ``key``. ``rooted``: the key reads
    its files under $GPUK8S_LAB_ROOT, so the memo holds in the stand-ins' own tests too."""
    if os.environ.get(ROOT_ENV) and not rooted:
        # the stand-ins' own tests on this host script containerd's answers (from files of
        # theirs, not /etc/containerd): asked every time there
        return read_it()
    if key is not None and name in _MEMO and _MEMO[name][0] == key:
        return copy.deepcopy(_MEMO[name][1])
    value = read_it()
    if key is not None:
        _MEMO[name] = (key, copy.deepcopy(value))
    return value


def stat_key(path: str) -> tuple[Any, ...]:
    try:
        st = os.stat(path)
    except OSError:
        return (path,)
    return (path, st.st_ino, st.st_size, st.st_mtime_ns)


def _binary_key() -> tuple[Any, ...]:
    """The containerd binary on PATH, as it is now (an upgrade changes it)."""
    return stat_key(shutil.which("containerd") or "containerd")


def _config_key() -> tuple[Any, ...]:
    """What `containerd config dump` reads: the binary and every file under /etc/containerd
    (config.toml and the drop-ins it imports)."""
    files = []
    for folder, _, names in os.walk(P("/etc/containerd")):
        files += [stat_key(os.path.join(folder, n)) for n in sorted(names)]
    return (_binary_key(), *sorted(files))


def _daemon_key() -> tuple[Any, ...] | None:
    """The running containerd (its pid and start time; a restart changes them), or None."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if stat[stat.index("(") + 1:stat.rindex(")")] == "containerd":
            return (pid, stat[stat.rindex(")") + 2:].split()[19], _binary_key())
    return None


def socket_path(endpoint: str) -> str:
    return endpoint[len("unix://"):] if endpoint.startswith("unix://") else endpoint


def cri_error(endpoint: str = CRI_SOCKET) -> str | None:
    """None when the CRI v1 runtime service answers, else the error text kubeadm/crictl print."""
    path = socket_path(endpoint)
    real = P(path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect(real)
    except OSError as e:
        why = "no such file or directory" if isinstance(e, FileNotFoundError) else (
            "connection refused" if isinstance(e, ConnectionRefusedError) else str(e.strerror))
        return (f'validate service connection: validate CRI v1 runtime API for endpoint '
                f'"{endpoint}": rpc error: code = Unavailable desc = connection error: desc = '
                f'"transport: Error while dialing: dial unix {path}: connect: {why}"')
    finally:
        s.close()
    ok, _ = cri_plugin()
    if not ok:
        return (f'validate service connection: CRI v1 runtime API is not implemented for '
                f'endpoint "{endpoint}": rpc error: code = Unimplemented desc = unknown service '
                "runtime.v1.RuntimeService")
    return None


def cri_plugin() -> tuple[bool, str]:
    """The cri row of the REAL `ctr plugins ls` (io.containerd.grpc.v1 cri ... ok), asked
    again when containerd restarts (plugins load when it starts)."""
    result: tuple[bool, str] = memo("plugins", _daemon_key(), _cri_plugin)
    if not result[0]:
        # a containerd just started may not have its CRI plugin up yet: ask again next time
        # (the real kubelet asks the runtime's status on every sync); remembering the failure
        # for the daemon's lifetime left a node NotReady for good (CI of e7832df)
        _MEMO.pop("plugins", None)
    return result


def _cri_plugin() -> tuple[bool, str]:
    p = run(["ctr", "plugins", "ls"])
    if p.returncode != 0:
        return False, (p.stderr or p.stdout).strip()
    for line in p.stdout.splitlines():
        cols = line.split()
        if len(cols) >= 2 and cols[0] == "io.containerd.grpc.v1" and cols[1] == "cri":
            return cols[-1] == "ok", line.strip()
    return False, "cri plugin not loaded"


def unit_active(unit: str) -> bool:
    """Whether a systemd service runs, read from its cgroup (a process in it) instead of asked
    of ``systemctl is-active``: the kubelet stand-in asks for containerd, its static pods and
    its real pods on every sync, and each ask was a process and a D-Bus call into systemd.
    The stand-ins' own tests (under $GPUK8S_LAB_ROOT) script systemctl: asked there."""
    if not os.environ.get(ROOT_ENV):
        name = unit if unit.endswith(".service") else f"{unit}.service"
        # cgroup v1 (systemd's named hierarchy, what this host gives the lab), else v2
        for base in ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup"):
            if os.path.isdir(f"{base}/system.slice"):
                try:
                    with open(f"{base}/system.slice/{name}/cgroup.procs") as f:
                        return bool(f.read().strip())
                except OSError:
                    return False  # systemd removes a stopped unit's cgroup
    return run(["systemctl", "is-active", "--quiet", unit]).returncode == 0


def containerd_active() -> bool:
    return unit_active("containerd")


def containerd_config() -> dict[str, Any]:
    """The REAL `containerd config dump`, asked again when a file it reads changes."""
    result: dict[str, Any] = memo("config", _config_key(), _containerd_config)
    return result


def _containerd_config() -> dict[str, Any]:
    p = run(["containerd", "config", "dump"])
    if p.returncode != 0:
        return {}
    try:
        return tomllib.loads(p.stdout)
    except tomllib.TOMLDecodeError:
        return {}


def _runtime_section(cfg: dict[str, Any]) -> dict[str, Any]:
    plugins = cfg.get("plugins") or {}
    if "io.containerd.cri.v1.runtime" in plugins:  # config version 3 (containerd 2.x)
        return (plugins["io.containerd.cri.v1.runtime"] or {}).get("containerd") or {}
    return ((plugins.get("io.containerd.grpc.v1.cri") or {}).get("containerd")) or {}


def runtime_handlers(cfg: dict[str, Any]) -> list[str]:
    return sorted((_runtime_section(cfg).get("runtimes") or {}).keys())


def default_runtime(cfg: dict[str, Any]) -> str:
    return _runtime_section(cfg).get("default_runtime_name") or "runc"


def systemd_cgroup(cfg: dict[str, Any]) -> bool | None:
    """SystemdCgroup of the default runtime's options (None when containerd gave no config)."""
    if not cfg:
        return None
    rt = (_runtime_section(cfg).get("runtimes") or {}).get(default_runtime(cfg)) or {}
    return bool((rt.get("options") or {}).get("SystemdCgroup", False))


def containerd_version() -> str:
    """The REAL `containerd --version`, asked again when the binary changes."""
    result: str = memo("version", _binary_key(), _containerd_version)
    return result


def _containerd_version() -> str:
    p = run(["containerd", "--version"])
    m = re.search(r"\sv?(\d+\.\d+\.\d+[^\s]*)", p.stdout or "")
    return m.group(1) if m else ""


def swap_on() -> bool:
    path = os.environ.get(SWAPS_ENV) or "/proc/swaps"
    try:
        with open(path) as f:
            lines = [ln for ln in f.read().splitlines() if ln.strip()]
    except OSError:
        return False
    return len(lines) > 1


def cgroup_v1() -> bool:
    """True when /sys/fs/cgroup is not the unified (v2) hierarchy. Lab-only hook:
    GPUK8S_LAB_CGROUP=v1|v2 forces the answer in unit tests."""
    forced = os.environ.get("GPUK8S_LAB_CGROUP")
    if forced:
        return forced == "v1"
    try:
        return os.statvfs("/sys/fs/cgroup") is not None and \
            not os.path.exists("/sys/fs/cgroup/cgroup.controllers")
    except OSError:
        return False


def sysctl(name: str) -> str | None:
    v = read("/proc/sys/" + name.replace(".", "/"))
    return v.strip() if v is not None else None


def read_abs(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def os_image() -> str:
    text = read("/etc/os-release") or ""
    m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', text, re.M)
    return m.group(1) if m else "Linux"


def kernel() -> str:
    return os.uname().release


def mem_ki() -> int:
    text = read_abs("/proc/meminfo") or ""
    m = re.search(r"MemTotal:\s+(\d+) kB", text)
    return int(m.group(1)) if m else 0


def hostname() -> str:
    return (read("/etc/hostname") or socket.gethostname()).strip().lower()


def ipv4() -> str:
    p = run(["hostname", "-I"])
    for a in (p.stdout or "").split():
        if ":" not in a and not a.startswith("127."):
            return a
    return "127.0.0.1"


def installed_version(package: str) -> str:
    """The installed Debian version of ``package`` ("" when it is not installed)."""
    p = run(["dpkg-query", "-W", "-f=${Version}", package])
    return p.stdout.strip() if p.returncode == 0 else ""
