"""The gpuk8s commands, each declared once: an invoke task with its flags, their help, short
aliases and defaults. This one table is both ``invoke COMMAND`` (tasks.py adds the checkout's
lab.* and bench tasks) and the ``gpuk8s`` console script (an invoke Program). Each task calls
one function through run(), which turns a Gpuk8sError into one message and an exit code."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from invoke import Collection, Context, Exit, Program, Task, task
from invoke.parser import Argument, ParseError

from gpuk8s import __version__, api, day2, gpucheck
from gpuk8s import images as _images
from gpuk8s import lock as _lock
from gpuk8s import workloads as _workloads
from gpuk8s.accept import command as _accept
from gpuk8s.errors import Gpuk8sError, PhaseFailed, PreflightError
from gpuk8s.lock import bundle as _cluster_bundle
from gpuk8s.lock import serve as _serve
from gpuk8s.report import untrusted

#: command name -> the one function it calls
COMMANDS: dict[str, Callable[..., object]] = {
    "bootstrap": api.bootstrap, "plan": api.plan, "facts": api.facts,
    "reprovision": day2.reprovision, "add_node": day2.add_node,
    "remove_node": day2.remove_node, "reset": day2.reset, "status": day2.status,
    "gpu_usage": day2.gpu_usage,
    "upgrade": day2.upgrade, "kubeconfig": day2.kubeconfig,
    "user_kubeconfig": day2.user_kubeconfig,
    "verify_local": gpucheck.verify_local, "images": _images.print_images, "check": api.check,
    "report": api.report,
    "bundle": _cluster_bundle.bundle, "lock": _lock.lock, "serve_bundle": _serve.serve_bundle,
    "backup": day2.backup, "renew_certs": day2.renew_certs,
    "restore": day2.restore, "accept": _accept.accept, "release": _accept.release,
}
# workloads on the cluster (gpuk8s/workloads/)
COMMANDS.update({"deploy": _workloads.deploy, "undeploy": _workloads.undeploy,
                 "verify": _workloads.verify})


#: -o/--output of the commands that print a table of the cluster (kubectl's): the default
#: view fits 80 columns; "wide" adds every other column; "json" is the same as --json
TABLE_OUTPUTS = ("wide", "json")


def table_output(output: str | None, as_json: bool = False) -> dict[str, bool]:
    """``as_json`` and ``wide`` for a table command from its --output (and --json)."""
    if output not in (None, "", *TABLE_OUTPUTS):
        raise ValueError(f"--output {output!r}: use wide (every column) or json")
    return {"as_json": as_json or output == "json", "wide": output == "wide"}


def run(command: str, **kwargs: object) -> int:
    """Call one api/day2 function; print a Gpuk8sError as one clear message; return an exit
    code (1 error, 2 a phase failed, 3 preflight problems, 130 interrupted). An error's text
    may quote a node's output, so it is printed through report.untrusted."""
    try:
        COMMANDS[command](**kwargs)
    except PreflightError as exc:
        _error(exc)
        return 3
    except PhaseFailed as exc:
        _error(exc)
        return 2
    except Gpuk8sError as exc:
        _error(exc)
        return 1
    except KeyboardInterrupt:
        print("interrupted: the hosts keep what was applied; run again to converge",
              file=sys.stderr)
        return 130
    return 0


def _error(exc: Gpuk8sError) -> None:
    """One error on stderr: plain text (print, not Rich), control characters escaped."""
    print(f"error: {untrusted(exc)}", file=sys.stderr)


def _call(command: str, **kwargs: object) -> None:
    """A task's one call: run(), and a non-zero exit code ends the program with it."""
    if code := run(command, **kwargs):
        raise Exit(code=code)


def _usage(message: str) -> Exit:
    """A flag's value no command takes: one message, exit 2 (as a usage error)."""
    return Exit(f"error: {message}", code=2)


# -- the flags ---------------------------------------------------------------------------------
INVENTORY = "inventories/lab.yaml"

