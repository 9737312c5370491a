"""The lab as a whole: ``Lab().up()``, ``.down()``, ``.status()``, ``.ssh()``, snapshots."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from . import base, images, net, node, registry
from .lock import HOST_LOCK_PATH, acquire, others_in_use
from .paths import (
    LAB_KEY_FINGERPRINT,
    LabError,
    cache_dir,
    run,
    shared_dir,
    state_dir,
)
from .topology import NodeSpec, Topology, write_inventory

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Node:
    name: str
    ip: str
    gpus: int
    gpu_model: str | None = None
    role: str = "worker"

    @classmethod
    def of(cls, spec: NodeSpec) -> Node:
        return cls(spec.name, spec.ip, spec.gpus, spec.gpu_model, spec.role)


@dataclass(frozen=True)
class NodeStatus:
    name: str
    ip: str
    state: str  # up | booting | rebooting | down
    boot_id: str
    gpus: str
    boots: int = 0


def _parallel(fn: Callable[[T], R], items: Sequence[T], workers: int = 16) -> list[R]:
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(items)))) as pool:
        return list(pool.map(fn, items))


def sshd_ready(ip: str, timeout: float = 1.0) -> bool:
    """True once something on ip:22 sends an SSH banner."""
    try:
        with socket.create_connection((ip, 22), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False



def _lab_sources() -> str:
    """A digest of what the lab installs on nodes beside the base image: the stand-ins and the
    lab packages' definitions (a bootstrapped snapshot holds the binaries built from them)."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for sub in ("standins", "packages"):
        for path in sorted((root / sub).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def snapshot_inputs() -> str:
    """What a snapshot's nodes were built from: the base image, the lab signing key and the
    lab's stand-ins and packages."""
    return (f"base {base.base_key()}\nlab-key {LAB_KEY_FINGERPRINT}\n"
            f"lab-sources {_lab_sources()}\n")

class Lab:
    """Booted Debian 12 system containers on one bridge, reachable over real SSH."""

    def __init__(self) -> None:
        self.state = state_dir()
        self.cache = cache_dir()

    # ------------------------------------------------------------ paths

    @property
    def ssh_key(self) -> Path:
        return self.state / "ssh" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state / "ssh" / "known_hosts"

    @property
    def password_file(self) -> Path:
        return self.state / "secrets" / "labadmin.password"

    @property
    def inventory_path(self) -> Path:
        return self.state / "inventory.yaml"

    @property
    def become_inventory_path(self) -> Path:
        return self.state / "inventory-become.yaml"

    @property
    def topology_file(self) -> Path:
        return self.state / "topology.yaml"

    @property
    def labadmin_password(self) -> str:
        return self.password_file.read_text().strip()

    def topology(self) -> Topology | None:
        if not self.topology_file.is_file():
            return None
        return Topology.from_yaml(self.topology_file)

    def nodes(self) -> list[Node]:
        topo = self.topology()
        return [Node.of(s) for s in topo.nodes] if topo else []

    def node(self, name: str | Node) -> Node:
        if isinstance(name, Node):
            return name
        topo = self.topology()
        if topo is None:
            raise LabError("the lab is not up (no topology in the state dir)")
        return Node.of(topo.node(name))

    # ------------------------------------------------------------ up / down

    def is_up(self, topology: Topology | None = None) -> bool:
        """All nodes of the current (or given) topology supervised and answering ssh."""
        current = self.topology()
        if current is None or (topology is not None and current.to_yaml() != topology.to_yaml()):
            return False
        key = self.state / "base-key"
        if not key.is_file() or key.read_text().strip() != base.base_key():
            return False
        return all(node.supervisor_pid(s.name) is not None and sshd_ready(s.ip)
                   for s in current.nodes)

    def up(self, topology: Topology | str | Path | None = None, *,
           timeout: float | None = None, reuse: bool = True) -> list[Node]:
        """Boot the lab (default topology unless given); return its nodes once sshd answers.

        If the same topology is already up and healthy, it is reused (unless ``reuse=False``);
        otherwise leftovers of an earlier run are cleaned up first.
        """
        topo = topology if isinstance(topology, Topology) else Topology.load(topology)
        if reuse and self.is_up(topo):
            print(f"lab: already up ({len(topo.nodes)} nodes)", flush=True)
            # packages edited since it came up: the repos the nodes install from catch up
            # (each .deb is cached by its content, so this is a second when nothing changed)
            with self._host_locked():
                self._repos("build_all")
            return self.nodes()
        t0 = time.monotonic()
        self.down(quiet=True)
        rootfs = self._host_up()
        self.topology_file.write_text(topo.to_yaml())
        t1 = time.monotonic()
        self._boot(topo, rootfs, timeout=timeout)
        t2 = time.monotonic()
        write_inventory(topo, self.inventory_path)
        write_inventory(topo, self.become_inventory_path, become_user=True)
        names = ", ".join(f"{s.name}={s.ip}{'/' + s.gpu_label if s.gpus else ''}"
                          for s in topo.nodes[:8])
        more = f", +{len(topo.nodes) - 8} more" if len(topo.nodes) > 8 else ""
        print(f"lab: up {len(topo.nodes)} nodes ({names}{more}) booted in {t2 - t1:.1f} s "
              f"(total {t2 - t0:.1f} s); inventory {self.inventory_path}", flush=True)
        return self.nodes()

    @staticmethod
    @contextlib.contextmanager
    def _host_locked() -> Iterator[None]:
        """The host's shared part (bridge, services, caches) is built, started and stopped
        by one instance at a time."""
        lock = acquire("lab host", HOST_LOCK_PATH)
        try:
            yield
        finally:
            lock.close()

    def _host_up(self) -> Path:
        with self._host_locked():
            return self._host_up_locked()

    def _host_up_locked(self) -> Path:
        for d in (self.state / "ssh", self.state / "secrets", self.state / "nodes"):
            d.mkdir(parents=True, exist_ok=True)
        (self.state / "secrets").chmod(0o700)
        net.tune_host()
        net.ensure_bridge()
        net.start_proxy()
        rootfs = base.ensure_base()
        (self.state / "base-key").write_text(base.base_key() + "\n")
        self._drop_stale_snapshots()
        self._repos("ensure_served")
        self._registry_up()
        if not self.ssh_key.exists():
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuk8s-lab",
                 "-f", self.ssh_key])
        if not self.password_file.exists():
            self.password_file.touch(mode=0o600)
            self.password_file.write_text(secrets.token_urlsafe(12) + "\n")
        self.password_file.chmod(0o600)
        return rootfs

    @staticmethod
    def _registry_up() -> None:
        """The registry the lab inventory's registry_mirrors name, holding the workloads' lab
        images (built once into the cache, pushed when missing: well under a second when
        both are there; a cold build takes minutes)."""
        registry.start()
        t0 = time.monotonic()
        pushed = images.ensure_images()
        if time.monotonic() - t0 > 5:
            print(f"lab: {len(pushed)} lab images in the registry "
                  f"({time.monotonic() - t0:.0f} s)", flush=True)

    def _drop_stale_snapshots(self) -> None:
        """Snapshots are overlay upper dirs: they are only valid on the base they were made on."""
        snaps = self.state / "snapshots"
        if not snaps.is_dir():
            return
        for snap in snaps.iterdir():
            key = snap / "base-key"
            if key.is_file() and key.read_text().strip() == base.base_key():
                continue
            print(f"lab: removing snapshot {snap.name!r}: made on another base image", flush=True)
            shutil.rmtree(snap, ignore_errors=True)

    def _repos(self, func: str) -> None:
        try:
            repos = importlib.import_module(f"{__package__}.repos")
        except ImportError as exc:
            print(f"lab: warning: tests.lab.repos not importable ({exc}); lab repos not served",
                  flush=True)
            return
        fn = getattr(repos, func, None)
        if fn is None:
            print(f"lab: warning: tests.lab.repos.{func}() missing; skipped", flush=True)
            return
        fn()

    def _boot(self, topo: Topology, rootfs: Path, *, timeout: float | None = None,
              seed: Callable[[NodeSpec], None] | None = None) -> None:
        pubkey = self.ssh_key.with_suffix(".pub").read_text()
        pw_hash = run(["openssl", "passwd", "-6", "-stdin"],
                      input=self.labadmin_password + "\n").stdout.strip()

        def prep(spec: NodeSpec) -> None:
            if seed is not None:
                seed(spec)
            node.prepare(spec, topo, rootfs, root_pubkey=pubkey, password_hash=pw_hash)

        _parallel(prep, topo.nodes)
        self.known_hosts.write_text("".join(f"{s.ip} {node.host_pubkey(s.name)}\n"
                                            for s in topo.nodes))
        _parallel(node.start, topo.nodes, workers=8)
        self.wait_ssh(topo.nodes, timeout=timeout or 60.0 + 2.0 * len(topo.nodes))

    def add_node(self, name: str, gpus: str = "cpu", *, timeout: float = 60.0) -> Node:
        """Boot one more node beside the running ones (a new box racked into the lab); the
        other nodes are not touched. It gets the next address on the bridge."""
        topo = self.topology()
        if topo is None:
            raise LabError("the lab is not up")
        entries = [{"name": s.name, "role": s.role,
                    "gpus": f"{s.gpus}x{s.gpu_model}" if s.gpus else "cpu",
                    "nvswitches": s.nvswitches} for s in topo.nodes]
        bigger = Topology.from_entries([*entries, {"name": name, "gpus": gpus,
                                                   "role": "worker"}])
        spec = bigger.node(name)
        pubkey = self.ssh_key.with_suffix(".pub").read_text()
        pw_hash = run(["openssl", "passwd", "-6", "-stdin"],
                      input=self.labadmin_password + "\n").stdout.strip()
        node.prepare(spec, bigger, base.ensure_base(), root_pubkey=pubkey, password_hash=pw_hash)
        self.topology_file.write_text(bigger.to_yaml())
        with self.known_hosts.open("a") as fh:
            fh.write(f"{spec.ip} {node.host_pubkey(spec.name)}\n")
        node.start(spec)
        self.wait_ssh([spec], timeout=timeout)
        return Node.of(spec)

    def wait_ssh(self, nodes: Iterable[NodeSpec | Node] | None = None,
                 timeout: float = 120.0) -> None:
        """Poll every node's sshd (banner) until all answer; fail with console tails."""
        todo = {n.name: n.ip for n in (nodes if nodes is not None else self.nodes())}
        deadline = time.monotonic() + timeout
        while todo:
            ready = _parallel(lambda ip: sshd_ready(ip, 0.5), list(todo.values()), workers=64)
            for name, ok in zip(list(todo), ready, strict=True):
                if ok:
                    del todo[name]
            if not todo:
                return
            dead = [n for n in todo if node.supervisor_pid(n) is None]
            if dead or time.monotonic() > deadline:
                why = "stopped" if dead else f"no sshd after {timeout:.0f} s"
                tails = "\n".join(self._console_tail(n) for n in (dead or list(todo))[:3])
                raise LabError(f"lab: nodes {sorted(dead or todo)}: {why}\n{tails}")
            time.sleep(0.25)

    def _console_tail(self, name: str, lines: int = 25) -> str:
        log = node.node_dir(name) / "console.log"
        try:
            text = log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            text = ["(no console.log)"]
        return f"--- {log} (tail) ---\n" + "\n".join(text)

    @contextlib.contextmanager
    def stay_down_after_reboot(self, name: str) -> Iterator[None]:
        """LAB FAULT HOOK: while in this block, the node's next reboot leaves it powered off
        (its supervisor does not boot it again), like a box that never comes back."""
        flag = node.node_dir(name) / "stay-down"
        flag.touch()
        try:
            yield
        finally:
            flag.unlink(missing_ok=True)

    def power_off(self, *names: str) -> None:
        """LAB FAULT HOOK: stop nodes as a box losing power would (its disk kept; no clean
        leave from the cluster, etcd or anything else)."""
        self._stop_nodes(names)

    def power_on(self, *names: str, timeout: float = 60.0) -> None:
        """Boot powered-off nodes again from their disks; wait for their sshd."""
        topo = self.topology()
        if topo is None:
            raise LabError("the lab is not up")
        specs = [topo.node(n) for n in names]
        for spec in specs:
            node.start(spec)
        self.wait_ssh(specs, timeout=timeout)

    def _stop_nodes(self, names: Sequence[str], timeout: float = 90.0) -> None:
        pids = [(n, node.signal_stop(n)) for n in names]
        _parallel(lambda np: node.wait_stopped(np[0], np[1], timeout), pids, workers=64)

    def down(self, *, quiet: bool = False) -> None:
        """Stop everything lab.up started and remove the state (snapshots/ is kept). Idempotent."""
        nodes_dir = self.state / "nodes"
        names = sorted(p.name for p in nodes_dir.iterdir()) if nodes_dir.is_dir() else []
        self._stop_nodes(names)
        for pid in node.nspawn_pids():  # strays of a crashed run
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        node.kill_cgroups()  # containers orphaned by a killed nspawn
        for point in node.lab_mounts():
            if run(["umount", point], check=False).returncode != 0:
                run(["umount", "-l", point], check=False)
        with self._host_locked():
            net.cleanup_all_net()  # this instance's
            # the bridge and the host's services: the last instance in use stops them
            if not others_in_use():
                net.remove_bridge()
                self._repos_stop()
                registry.stop()
                net.stop_proxy()
        if node.lab_mounts():
            raise LabError(f"lab: mounts left under {self.state}: {node.lab_mounts()}")
        if self.state.is_dir():
            for entry in self.state.iterdir():
                if entry.name == "snapshots":
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        if not quiet:
            print(f"lab: down ({len(names)} nodes stopped; state cleared, caches kept)",
                  flush=True)

    def _repos_stop(self) -> None:
        try:
            repos = importlib.import_module(f"{__package__}.repos")
        except ImportError:
            return
        for func in ("stop_serving", "stop_served", "stop"):
            fn = getattr(repos, func, None)
            if callable(fn):
                with contextlib.suppress(Exception):
                    fn()
                return

    # ------------------------------------------------------------ status

    def status(self) -> list[NodeStatus]:
        topo = self.topology()
        if topo is None:
            return []

        def one(spec: NodeSpec) -> NodeStatus:
            sup = node.supervisor_pid(spec.name)
            st = node.supervisor_state(spec.name)
            boot_id = "-"
            if sup is None:
                state = "down"
            elif st.get("state") == "rebooting":
                state = "rebooting"
            elif sshd_ready(spec.ip):
                state = "up"
                with contextlib.suppress(LabError, subprocess.TimeoutExpired):
                    boot_id = self.boot_id(spec.name)
            else:
                state = "booting"
            return NodeStatus(spec.name, spec.ip, state, boot_id, spec.gpu_label,
                              int(st.get("boots", 0)))

        return _parallel(one, topo.nodes)

    # ------------------------------------------------------------ ssh

    def ssh_argv(self, target: str | Node, user: str = "root", *,
                 batch: bool = True) -> list[str]:
        n = self.node(target)
        argv = ["ssh", "-i", str(self.ssh_key), "-o", "IdentitiesOnly=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes",
                "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR"]
        if batch:
            argv += ["-o", "BatchMode=yes"]
        return [*argv, f"{user}@{n.ip}"]

    def ssh(self, target: str | Node, cmd: str, *, user: str = "root",
            input: str | None = None, timeout: float = 120.0) -> tuple[int, str, str]:
        """Run ``cmd`` on a node with the system ssh client; return (rc, stdout, stderr)."""
        proc = subprocess.run([*self.ssh_argv(target, user), cmd], input=input, text=True,
                              capture_output=True, timeout=timeout, check=False,
                              stdin=None if input is not None else subprocess.DEVNULL)
        return proc.returncode, proc.stdout, proc.stderr

    def boot_id(self, target: str | Node) -> str:
        rc, out, err = self.ssh(target, "cat /proc/sys/kernel/random/boot_id", timeout=15)
        if rc != 0:
            raise LabError(f"boot_id of {self.node(target).name}: rc={rc} {err.strip()}")
        return out.strip()

    def wait_for_reboot(self, target: str | Node, old_boot_id: str,
                        timeout: float = 120.0) -> str:
        """Wait until the node answers ssh with a boot_id other than ``old_boot_id``."""
        n = self.node(target)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sshd_ready(n.ip, 0.5):
                with contextlib.suppress(LabError, subprocess.TimeoutExpired):
                    new = self.boot_id(n)
                    if new and new != old_boot_id:
                        return new
            if node.supervisor_pid(n.name) is None:
                raise LabError(f"{n.name}: supervisor gone while waiting for reboot\n"
                               + self._console_tail(n.name))
            time.sleep(0.5)
        raise LabError(f"{n.name}: no new boot_id after {timeout:.0f} s\n"
                       + self._console_tail(n.name))

    def reboot(self, target: str | Node, timeout: float = 120.0) -> str:
        """``systemctl reboot`` on the node; return the new boot_id once sshd is back."""
        old = self.boot_id(target)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.ssh(target, "systemctl reboot", timeout=15)
        return self.wait_for_reboot(target, old, timeout)

    # ------------------------------------------------------------ snapshots

    def snapshot_dir(self, name: str) -> Path:
        """Where snapshot ``name`` lives. A snapshot taken from other inputs (another base
        image, another lab signing key: its nodes would trust the old key) is stale: it is
        removed here, so callers see none and take a new one."""
        if not name or "/" in name or name.startswith("."):
            raise LabError(f"bad snapshot name {name!r}")
        path = self.state / "snapshots" / name
        stamp = path / "inputs"
        if path.is_dir() and (not stamp.is_file() or stamp.read_text() != snapshot_inputs()):
            print(f"lab: snapshot {name!r} was taken from other inputs: removed", flush=True)
            shutil.rmtree(path)
        return path

    def snapshot(self, name: str) -> Path:
        """Power the nodes off, copy every overlay upper dir, boot them again."""
        topo = self.topology()
        if topo is None:
            raise LabError("the lab is not up: nothing to snapshot")
        t0 = time.monotonic()
        dest = self.snapshot_dir(name)
        self._stop_nodes([s.name for s in topo.nodes])
        for s in topo.nodes:
            node.unmount_overlay(s.name)
        tmp = dest.with_name(dest.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        (tmp / "nodes").mkdir(parents=True)
        for s in topo.nodes:
            run(["cp", "-a", "--reflink=auto", node.upper_dir(s.name), tmp / "nodes" / s.name])
        (tmp / "topology.yaml").write_text(topo.to_yaml())
        (tmp / "base-key").write_text(base.base_key() + "\n")
        (tmp / "inputs").write_text(snapshot_inputs())
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
        self._boot(topo, base.ensure_base())
        print(f"lab: snapshot {name!r} of {len(topo.nodes)} nodes in {time.monotonic() - t0:.1f}"
              f" s -> {dest}", flush=True)
        return dest

    def restore(self, name: str, *, timeout: float | None = None) -> list[Node]:
        """Stop the nodes, put the snapshot's upper dirs back, boot, wait for sshd.

        Works from a stopped lab too (lab.down keeps snapshots/): boots the snapshot's topology.
        """
        src = self.snapshot_dir(name)
        if not (src / "topology.yaml").is_file():
            raise LabError(f"no snapshot {name!r} in {src.parent}")
        t0 = time.monotonic()
        topo = Topology.from_yaml(src / "topology.yaml")
        current = self.topology()
        if current is not None and current.to_yaml() == topo.to_yaml():
            self._stop_nodes([s.name for s in topo.nodes])
            for s in topo.nodes:
                node.unmount_overlay(s.name)
                for n in node.nspawn_pids(s.name):
                    raise LabError(f"{s.name}: nspawn {n} still running")
            rootfs = self._host_up()  # another instance's `down` may have stopped them
        else:
            self.down(quiet=True)
            rootfs = self._host_up()
            self.topology_file.write_text(topo.to_yaml())

        # the snapshot holds the nodes, not the shared folder: no files of later workloads
        shutil.rmtree(shared_dir(), ignore_errors=True)

        def seed(spec: NodeSpec) -> None:
            nd = node.node_dir(spec.name)
            for sub in ("upper", "work"):
                if (nd / sub).exists():
                    shutil.rmtree(nd / sub)
            nd.mkdir(parents=True, exist_ok=True)
            run(["cp", "-a", "--reflink=auto", src / "nodes" / spec.name, nd / "upper"])

        self._boot(topo, rootfs, timeout=timeout, seed=seed)
        write_inventory(topo, self.inventory_path)
        write_inventory(topo, self.become_inventory_path, become_user=True)
        print(f"lab: restored {name!r} ({len(topo.nodes)} nodes) in "
              f"{time.monotonic() - t0:.1f} s", flush=True)
        return self.nodes()

    # ------------------------------------------------------------ inventory

    def write_inventory(self, path: str | Path | None = None, *,
                        become_user: bool = False) -> Path:
        topo = self.topology()
        if topo is None:
            raise LabError("the lab is not up")
        return write_inventory(topo, path or self.inventory_path, become_user=become_user)
