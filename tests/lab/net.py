"""Host networking of the lab: bridge, per-node netns + veth, isolation, apt-cacher-ng."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from .lock import others_in_use
from .paths import (
    BRIDGE,
    BRIDGE_MAC,
    HOST_IP,
    INSTANCE,
    IPTABLES_COMMENT,
    NETNS_PREFIX,
    PREFIX_LEN,
    PROXY_PORT,
    VETH_PREFIX,
    LabError,
    cache_dir,
    own_veth_octet,
    run,
    services_dir,
)

SYSCTLS = {
    "fs/inotify/max_user_instances": 8192,
    "fs/inotify/max_user_watches": 1048576,
    "fs/inotify/max_queued_events": 65536,
}


def tune_host() -> None:
    """Raise inotify limits (each booted systemd needs several instances)."""
    for key, want in SYSCTLS.items():
        path = Path("/proc/sys") / key
        try:
            if int(path.read_text()) < want:
                path.write_text(f"{want}\n")
        except OSError as exc:
            print(f"lab: warning: cannot set {key}={want}: {exc}")


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def netns_name(node: str) -> str:
    return f"{NETNS_PREFIX}{node}"


def netns_path(node: str) -> Path:
    return Path("/run/netns", netns_name(node))


def veth_name(ip: str) -> str:
    return f"{VETH_PREFIX}{ip.rsplit('.', 1)[1]}"


def ensure_bridge() -> None:
    if not link_exists(BRIDGE):
        run(["ip", "link", "add", BRIDGE, "address", BRIDGE_MAC, "type", "bridge"])
    mac = Path(f"/sys/class/net/{BRIDGE}/address").read_text().strip()
    if mac != BRIDGE_MAC:   # a bridge made before the fixed MAC: set it (it then stays)
        run(["ip", "link", "set", BRIDGE, "address", BRIDGE_MAC])
    addrs = run(["ip", "-o", "-4", "addr", "show", "dev", BRIDGE]).stdout
    if f"{HOST_IP}/{PREFIX_LEN}" not in addrs:
        run(["ip", "addr", "add", f"{HOST_IP}/{PREFIX_LEN}", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])
    _isolate()


def _iptables_rule() -> list[str]:
    return ["FORWARD", "-i", BRIDGE, "!", "-o", BRIDGE, "-m", "comment",
            "--comment", IPTABLES_COMMENT, "-j", "DROP"]


def _isolate() -> None:
    """No NAT and no forwarding out of the bridge: nodes reach only the host."""
    rule = _iptables_rule()
    try:
        if run(["iptables", "-C", *rule], check=False).returncode != 0:
            run(["iptables", "-I", *rule])
    except (OSError, LabError) as exc:
        print(f"lab: warning: iptables isolation rule not set: {exc}")


def remove_bridge() -> None:
    with contextlib.suppress(OSError):
        while run(["iptables", "-D", *_iptables_rule()], check=False).returncode == 0:
            pass
    if link_exists(BRIDGE):
        run(["ip", "link", "del", BRIDGE], check=False)


def setup_node_net(node: str, ip: str) -> None:
    """Create netns gk8s-<node> with eth0 = ip/24 (default via the host), veth on the bridge."""
    ns = netns_name(node)
    veth = veth_name(ip)
    teardown_node_net(node, ip)
    run(["ip", "netns", "add", ns])
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
    run(["ip", "link", "set", veth, "master", BRIDGE, "up"])
    nsx = ["ip", "-n", ns]
    run([*nsx, "link", "set", "lo", "up"])
    run([*nsx, "addr", "add", f"{ip}/{PREFIX_LEN}", "dev", "eth0"])
    run([*nsx, "link", "set", "eth0", "up"])
    run([*nsx, "route", "add", "default", "via", HOST_IP])


def teardown_node_net(node: str, ip: str | None = None) -> None:
    if ip is not None and link_exists(veth_name(ip)):
        run(["ip", "link", "del", veth_name(ip)], check=False)
    if netns_path(node).exists():
        run(["ip", "netns", "del", netns_name(node)], check=False)


def leftover_netns() -> list[str]:
    out = run(["ip", "netns", "list"], check=False).stdout or ""
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if n.startswith(NETNS_PREFIX)]


def leftover_veths() -> list[str]:
    """This instance's node veths (gk8v<last octet of its address>)."""
    try:
        names = os.listdir("/sys/class/net")
    except OSError:
        return []
    busy = INSTANCE == 0 and others_in_use()
    return sorted(n for n in names if n.startswith(VETH_PREFIX)
                  and n[len(VETH_PREFIX):].isdigit()
                  and own_veth_octet(int(n[len(VETH_PREFIX):]), busy))