#: each flag's one short alias, the same in every command that has the flag (ansible's
#: -i -l -e -K, kubectl's -o, helm's -f); the other flags have none
SHORT = {"inventory": "i", "limit": "l", "set": "e", "ask_become_pass": "K", "yes": "y",
         "quiet": "q", "output": "o", "values": "f"}

#: the help of flags that mean the same in every command; a task's help= overrides one where
#: the flag says more there
HELP = {"inventory": f"inventory file, YAML or INI (default {INVENTORY})",
        "limit": "host pattern, e.g. gpu-03",
        "set": "key=value override of an inventory variable (repeatable)",
        "values": "workload values file (repeatable)",
        "ask_become_pass": "prompt for the sudo password",
        "yes": "apply without asking",
        "diff": "show file diffs",
        "drain_timeout": "seconds for kubectl drain",
        "json": "print JSON instead of a table",
        "no_backup": "change control planes without taking a backup first (says so)"}

#: --set of the workload commands: a value of the workload, not of the inventory
WORKLOAD_SET = "key.sub=value, a workload value (repeatable)"


class Flag(Argument):
    """A flag whose value must convert (--serial 2): a wrong one is a usage error that names
    the flag, not a traceback."""

    def set_value(self, value: Any, cast: bool = True) -> None:
        try:
            super().set_value(value, cast)
        except ValueError:
            raise ParseError(f"--{self.names[0]} takes a whole number, not {value!r}") from None


