"""Command-line front end shared by ``python -m tests.lab`` and the invoke tasks."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence

from .images import build_and_push
from .lab import Lab
from .paths import LabError
from .topology import Topology


def resolve_topology(topology: str | None = None, nodes: str | None = None,
                     count: int | None = None, gpus: str = "cpu") -> Topology:
    given = [x for x in (topology, nodes, count) if x]
    if len(given) > 1:
        raise LabError("give only one of --topology, --nodes, --count")
    if nodes:
        return Topology.from_spec(nodes)
    if count:
        return Topology.generic(int(count), gpus=gpus)
    return Topology.load(topology or "default")


def up(topology: str | None = None, nodes: str | None = None, count: int | None = None,
       gpus: str = "cpu", timeout: float | None = None, fresh: bool = False) -> int:
    Lab().up(resolve_topology(topology, nodes, count, gpus), timeout=timeout, reuse=not fresh)
    return 0


def down() -> int:
    Lab().down()
    return 0


def status() -> int:
    lab = Lab()
    rows = lab.status()
    if not rows:
        print("lab: down (no topology in the state dir)")
        return 1
    head = ("NODE", "IP", "STATE", "BOOTS", "BOOT_ID", "GPUS")
    table = [head, *((r.name, r.ip, r.state, str(r.boots), r.boot_id, r.gpus) for r in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    bad = [r.name for r in rows if r.state != "up"]
    if bad:
        print(f"lab: not up: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


def ssh(node: str, cmd: Sequence[str] = (), user: str = "root") -> int:
    lab = Lab()
    argv = lab.ssh_argv(node, user, batch=bool(cmd))
    if not cmd and sys.stdin.isatty():
        argv.insert(1, "-t")
    if cmd:
        argv.append(shlex.join(cmd) if len(cmd) > 1 else cmd[0])
    sys.stdout.flush()
    os.execvp(argv[0], argv)
    return 127  # not reached


#: what `lab.gpu-fault` runs on the node ($1 GPU index or "", $2 kind or "clear"): the fault
#: file the stand-ins read (labgpu.FAULT_DIR), and for an Xid the driver's line in the node's
#: lab kernel log (the dmesg stand-in's), as NVRM prints Xid 119 (a GSP timeout; NVIDIA's Xid
#: catalog: reset the GPU)
GPU_FAULT = r"""set -e
d=/var/lib/gpuk8s-lab/gpu-faults
bus=""
if [ -n "$1" ]; then
  bus=$(for dev in /sys/bus/pci/devices/*; do
    [ "$(cat "$dev/vendor")" = 0x10de ] || continue
    case $(cat "$dev/class") in 0x0300*|0x0302*) basename "$dev";; esac
  done | sort | sed -n "$(($1 + 1))p")
  [ -n "$bus" ] || { echo "the node has no GPU $1" >&2; exit 2; }
fi
if [ "$2" = clear ]; then
  if [ -n "$bus" ]; then rm -f "$d/$bus"; else rm -rf "$d"; fi
  rm -f /run/gpuk8s-lab/kmsg
  exit 0
fi
mkdir -p "$d" /run/gpuk8s-lab
echo "$2" > "$d/$bus"
if [ "$2" = xid ]; then
  up=$(awk '{printf "%12.6f", $1}' /proc/uptime)
  m="Timeout after 6s of waiting for RPC response from GPU$1 GSP!"
  m="$m Expected function 76 (GSP_RM_CONTROL) (0x2080014b 0x5)."
  printf '[%s] NVRM: Xid (PCI:%s): 119, pid=4242, name=python3, %s\n' "$up" "${bus%.*}" "$m" \
    >> /run/gpuk8s-lab/kmsg
fi
"""
FAULT_KINDS = ("slow", "pcie", "ecc", "xid", "missing")


def gpu_fault(node: str, gpu: int | None, kind: str | None, clear: bool = False) -> int:
    """Inject a GPU fault on a lab node (the stand-ins report it), or clear it."""
    if clear == (kind is not None):
        print("give --kind KIND or --clear", file=sys.stderr)
        return 2
    if kind is not None and (kind not in FAULT_KINDS or gpu is None):
        print(f"--kind is one of {', '.join(FAULT_KINDS)}, with --gpu N", file=sys.stderr)
        return 2
    cmd = shlex.join(["sh", "-c", GPU_FAULT, "gpu-fault", "" if gpu is None else str(gpu),
                      "clear" if clear else str(kind)])
    rc, out, err = Lab().ssh(node, cmd, timeout=30)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return rc


def snapshot(name: str) -> int:
    Lab().snapshot(name)
    return 0


def restore(name: str) -> int:
    Lab().restore(name)
    return 0


def inventory(path: str | None = None, become: bool = False) -> int:
    lab = Lab()
    default = lab.become_inventory_path if become else lab.inventory_path
    print(lab.write_inventory(path or default, become_user=become))
    return 0


def images(only: Sequence[str] | None = None) -> int:
    """Build (cached) and push the lab images; one line per image: size, digest, seconds."""
    pushed = build_and_push(only)
    head = ("IMAGE", "SIZE", "DIGEST", "BUILD_S", "PUSH_S")
    table = [head, *((p.ref, f"{p.size / 1e6:.0f} MB", p.digest, f"{p.build_s:.1f}",
                      f"{p.push_s:.1f}") for p in pushed)]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.lab", description="gpuk8s lab nodes")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("up", help="boot the lab (default topology)")
    s.add_argument("--topology", "-t", help="YAML file or name under tests/lab/topologies/")
    s.add_argument("--nodes", "-n", help="spec, e.g. 'cp-01:cpu,gpu-01:2xH100,gpu-02:1xH200'")
    s.add_argument("--count", "-c", type=int, help="N generic nodes (node-01 = control plane)")
    s.add_argument("--gpus", default="cpu", help="with --count: GPUs of each worker (2xH100)")
    s.add_argument("--timeout", type=float, help="seconds to wait for sshd on all nodes")
    s.add_argument("--fresh", action="store_true", help="reboot from scratch even if up")
    sub.add_parser("down", help="stop everything, clear state (caches and snapshots kept)")
    sub.add_parser("status", help="table of nodes; exit 1 if any is not up")
    s = sub.add_parser("ssh", help="ssh NODE [-- cmd...] as root (or --user labadmin)")
    s.add_argument("node")
    s.add_argument("--user", "-u", default="root")
    s.add_argument("command", nargs=argparse.REMAINDER)
    s = sub.add_parser("gpu-fault", help="inject a GPU fault on NODE (or --clear)")
    s.add_argument("node")
    s.add_argument("--gpu", type=int)
    s.add_argument("--kind", choices=FAULT_KINDS)
    s.add_argument("--clear", action="store_true")
    s = sub.add_parser("snapshot", help="poweroff, copy overlay upper dirs, boot again")
    s.add_argument("name")
    s = sub.add_parser("restore", help="put a snapshot back and boot it")
    s.add_argument("name")
    s = sub.add_parser("inventory", help="(re)write the inventory, print its path")
    s.add_argument("path", nargs="?")
    s.add_argument("--become", action="store_true", help="labadmin + sudo variant")
    s = sub.add_parser("images", help="build (cached) and push the lab's TensorFlow/CUDA "
                       "images to the lab registry")
    s.add_argument("--only", action="append", metavar="NAME",
                   help="this image only (repeatable), e.g. tensorflow/tensorflow:2.21.0-gpu")
    a = p.parse_args(argv)
    try:
        if a.cmd == "up":
            return up(a.topology, a.nodes, a.count, a.gpus, a.timeout, a.fresh)
        if a.cmd == "down":
            return down()
        if a.cmd == "status":
            return status()
        if a.cmd == "ssh":
            cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
            return ssh(a.node, cmd, a.user)
        if a.cmd == "gpu-fault":
            return gpu_fault(a.node, a.gpu, a.kind, a.clear)
        if a.cmd == "snapshot":
            return snapshot(a.name)
        if a.cmd == "restore":
            return restore(a.name)
        if a.cmd == "inventory":
            return inventory(a.path, a.become)
        if a.cmd == "images":
            return images(a.only)
    except LabError as exc:
        print(f"lab: error: {exc}", file=sys.stderr)
        return 1
    return 2
