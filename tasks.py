"""Invoke tasks: parse flags, call one gpuk8s.api function (through gpuk8s.cli.run)."""

from __future__ import annotations

import sys

from invoke import Collection, Exit, task

from gpuk8s.cli import run, table_output

INVENTORY = "inventories/lab.yaml"


def _done(code: int) -> None:
    if code:
        raise Exit(code=code)


@task(help={"inventory": "inventory file (YAML or INI)", "limit": "host pattern, e.g. gpu-03",
            "yes": "apply without asking", "check": "plan only (same as invoke plan)",
            "diff": "show file diffs", "set": "key=value override (repeatable)",
            "ask_become_pass": "prompt for the sudo password",
            "max_fail": "hosts that may fail (count like 1, or percent like 25%) while the "
                        "others go on; default 0",
            "quiet": "no plan or progress lines: problems, failures and the final table"},
      iterable=["set"])
def bootstrap(c, inventory=INVENTORY, limit=None, yes=False, check=False, diff=False, set=None,
              ask_become_pass=False, max_fail="0", quiet=False):
    """Bring every host to a Ready Kubernetes GPU cluster node; a re-run changes nothing."""
    _done(run("bootstrap", inventory=inventory, limit=limit, yes=yes, check=check, diff=diff,
              sets=set or [], ask_become_pass=ask_become_pass, max_fail=max_fail, quiet=quiet))


@task(help={"inventory": "inventory file", "set": "key=value override (repeatable)"},
      iterable=["set"])
def check(c, inventory=INVENTORY, set=None):
    """Every problem of the inventory in one run, the hosts' roles and the variables that
    differ from their defaults; contacts no host."""
    _done(run("check", inventory=inventory, sets=set or []))


@task(help={"inventory": "inventory file", "limit": "host pattern", "diff": "show file diffs",
            "set": "key=value override (repeatable)",
            "ask_become_pass": "prompt for the sudo password"}, iterable=["set"])
def plan(c, inventory=INVENTORY, limit=None, diff=False, set=None, ask_become_pass=False):
    """Show what bootstrap would change on every host; changes nothing."""
    _done(run("plan", inventory=inventory, limit=limit, diff=diff, sets=set or [],
              ask_become_pass=ask_become_pass))


@task(help={"inventory": "inventory file", "limit": "host pattern",
            "ask_become_pass": "prompt for the sudo password",
            "json": "every fact as JSON instead of the summary"})
def facts(c, inventory=INVENTORY, limit=None, ask_become_pass=False, json=False):
    """What gpuk8s sees on each host: OS, kernel, GPUs, driver, CUDA, NVLink (--json: all)."""
    _done(run("facts", inventory=inventory, limit=limit, ask_become_pass=ask_become_pass,
              as_json=json))


@task(help={"inventory": "inventory file", "host": "the worker to reprovision",
            "reinstall_driver": "purge and reinstall the NVIDIA driver",
            "full": "purge and reinstall the whole node stack",
            "drain_timeout": "seconds for kubectl drain", "yes": "do not ask"})
def reprovision(c, host, inventory=INVENTORY, reinstall_driver=False, full=False,
                drain_timeout=300, yes=False):
    """Drain, reset and rejoin one worker; only it and the control plane are contacted."""
    _done(run("reprovision", inventory=inventory, host=host, reinstall_driver=reinstall_driver,
              full=full, drain_timeout=int(drain_timeout), yes=yes))


@task(help={"inventory": "inventory file", "host": "the new box (already in the inventory)",
            "yes": "apply without asking"})
def add_node(c, host, inventory=INVENTORY, yes=False):
    """Give a new box the full node stack and join it (bootstrap --limit HOST)."""
    _done(run("add_node", inventory=inventory, host=host, yes=yes))


@task(help={"inventory": "inventory file", "host": "the worker to remove",
            "drain_timeout": "seconds for kubectl drain", "yes": "do not ask"})