class Command(Task):
    """A gpuk8s command: an invoke task whose flags take their short alias from SHORT only
    (invoke's own pick, the first free letter, differed from command to command) and their
    help from HELP where the task's help= gives none."""

    def __init__(self, body: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(body, auto_shortflags=False, **kwargs)

    def arg_opts(self, name: str, default: Any, taken_names: set[str]) -> dict[str, Any]:
        opts = super().arg_opts(name, default, taken_names)
        opts["names"] += [SHORT[name]] if name in SHORT else []
        opts.setdefault("help", HELP.get(name))
        return opts

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        kept = dict(self.help)  # invoke's arg_opts pops each text: keep them for a next parse
        try:
            args = super().get_arguments(ignore_unknown_help)
        finally:
            self.help = kept
        for arg in args:
            arg.__class__ = Flag  # invoke makes each an Argument; only set_value differs
        return args


def command(**kwargs: Any) -> Callable[[Callable[..., Any]], Command]:
    """@task for a gpuk8s command."""
    return task(klass=Command, **kwargs)


PRUNE_HELP = ("delete the namespaces (and all in them) of users and groups no longer in "
              "lab_users/lab_groups (--set tenancy_prune=true)")


def _pruned(sets: list[str] | None, prune: bool) -> list[str]:
    """--set plus, with --prune, tenancy_prune=true."""
    return [*(sets or []), *(["tenancy_prune=true"] if prune else [])]


# -- the commands ------------------------------------------------------------------------------
@command(help={"check": "plan only (same as plan)",
               "max_fail": "hosts that may fail (count like 1, or percent like 25%) while the "
                           "others go on; default 0: any failure stops the run",
               "quiet": "no plan or progress lines: problems, failures and the final table",
               "prune": PRUNE_HELP},
         iterable=["set"])
def bootstrap(c: Context, inventory: str = INVENTORY, limit: str | None = None,
              yes: bool = False, check: bool = False, diff: bool = False,
              set: list[str] | None = None, ask_become_pass: bool = False, max_fail: str = "0",
              quiet: bool = False, no_backup: bool = False, prune: bool = False) -> None:
    """Bring every host to a Ready Kubernetes GPU cluster node; a re-run changes nothing."""
    _call("bootstrap", inventory=inventory, limit=limit, yes=yes, check=check, diff=diff,
          sets=_pruned(set, prune), ask_become_pass=ask_become_pass, max_fail=max_fail,
          quiet=quiet, backup=not no_backup)


@command(iterable=["set"])
def check(c: Context, inventory: str = INVENTORY, set: list[str] | None = None) -> None:
    """Every problem of the inventory in one run, the hosts' roles and the variables that
    differ from their defaults; contacts no host."""
    _call("check", inventory=inventory, sets=set or [])


@command(help={"prune": PRUNE_HELP}, iterable=["set"])
def plan(c: Context, inventory: str = INVENTORY, limit: str | None = None, diff: bool = False,
         set: list[str] | None = None, ask_become_pass: bool = False,
         prune: bool = False) -> None:
    """Show what bootstrap would change on every host; changes nothing."""
    _call("plan", inventory=inventory, limit=limit, diff=diff, sets=_pruned(set, prune),
          ask_become_pass=ask_become_pass)


@command(help={"json": "every fact as JSON instead of the summary"}, iterable=["set"])
def facts(c: Context, inventory: str = INVENTORY, limit: str | None = None,
          set: list[str] | None = None, ask_become_pass: bool = False,
          json: bool = False) -> None:
    """What gpuk8s sees on each host: OS, kernel, GPUs, driver, CUDA, NVLink (--json: all)."""
    _call("facts", inventory=inventory, limit=limit, sets=set or [],
          ask_become_pass=ask_become_pass, as_json=json)


@command(help={"host": "the worker to reprovision",
               "reinstall_driver": "purge and reinstall the NVIDIA driver",
               "full": "purge and reinstall the whole node stack"})
def reprovision(c: Context, host: str, inventory: str = INVENTORY,
                reinstall_driver: bool = False, full: bool = False, drain_timeout: int = 300,
                yes: bool = False, no_backup: bool = False) -> None:
    """Drain, reset and rejoin one worker; only it and the control plane are contacted."""
    _call("reprovision", inventory=inventory, host=host, reinstall_driver=reinstall_driver,
          full=full, drain_timeout=drain_timeout, yes=yes, backup=not no_backup)


@command(help={"host": "the new box (already in the inventory)"})
def add_node(c: Context, host: str, inventory: str = INVENTORY, yes: bool = False,
             no_backup: bool = False) -> None:
    """Give a new box the full node stack and join it (bootstrap --limit HOST)."""
    _call("add_node", inventory=inventory, host=host, yes=yes, backup=not no_backup)


@command(help={"host": "the worker to remove"})
def remove_node(c: Context, host: str, inventory: str = INVENTORY, drain_timeout: int = 300,
                yes: bool = False, no_backup: bool = False) -> None:
    """Drain, delete and reset a worker; a dead one only loses its Node object."""
    _call("remove_node", inventory=inventory, host=host, drain_timeout=drain_timeout, yes=yes,
          backup=not no_backup)


@command(help={"yes": "skip the typed confirmation"})
def reset(c: Context, inventory: str = INVENTORY, yes: bool = False,
          no_backup: bool = False) -> None:
    """The whole cluster back to its pre-bootstrap state (asks you to type its name); a
    backup first."""
    _call("reset", inventory=inventory, yes=yes, backup=not no_backup)


def _table_output(output: str, json: bool) -> dict[str, bool]:
    try:
        return table_output(output, json)
    except ValueError as exc:
        raise _usage(str(exc)) from None


@command(help={"output": "wide: every column (the default view fits 80 columns); json: as "
                         "--json"})
def status(c: Context, inventory: str = INVENTORY, json: bool = False, output: str = "") -> None:
    """One line per host: role, Ready, GPUs and allocatable nvidia.com/gpu, what plan would do
    (in sync, N changes, refused by preflight); -o wide adds versions and GPU use."""
    _call("status", inventory=inventory, **_table_output(output, json))


@command(name="gpu-usage", help={"output": "wide: every column (model, UUID); json: as --json"})
def gpu_usage(c: Context, inventory: str = INVENTORY, json: bool = False,
              output: str = "") -> None:
    """GPU utilisation, memory and pods per GPU, from the cluster's Prometheus (gpu_monitoring)."""
    _call("gpu_usage", inventory=inventory, **_table_output(output, json))


@command(help={"driver": "NVIDIA driver version, e.g. 580.159.04",
               "kubernetes": "Kubernetes release: the next minor (1.37, its newest patch) or a "
                             "patch release (1.36.2)",
               "kernel": "GPU nodes' kernel: a release (6.8.0-60-generic), or alone for the "
                         "newest their kernel meta-packages offer",
               "serial": "nodes at a time", "yes": "do not ask"},
         optional=["kernel"])
def upgrade(c: Context, driver: str | None = None, kubernetes: str | None = None,
            kernel: str | None = None, inventory: str = INVENTORY, limit: str | None = None,
            serial: int = 1, drain_timeout: int = 300, yes: bool = False,
            no_backup: bool = False) -> None:
    """Upgrade the NVIDIA driver (--driver), Kubernetes (--kubernetes) or GPU nodes' kernel
    (--kernel) node by node: drain, upgrade, verify, uncordon; the control plane first for
    Kubernetes; a kernel's NVIDIA module built and checked before any reboot."""
    _call("upgrade", inventory=inventory, driver=driver, kubernetes=kubernetes, kernel=kernel,
          limit=limit, serial=serial, drain_timeout=drain_timeout, yes=yes,
          backup=not no_backup)


@command(help={"keep": "backups to keep (default: the inventory's backup_keep, 10)"})
def backup(c: Context, inventory: str = INVENTORY, keep: int = 0) -> None:
    """Back up the cluster now: an etcd snapshot, the PKI, kubeadm's configuration and
    admin.conf, checked, into <inventory dir>/artifacts/backups/<cluster>-<UTC time>/."""
    _call("backup", inventory=inventory, keep=keep or None)


@command(name="restore", help={"from_": "the backup folder (<inventory dir>/artifacts/backups/"
                                         "<cluster>-<UTC time>)",
                               "no_backup": "on a running control plane: no backup of its "
                                            "present state first"})
def restore(c: Context, inventory: str = INVENTORY, from_: str = "", yes: bool = False,
            no_backup: bool = False) -> None:
    """Restore a backup onto the first control plane: a lost one rebuilt with the backup's PKI
    (kubeadm init) and etcd from its snapshot; the workers keep their kubelets. Checks first
    that the backup is whole, of this cluster and not newer than its Kubernetes."""
    if not from_:
        raise _usage("--from DIR: which backup folder to restore (invoke backup made it)")
    _call("restore", inventory=inventory, source=from_, yes=yes, backup=not no_backup)


@command(name="renew-certs", help={"host": "one control plane only (default: every one, one "
                                           "at a time)"})
def renew_certs(c: Context, inventory: str = INVENTORY, host: str | None = None,
                yes: bool = False, no_backup: bool = False) -> None:
    """Renew kubeadm's certificates on the control planes one at a time (kubeadm certs renew
    all, static pods restarted onto them), then fetch admin.conf again; a backup first."""
    _call("renew_certs", inventory=inventory, host=host, yes=yes, backup=not no_backup)


@command()
def kubeconfig(c: Context, inventory: str = INVENTORY) -> None:
    """Fetch admin credentials (0600) to <inventory dir>/artifacts/admin.conf."""
    _call("kubeconfig", inventory=inventory)


@command(help={"name": "a user of lab_users",
               "validity": "how long the certificate is valid, a Go duration (default 24h; "
                           "it cannot be revoked before it ends)"})
def user_kubeconfig(c: Context, name: str, inventory: str = INVENTORY,
                    validity: str = "24h") -> None:
    """A lab user's kubeconfig (0600) to <inventory dir>/artifacts/users/NAME.conf: edit in
    their namespaces, nothing else."""
    _call("user_kubeconfig", inventory=inventory, name=name, validity=validity)


@command(help={"output": "table (default), json, or list (one image per line)"},
         iterable=["set", "values"])
def images(c: Context, inventory: str = INVENTORY, set: list[str] | None = None,
           values: list[str] | None = None, output: str = "table") -> None:
    """Every image the cluster and the workloads pull at the inventory's versions (to mirror)."""
    if output not in ("table", "json", "list"):
        raise _usage(f"--output {output!r}: use table, json or list")
    _call("images", inventory=inventory, sets=set or [], values_files=values or [],
          output=output)


@command(help={"output": "where the lock goes (default: beside the inventory, "
                         "<name>.gpuk8s.lock)"}, iterable=["set"])
def lock(c: Context, inventory: str = INVENTORY, output: str | None = None,
         set: list[str] | None = None) -> None:
    """Pin, for this inventory as it is, every apt package (exact version, .deb SHA256) and
    every image (digest, per platform) bootstrap installs: gpuk8s.lock beside the inventory.
    Reads the hosts (as plan does), the apt sources' signed indexes and the registries; changes
    nothing on any host."""
    _call("lock", inventory=inventory, output=output, sets=set or [])


@command(name="serve-bundle",
         help={"bundle": "the bundle (invoke bundle --cluster): its folder or .tar.gz",
               "listen": "the admin machine's address the nodes reach, e.g. 10.0.0.5",
               "name": "another name (DNS or IP) of the admin machine for the certificate "
                       "(repeatable)",
               "apt_port": "HTTPS port of the apt repositories (default 8443)",
               "registry_port": "HTTPS port of the registry (default 5443)",
               "state": f"where the served files, CA and keys live (default "
                        f"{_serve.DEFAULT_STATE})"},
         iterable=["name"])
def serve_bundle(c: Context, bundle: str, listen: str, name: list[str] | None = None,
                 apt_port: int = 8443, registry_port: int = 5443,
                 state: str = _serve.DEFAULT_STATE) -> None:
    """Serve a cluster bundle to air-gapped nodes: its apt repositories (signed by a key made
    here) and a read-only registry, over HTTPS; print the inventory lines to paste; serve
    until Ctrl-C. A bundle whose files do not match their SHA256SUMS is refused."""
    _call("serve_bundle", bundle=bundle, listen=listen, names=name or [], apt_port=apt_port,
          registry_port=registry_port, state=state)


@command(help={"name": "workload: " + ", ".join(_workloads.WORKLOADS), "set": WORKLOAD_SET,
               "timeout": "seconds to wait for the workload's pods",
               "render": "print the manifests deploy would apply; contact no host"},
         iterable=["values", "set"])
def deploy(c: Context, name: str, inventory: str = INVENTORY, values: list[str] | None = None,
           set: list[str] | None = None, timeout: int = 600, render: bool = False) -> None:
    """Deploy a workload (gpuk8s deploy jupyter); waits for its pods and prints them."""
    _call("deploy", inventory=inventory, name=name, values_files=values or [], sets=set or [],
          timeout=timeout, render_only=render)


@command(help={"name": "workload name", "set": WORKLOAD_SET,
               "purge": "jupyterhub: also remove the users' homes and the hub's database"},
         iterable=["values", "set"])
def undeploy(c: Context, name: str, inventory: str = INVENTORY,
             values: list[str] | None = None, set: list[str] | None = None,
             purge: bool = False) -> None:
    """Remove every object of a workload (by its gpuk8s.io/workload label)."""
    _call("undeploy", inventory=inventory, name=name, values_files=values or [],
          sets=set or [], purge=purge)


@command(help={"set": WORKLOAD_SET,
               "local": "node-level check on the hosts themselves (no cluster): nvidia-smi sees "
                        "every PCI GPU and a CUDA computation is right on each",
               "limit": "host pattern (with --local)",
               "python": "with --local: the Python interpreter whose PyTorch (with CUDA) the "
                         "PyTorch path uses, e.g. /opt/torch/.venv/bin/python3",
               "without_nvcc": "with --local: leave nvcc out, to run the PyTorch path"},
         iterable=["values", "set"])
def verify(c: Context, inventory: str = INVENTORY, values: list[str] | None = None,
           set: list[str] | None = None, local: bool = False, limit: str | None = None,
           python: str | None = None, without_nvcc: bool = False) -> None:
    """Smoke-test every GPU node: a Job per node (nvidia-smi, then TensorFlow listing its GPUs),
    or with --local the node-level check over SSH / on this machine."""
    if (python or without_nvcc) and not local:
        raise Exit("--python and --without-nvcc are options of the node-level check: add "
                   "--local", code=1)
    if local:
        _call("verify_local", inventory=inventory, limit=limit, python=python,
              nvcc=not without_nvcc)
    else:
        _call("verify", inventory=inventory, values_files=values or [], sets=set or [])


@command(help={"output": "folder the bundle goes in (default dist)",
               "python_version": "the admin machine's Python, e.g. 3.12 (default: this one)",
               "platform": "the admin machine's pip platform tag, e.g. manylinux_2_28_x86_64 "
                           "(repeatable; older manylinux tags are added; default: this "
                           "machine's)",
               "tarball": "one gpuk8s-bundle-*.tar.gz instead of a folder",
               "find_links": "a folder of wheels for pip to take from (repeatable)",
               "no_index": "no package index: only the --find-links folders",
               "cluster": "also every .deb and image the inventory's lock names (invoke "
                          "lock), downloaded and checked, for an air-gapped cluster"},
         iterable=["platform", "find_links"])
def bundle(c: Context, output: str = "dist", python_version: str | None = None,
           platform: list[str] | None = None, tarball: bool = False,
           find_links: list[str] | None = None, no_index: bool = False, cluster: bool = False,
           inventory: str = INVENTORY) -> None:
    """gpuk8s, its checkout and every dependency as wheels, for an admin machine without a
    package index: run it where PyPI answers, carry the result over (INSTALL.txt says how).
    With --cluster, also the cluster's packages and images (serve them with serve-bundle)."""
    _call("bundle", output=output, python_version=python_version, platforms=platform or [],
          tarball=tarball, find_links=find_links or [], no_index=no_index, cluster=cluster,
          inventory=inventory)


@command(help={"run": "run folder (default: the latest under runs/)"})
def report(c: Context, run: str | None = None) -> None:
    """A finished run (default: the latest) as one self-contained HTML page, report.html.

    Per-host timeline, what changed, failures with log tails, the cluster's nodes; prints the
    page's path. Needs no inventory."""
    _call("report", run=run)


@command(help={"host": "one GPU node (default: every GPU node of the inventory)",
               "quick": "the short benchmark (under a minute a node)",
               "json": "every figure, reference and verdict as JSON",
               "no_quarantine": "report only: cordon and taint nothing"})
def accept(c: Context, inventory: str = INVENTORY, host: str | None = None, quick: bool = False,
           json: bool = False, no_quarantine: bool = False) -> None:
    """Prove each GPU node's health and speed against its model's references; quarantine
    (cordon, taint gpuk8s.io/gpu-unhealthy) a node that fails, at most 25% of them a run."""
    _call("accept", inventory=inventory, host=host, quick=quick, as_json=json,
          quarantine=not no_quarantine)


@command(help={"host": "the quarantined GPU node", "quick": "accept with the short benchmark"})
def release(c: Context, host: str, inventory: str = INVENTORY, quick: bool = False) -> None:
    """Lift a node's GPU quarantine after it passes accept again."""
    _call("release", inventory=inventory, host=host, quick=quick)


ns = Collection(bootstrap, plan, check, facts, reprovision, add_node, remove_node, reset, status,
                user_kubeconfig,
                gpu_usage, upgrade, backup, restore, renew_certs, kubeconfig, images, deploy,
                undeploy, verify, bundle, lock, serve_bundle, report, accept, release)

#: the gpuk8s console script: the same commands, flags and help as invoke's
program = Program(namespace=ns, name="gpuk8s", binary="gpuk8s", version=__version__)


def main(argv: Sequence[str] | None = None) -> int:
    """``gpuk8s ARGV`` (default: this process's arguments); its exit code."""
    try:
        program.run(["gpuk8s", *(sys.argv[1:] if argv is None else argv)])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
