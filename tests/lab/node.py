"""One lab node on the host: overlay rootfs, per-node files, netns, supervisor, stop."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from . import fakepci, net
from .paths import (
    CGROUP_PREFIX,
    HOST_IP,
    INSTANCE,
    NODE_SHARED_DIR,
    PREFIX_LEN,
    REPO_URL,
    LabError,
    cache_dir,
    run,
    shared_dir,
    state_dir,
)
from .supervisor import cgroup_dirs
from .topology import NodeSpec, Topology

SUPERVISOR = Path(__file__).with_name("supervisor.py")
LABADMIN_UID = 1000


def node_dir(name: str) -> Path:
    return state_dir() / "nodes" / name


def merged_dir(name: str) -> Path:
    return node_dir(name) / "merged"


def upper_dir(name: str) -> Path:
    return node_dir(name) / "upper"


def is_mounted(path: Path) -> bool:
    target = str(path)
    with open("/proc/mounts") as fh:
        return any(line.split()[1] == target for line in fh)


def lab_mounts() -> list[str]:
    """Mount points under the state dir, deepest first."""
    root = str(state_dir()).rstrip("/") + "/"
    with open("/proc/mounts") as fh:
        points = [line.split()[1] for line in fh]
    return sorted({p for p in points if p.startswith(root)}, key=len, reverse=True)


def mount_overlay(name: str, base: Path) -> Path:
    nd = node_dir(name)
    for sub in ("upper", "work", "merged"):
        (nd / sub).mkdir(parents=True, exist_ok=True)
    merged = nd / "merged"
    if not is_mounted(merged):
        opts = f"lowerdir={base},upperdir={nd / 'upper'},workdir={nd / 'work'}"
        run(["mount", "-t", "overlay", f"gk8s-{name}", "-o", opts, merged])
    return merged


def unmount_overlay(name: str) -> None:
    merged = merged_dir(name)
    if is_mounted(merged):
        proc = run(["umount", merged], check=False)
        if proc.returncode != 0:
            run(["umount", "-l", merged], check=False)


def _write(root: Path, rel: str, text: str, mode: int = 0o644, uid: int = 0) -> None:
    path = root / rel.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".lab-tmp")
    tmp.write_text(text)
    os.chown(tmp, uid, uid)
    tmp.chmod(mode)
    tmp.replace(path)


def host_pubkey(name: str) -> str:
    return (merged_dir(name) / "etc/ssh/ssh_host_ed25519_key.pub").read_text().strip()


def prepare(spec: NodeSpec, topo: Topology, base: Path, *, root_pubkey: str,
            password_hash: str) -> None:
    """Mount the overlay and write every per-node file. Safe to repeat before each start."""
    root = mount_overlay(spec.name, base)
    _write(root, "/etc/hostname", f"{spec.name}\n")
    # apt through apt-cacher-ng: a stalled upstream once left an `apt-get update` waiting
    # for good on a half-closed connection; no pipelining, a read timeout and retries
    _write(root, "/etc/apt/apt.conf.d/02gpuk8s-lab-http",
           'Acquire::http::Pipeline-Depth "0";\nAcquire::http::Timeout "30";\n'
           'Acquire::Retries "3";\n')
    hosts = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
             f"{HOST_IP}\tlabhost", *(f"{n.ip}\t{n.name}" for n in topo.nodes)]
    _write(root, "/etc/hosts", "\n".join(hosts) + "\n")
    mid = root / "etc/machine-id"
    if not mid.exists() or len(mid.read_text().strip()) != 32:
        _write(root, "/etc/machine-id", uuid.uuid4().hex + "\n", 0o444)
    key = root / "etc/ssh/ssh_host_ed25519_key"
    if not key.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{spec.name}",
             "-f", key])
    # DMI ids: mounted over /sys/class by gpuk8s-lab-early.service inside the node
    dmi = root / "etc/gpuk8s-lab/sysclass/dmi/id"
    if not (dmi / "product_uuid").exists():
        _write(root, str(dmi.relative_to(root) / "product_uuid"), f"{uuid.uuid4()}\n", 0o400)
    for fname, text in {"sys_vendor": "gpuk8s-lab", "product_name": "lab node (nspawn)",
                        "board_vendor": "gpuk8s-lab", "chassis_vendor": "gpuk8s-lab"}.items():
        _write(root, str(dmi.relative_to(root) / fname), text + "\n", 0o444)
    for home, uid in (("/root", 0), (f"/home/{'labadmin'}", LABADMIN_UID)):
        sshdir = root / home.lstrip("/") / ".ssh"
        sshdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chown(sshdir, uid, uid)
        _write(root, f"{home}/.ssh/authorized_keys", root_pubkey.strip() + "\n", 0o600, uid)
    _set_password(root, "labadmin", password_hash)
    # eth0's address and route are set from the host in the node's netns (net.py), which lives
    # across reboots; networkd leaves it alone
    _write(root, "/etc/systemd/network/10-gpuk8s-lab.network",
           f"# {spec.ip}/{PREFIX_LEN} via {HOST_IP}: configured by the lab host\n"
           "[Match]\nName=eth0\n\n[Link]\nUnmanaged=yes\n")
    _lab_kernel_source(root)


def _set_password(root: Path, user: str, password_hash: str) -> None:
    shadow = root / "etc/shadow"
    lines = shadow.read_text().splitlines()
    out = []
    for line in lines:
        fields = line.split(":")
        if fields[0] == user:
            fields[1] = password_hash
            line = ":".join(fields)
        out.append(line)
    _write(root, "/etc/shadow", "\n".join(out) + "\n", 0o640)
    shadow_gid = _gid(root, "shadow")
    os.chown(shadow, 0, shadow_gid)


def _gid(root: Path, group: str) -> int:
    for line in (root / "etc/group").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == group:
            return int(fields[2])
    return 0


def _lab_kernel_source(root: Path) -> None:
    """Add the lab-kernel repo only once it is built, so apt-get update never fails on it."""
    src = root / "etc/apt/sources.list.d/gpuk8s-lab-kernel.list"
    www = cache_dir() / "repos" / "www" / "lab-kernel"
    gpg = cache_dir() / "repos" / "lab-key.gpg"
    if not www.is_dir():
        src.unlink(missing_ok=True)
        return
    if gpg.is_file():
        keyring = root / "etc/apt/keyrings/gpuk8s-lab.gpg"
        keyring.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(gpg, keyring)
        keyring.chmod(0o644)
        opts = "signed-by=/etc/apt/keyrings/gpuk8s-lab.gpg"
    else:
        opts = "trusted=yes"
    _write(root, str(src.relative_to(root)), f"deb [{opts}] {REPO_URL}/lab-kernel/ /\n")


def nspawn_argv(spec: NodeSpec) -> list[str]:
    nd = node_dir(spec.name)
    return [
        # not --boot: PID 1 is a wrapper that fixes mounts up and execs systemd (base.py)
        "systemd-nspawn", "--quiet", "--register=no", "--keep-unit",
        "--kill-signal=SIGRTMIN+3",
        # nspawn keeps /run/systemd/nspawn/propagate/<machine> while it runs: the second lab
        # instance's names must not be the first's
        f"--machine={spec.name if INSTANCE == 0 else f'lab{INSTANCE}-{spec.name}'}",
        f"--hostname={spec.name}",
        f"--directory={nd / 'merged'}",
        f"--network-namespace-path={net.netns_path(spec.name)}",
        "--capability=all",
        "--system-call-filter=@keyring bpf",
        "--resolv-conf=off", "--timezone=off", "--link-journal=no",
        "--console=read-only",
        f"--bind-ro={nd / 'pci'}:/sys/bus/pci/devices",
        f"--bind={shared_dir()}:{NODE_SHARED_DIR}",
        "/usr/local/sbin/gpuk8s-lab-init",
    ]


def start(spec: NodeSpec) -> None:
    """Fresh netns + fake PCI folder, then launch the supervisor (which boots nspawn)."""
    nd = node_dir(spec.name)
    if supervisor_pid(spec.name) is not None:
        return
    fakepci.build(nd / "pci", spec)
    shared = shared_dir()
    shared.mkdir(parents=True, exist_ok=True)
    (shared / "LAB-SHARED-FOLDER").write_text(
        "gpuk8s lab: this folder stands in for the NFS export of `invoke deploy storage`; "
        "every lab node sees it at " + NODE_SHARED_DIR + "\n")
    net.setup_node_net(spec.name, spec.ip)
    cfg: dict[str, Any] = {
        "name": spec.name,
        "pidfile": str(nd / "supervisor.pid"),
        "statefile": str(nd / "supervisor.json"),
        "console_log": str(nd / "console.log"),
        "argv": nspawn_argv(spec),
        "cgroup": f"{CGROUP_PREFIX}{spec.name}",
    }
    (nd / "supervisor.cfg.json").write_text(json.dumps(cfg, indent=1) + "\n")
    (nd / "supervisor.pid").unlink(missing_ok=True)
    subprocess.run([sys.executable, str(SUPERVISOR), str(nd / "supervisor.cfg.json")],
                   check=True, stdin=subprocess.DEVNULL, close_fds=True)
    deadline = time.monotonic() + 10
    while supervisor_pid(spec.name) is None:
        if time.monotonic() > deadline:
            raise LabError(f"{spec.name}: supervisor did not start; see {nd / 'console.log'}")
        time.sleep(0.05)


def supervisor_pid(name: str) -> int | None:
    return net.read_pid(node_dir(name) / "supervisor.pid")


def supervisor_state(name: str) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((node_dir(name) / "supervisor.json").read_text())
        return data
    except (OSError, ValueError):
        return {}


def signal_stop(name: str) -> int | None:
    pid = supervisor_pid(name)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    return pid


def wait_stopped(name: str, pid: int | None, timeout: float = 90.0) -> None:
    """Wait for the supervisor (and its nspawn) to exit; kill what is left after ``timeout``."""
    deadline = time.monotonic() + timeout
    while pid is not None and net.pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid is not None and net.pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for npid in nspawn_pids(name):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(npid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(npid, signal.SIGKILL)
    kill_cgroups(name)


def nspawn_pids(name: str | None = None) -> list[int]:
    """systemd-nspawn processes of this lab (by their --directory under the state dir)."""
    want = str(node_dir(name) / "merged") if name else str(state_dir() / "nodes") + "/"
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith(b"systemd-nspawn"):
            continue
        for arg in argv:
            if arg.startswith(b"--directory=") and arg.decode(errors="replace")[12:].startswith(
                    want):
                pids.append(int(entry.name))
    return pids


def lab_cgroups(name: str | None = None) -> list[Path]:
    """The per-node cgroup dirs (every hierarchy) that supervisors created."""
    pattern = f"{CGROUP_PREFIX}{name}" if name else f"{CGROUP_PREFIX}*"
    return [d for parent in cgroup_dirs() for d in parent.glob(pattern) if d.is_dir()]


def cgroup_pids(dirs: list[Path]) -> set[int]:
    pids: set[int] = set()
    for d in dirs:
        for procs in d.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def kill_cgroups(name: str | None = None, timeout: float = 10.0) -> None:
    """SIGKILL whatever still runs in a node's cgroups (a container orphaned by a killed
    nspawn keeps running), then remove the cgroup dirs."""
    dirs = lab_cgroups(name)
    deadline = time.monotonic() + timeout
    while (pids := cgroup_pids(dirs) - {os.getpid()}) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    for d in dirs:
        for dirpath, _dirs, _files in os.walk(d, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)


def supervisor_pids_all() -> list[int]:
    pids = []
    for pidfile in (state_dir() / "nodes").glob("*/supervisor.pid"):
        pid = net.read_pid(pidfile)
        if pid is not None:
            pids.append(pid)
    return pids