def cleanup_all_net() -> None:
    """This instance's node networks (Lab.down removes the bridge when no other instance is
    in use)."""
    for veth in leftover_veths():
        run(["ip", "link", "del", veth], check=False)
    for ns in leftover_netns():
        run(["ip", "netns", "del", ns], check=False)


# ---------------------------------------------------------------- apt-cacher-ng

ACNG_CONF = """\
# written by tests/lab/net.py
CacheDir: {cache}
LogDir: {logs}
SupportDir: /usr/lib/apt-cacher-ng
Port: {port}
BindAddress: {host}
PidFile: {pidfile}
SocketPath: {socket}
Remap-debrep: file:deb_mirror*.gz /debian ; file:backends_debian
Remap-secdeb: security.debian.org security.debian.org/debian-security \
deb.debian.org/debian-security /debian-security ; deb.debian.org/debian-security
ReportPage: acng-report.html
ExThreshold: 4
FollowIndexFileRemoval: 1
"""


def _acng_paths() -> dict[str, Path]:
    run_dir = services_dir()
    return {
        "conf": cache_dir() / "apt-cacher-ng" / "conf",
        "cache": cache_dir() / "apt-cacher-ng" / "cache",
        "logs": run_dir / "apt-cacher-ng",
        "pidfile": run_dir / "apt-cacher-ng.pid",
        "socket": run_dir / "apt-cacher-ng.socket",
    }


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def answers(host: str, port: int, tries: int = 3, timeout: float = 3.0) -> bool:
    """Whether a running shared service listens: patient, since a busy host (two labs on
    two cores) can be slow to accept, and a wrong "no" would restart it under the other lab."""
    return any(port_open(host, port, timeout) for _ in range(tries))


def read_pid(pidfile: Path, program: str | None = None) -> int | None:
    """The live process a pid file names; with ``program``, only if its command line holds
    that word (a pid file left behind in /run may name an unrelated process by now)."""
    try:
        pid = int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if not pid_alive(pid):
        return None
    return pid if program is None or runs(pid, program) else None


def runs(pid: int, program: str) -> bool:
    """Whether process ``pid``'s command line holds ``program``."""
    try:
        return program.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie counts as dead
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def start_proxy(timeout: float = 20.0) -> None:
    """Start apt-cacher-ng on HOST_IP:3142 (config and cache under the cache dir)."""
    p = _acng_paths()
    if read_pid(p["pidfile"], "apt-cacher-ng") and answers(HOST_IP, PROXY_PORT):
        return
    for key in ("conf", "cache", "logs"):
        p[key].mkdir(parents=True, exist_ok=True)
    p["pidfile"].parent.mkdir(parents=True, exist_ok=True)
    (p["conf"] / "acng.conf").write_text(
        ACNG_CONF.format(
            cache=p["cache"], logs=p["logs"], port=PROXY_PORT, host=HOST_IP,
            pidfile=p["pidfile"], socket=p["socket"],
        )
    )
    (p["conf"] / "backends_debian").write_text("http://deb.debian.org/debian/\n")
    subprocess.run(
        ["apt-cacher-ng", "-c", str(p["conf"]), "ForeGround=0"],
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_open(HOST_IP, PROXY_PORT):
            return
        time.sleep(0.1)
    raise LabError(f"apt-cacher-ng did not listen on {HOST_IP}:{PROXY_PORT}; see {p['logs']}")


def stop_proxy() -> None:
    p = _acng_paths()
    pid = read_pid(p["pidfile"], "apt-cacher-ng")
    if pid is None:
        with contextlib.suppress(OSError):
            p["pidfile"].unlink()
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        p["pidfile"].unlink()
