"""Invoke tasks: parse flags, call one gpuk8s.api function (through gpuk8s.cli.run)."""

from __future__ import annotations

import sys

from invoke import Collection, Exit, task

from gpuk8s.cli import run

INVENTORY = "inventories/lab.yaml"


def _done(code: int) -> None:
    if code:
        raise Exit(code=code)


@task(help={"inventory": "inventory file (YAML or INI)", "limit": "host pattern, e.g. gpu-03",
            "yes": "apply without asking", "check": "plan only (same as invoke plan)",
            "diff": "show file diffs", "set": "key=value override (repeatable)",
            "ask_become_pass": "prompt for the sudo password"},
      iterable=["set"])
def bootstrap(c, inventory=INVENTORY, limit=None, yes=False, check=False, diff=False, set=None,
              ask_become_pass=False):
    """Bring every host to a Ready Kubernetes GPU cluster node; a re-run changes nothing."""
    _done(run("bootstrap", inventory=inventory, limit=limit, yes=yes, check=check, diff=diff,
              sets=set or [], ask_become_pass=ask_become_pass))


@task(help={"inventory": "inventory file", "limit": "host pattern", "diff": "show file diffs",
            "set": "key=value override (repeatable)",
            "ask_become_pass": "prompt for the sudo password"}, iterable=["set"])
def plan(c, inventory=INVENTORY, limit=None, diff=False, set=None, ask_become_pass=False):
    """Show what bootstrap would change on every host; changes nothing."""
    _done(run("plan", inventory=inventory, limit=limit, diff=diff, sets=set or [],
              ask_become_pass=ask_become_pass))


@task(help={"inventory": "inventory file", "limit": "host pattern",
            "ask_become_pass": "prompt for the sudo password"})
def facts(c, inventory=INVENTORY, limit=None, ask_become_pass=False):
    """Print every fact gpuk8s gathers, per host, as JSON."""
    _done(run("facts", inventory=inventory, limit=limit, ask_become_pass=ask_become_pass))


ns = Collection(bootstrap, plan, facts)
try:  # the lab lives in the checkout's tests/; it is not part of the gpuk8s package
    from tests.lab.tasks import lab as _lab

    ns.add_collection(_lab, name="lab")
except ImportError as exc:  # pragma: no cover - only without the tests/ folder
    print(f"note: lab tasks unavailable ({exc})", file=sys.stderr)