def remove_node(c, host, inventory=INVENTORY, drain_timeout=300, yes=False):
    """Drain, delete and reset a worker; a dead one only loses its Node object."""
    _done(run("remove_node", inventory=inventory, host=host,
              drain_timeout=int(drain_timeout), yes=yes))


@task(help={"inventory": "inventory file", "yes": "skip the typed confirmation"})
def reset(c, inventory=INVENTORY, yes=False):
    """The whole cluster back to its pre-bootstrap state (asks you to type its name)."""
    _done(run("reset", inventory=inventory, yes=yes))


def _table_output(output: str, json: bool) -> dict[str, bool]:
    try:
        return table_output(output, json)
    except ValueError as exc:
        raise Exit(f"error: {exc}", code=2) from None


@task(help={"inventory": "inventory file", "json": "print JSON instead of a table",
            "output": "wide: every column (the default view fits 80 columns); json: as --json"})
def status(c, inventory=INVENTORY, json=False, output=""):
    """One line per host: role, Ready, GPUs and allocatable nvidia.com/gpu, what plan would do
    (in sync, N changes, refused by preflight); -o wide adds versions and GPU use."""
    _done(run("status", inventory=inventory, **_table_output(output, json)))


@task(name="gpu-usage", help={"inventory": "inventory file",
                              "json": "print JSON instead of a table",
                              "output": "wide: every column (model, UUID); json: as --json"})
def gpu_usage(c, inventory=INVENTORY, json=False, output=""):
    """GPU utilisation, memory and pods per GPU, from the cluster's Prometheus (gpu_monitoring)."""
    _done(run("gpu_usage", inventory=inventory, **_table_output(output, json)))


@task(help={"inventory": "inventory file", "driver": "NVIDIA driver version, e.g. 580.159.04",
            "kubernetes": "Kubernetes patch release, e.g. 1.36.2",
            "limit": "host pattern", "serial": "nodes at a time",
            "drain_timeout": "seconds for kubectl drain", "yes": "do not ask"})
def upgrade(c, driver=None, kubernetes=None, inventory=INVENTORY, limit=None, serial=1,
            drain_timeout=300, yes=False):
    """Upgrade the NVIDIA driver (--driver) or Kubernetes (--kubernetes) node by node: drain,
    upgrade, verify, uncordon; the control plane first for Kubernetes."""
    _done(run("upgrade", inventory=inventory, driver=driver, kubernetes=kubernetes, limit=limit,
              serial=int(serial), drain_timeout=int(drain_timeout), yes=yes))


@task(help={"inventory": "inventory file"})
def kubeconfig(c, inventory=INVENTORY):
    """Fetch admin credentials (0600) to <inventory dir>/artifacts/admin.conf."""
    _done(run("kubeconfig", inventory=inventory))


@task(help={"inventory": "inventory file", "set": "key=value override (repeatable)",
            "values": "workload values file (repeatable)",
            "output": "table (default), json, or list (one image per line)"},
      iterable=["set", "values"])
def images(c, inventory=INVENTORY, set=None, values=None, output="table"):
    """Every image the cluster and the workloads pull at the inventory's versions (to mirror)."""
    _done(run("images", inventory=inventory, sets=set or [], values_files=values or [],
              output=output))


@task(help={"name": "workload: storage, jupyter, tensorflow-job, distributed-tf, tensorboard, "
                    "eval", "inventory": "inventory file",
            "values": "values file (repeatable)", "set": "key.sub=value (repeatable)",
            "timeout": "seconds to wait for the workload's pods",
            "render": "print the manifests deploy would apply; contact no host"},
      iterable=["values", "set"])
def deploy(c, name, inventory=INVENTORY, values=None, set=None, timeout=600, render=False):
    """Deploy a workload (invoke deploy jupyter); waits for its pods and prints them."""
    _done(run("deploy", inventory=inventory, name=name, values_files=values or [],
              sets=set or [], timeout=float(timeout), render_only=render))


