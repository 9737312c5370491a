"""Invoke tasks: the gpuk8s commands (gpuk8s/cli.py, the very tasks of the gpuk8s console
script), plus the checkout's lab.* and bench tasks, which the package does not ship."""

from __future__ import annotations

import sys

from invoke import Collection

from gpuk8s.cli import ns as _gpuk8s

ns = Collection(*_gpuk8s.tasks.values())
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
