"""Invoke tasks of the lab: ``invoke lab.up|down|status|ssh|snapshot|restore|repos|images``.

The root tasks.py adds this collection as ``lab``. Each task calls tests.lab.cli (the same code
as ``python -m tests.lab``).
"""

from __future__ import annotations

import sys

from invoke import Collection, Exit, task


def _cli():  # type: ignore[no-untyped-def]
    """tests.lab.cli, imported when a lab task runs: every other invoke command (a no-op
    bootstrap among them) would pay for importing the whole lab."""
    from . import cli

    return cli


def _done(code: int) -> None:
    if code:
        raise Exit(code=code)


def _remainder() -> list[str]:
    """Words after ``--`` on the invoke command line (invoke does not hand them to tasks)."""
    argv = sys.argv
    return argv[argv.index("--") + 1:] if "--" in argv else []


@task(help={"topology": "YAML file or name under tests/lab/topologies/ (default: default)",
            "nodes": "spec, e.g. 'cp-01:cpu,gpu-01:2xH100,gpu-02:1xH200,cpu-01:cpu'",
            "count": "N generic nodes node-01..node-N (node-01 = control plane)",
            "gpus": "with --count: GPUs of each worker, e.g. 2xH100 (default cpu)",
            "timeout": "seconds to wait for sshd on all nodes",
            "fresh": "boot from scratch even if the same lab is up"})
def up(c, topology=None, nodes=None, count=0, gpus="cpu", timeout=None, fresh=False):
    """Boot the lab nodes (debootstraps the base image once), write the inventory."""
    _done(_cli().up(topology, nodes, int(count) or None, gpus,
                 float(timeout) if timeout else None, fresh))


@task
def down(c):
    """Stop nodes, proxy and repo server; remove netns/bridge/mounts/state (keeps caches)."""
    _done(_cli().down())


@task
def status(c):
    """Table of nodes (node, ip, state, boot_id, gpus); exits 1 if any node is not up."""
    _done(_cli().status())


@task(help={"node": "node name, e.g. gpu-01", "user": "root (default) or labadmin"})
def ssh(c, node, user="root"):
    """ssh into NODE as root with the lab key; `invoke lab.ssh NODE -- cmd` runs cmd."""
    _done(_cli().ssh(node, _remainder(), user))


@task(name="gpu-fault",
      help={"node": "lab node, e.g. gpu-01", "gpu": "the GPU's index (nvidia-smi's, no fault)",
            "kind": "slow | pcie | ecc | xid | missing", "clear": "clear the node's faults "
            "(with --gpu: that GPU's), as a reset and reboot would"})
def gpu_fault(c, node, gpu=None, kind=None, clear=False):
    """Make a lab GPU faulty: nvidia-smi, the kernel log and the benchmark stand-ins report it."""
    _done(_cli().gpu_fault(node, None if gpu is None else int(gpu), kind, clear))


@task(help={"name": "snapshot name"})
def snapshot(c, name):
    """Power the nodes off, copy their overlay upper dirs to <state>/snapshots/NAME, boot."""
    _done(_cli().snapshot(name))


@task(help={"name": "snapshot name"})
def restore(c, name):
    """Put snapshot NAME back (boots its topology if the lab is down) and wait for sshd."""
    _done(_cli().restore(name))


@task(help={"path": "output path (default <state>/inventory.yaml)",
            "become": "labadmin + sudo variant (password from GPUK8S_BECOME_PASSWORD)"})
def inventory(c, path=None, become=False):
    """(Re)write the inventory of the running lab and print its path."""
    _done(_cli().inventory(path, become))


@task(help={"listen": "ADDR:PORT to serve on (default 10.88.0.1:8081)",
            "force": "rebuild the repos"})
def repos(c, listen=None, force=False):
    """Build the lab package repos and serve them in the foreground (tests/lab/repos.py)."""
    from . import repos as _repos

    if listen:
        _repos.repos_task(listen=listen, force=force)
    else:
        _repos.repos_task(force=force)


@task(help={"only": "this image only (repeatable), e.g. tensorflow/tensorflow:2.21.0-gpu; "
                    "default: all"}, iterable=["only"])
def images(c, only=None):
    """Build (cached) the lab's TensorFlow/CUDA images and push them to the lab registry."""
    _done(_cli().images(only or None))


lab = Collection("lab", up, down, status, ssh, gpu_fault, snapshot, restore, inventory, repos,
                 images)