@task(help={"name": "workload name", "inventory": "inventory file",
            "values": "values file (repeatable)", "set": "key.sub=value (repeatable)"},
      iterable=["values", "set"])
def undeploy(c, name, inventory=INVENTORY, values=None, set=None):
    """Remove every object of a workload (by its gpuk8s.io/workload label)."""
    _done(run("undeploy", inventory=inventory, name=name, values_files=values or [],
              sets=set or []))


@task(help={"inventory": "inventory file", "values": "values file (repeatable)",
            "set": "key.sub=value (repeatable)",
            "local": "node-level check on the hosts themselves (no cluster): nvidia-smi sees "
                     "every PCI GPU and a CUDA computation is right on each",
            "limit": "host pattern (with --local)",
            "python": "with --local: the Python interpreter whose PyTorch (with CUDA) the "
                      "PyTorch path uses, e.g. /opt/torch/.venv/bin/python3",
            "without_nvcc": "with --local: leave nvcc out, to run the PyTorch path"},
      iterable=["values", "set"])
def verify(c, inventory=INVENTORY, values=None, set=None, local=False, limit=None, python=None,
           without_nvcc=False):
    """Smoke-test every GPU node: a Job per node (nvidia-smi, then TensorFlow listing its GPUs),
    or with --local the node-level check over SSH / on this machine."""
    if (python or without_nvcc) and not local:
        raise Exit("--python and --without-nvcc are options of the node-level check: add "
                   "--local", code=1)
    if local:
        _done(run("verify_local", inventory=inventory, limit=limit, python=python,
                  nvcc=not without_nvcc))
    else:
        _done(run("verify", inventory=inventory, values_files=values or [], sets=set or []))


@task(help={"output": "folder the bundle goes in (default dist)",
            "python_version": "the admin machine's Python, e.g. 3.12 (default: this one)",
            "platform": "the admin machine's pip platform tag, e.g. manylinux_2_28_x86_64 "
                        "(repeatable; older manylinux tags are added; default: this machine's)",
            "tarball": "one gpuk8s-bundle-*.tar.gz instead of a folder",
            "find_links": "a folder of wheels for pip to take from (repeatable)",
            "no_index": "no package index: only the --find-links folders"},
      iterable=["platform", "find_links"])
def bundle(c, output="dist", python_version=None, platform=None, tarball=False, find_links=None,
           no_index=False):
    """gpuk8s, its checkout and every dependency as wheels, for an admin machine without a
    package index: run it where PyPI answers, carry the result over (INSTALL.txt says how)."""
    _done(run("bundle", output=output, python_version=python_version, platforms=platform or [],
              tarball=tarball, find_links=find_links or [], no_index=no_index))


@task(help={"run": "run folder (default: the latest under runs/)"})
def report(c, run=None):
    """A finished run (default: the latest) as one self-contained HTML page, report.html.

    Per-host timeline, what changed, failures with log tails, the cluster's nodes; prints the
    page's path. Needs no inventory."""
    from gpuk8s import cli  # `run` here is the flag, not gpuk8s.cli.run

    _done(cli.run("report", run=run))


ns = Collection(bootstrap, plan, check, facts, reprovision, add_node, remove_node, reset, status,
                upgrade, kubeconfig)
ns.add_task(gpu_usage)
ns.add_task(deploy)
ns.add_task(undeploy)
ns.add_task(verify)
ns.add_task(images)
ns.add_task(report)
ns.add_task(bundle)
try:  # the lab lives in the checkout's tests/; it is not part of the gpuk8s package
    from tests.lab.tasks import lab as _lab

    ns.add_collection(_lab, name="lab")
except ImportError as exc:  # pragma: no cover - only without the tests/ folder
    print(f"note: lab tasks unavailable ({exc})", file=sys.stderr)
try:  # bench/ (invoke bench) lives in the checkout; it needs the lab
    from bench.tasks import bench as _bench

    ns.add_task(_bench)
except ImportError as exc:  # pragma: no cover
    print(f"note: bench task unavailable ({exc})", file=sys.stderr)
