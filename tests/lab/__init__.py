"""gpuk8s lab: booted Debian 12 system containers reachable over real SSH (see CONTRACT.md).

Python API::

    from tests.lab import Lab
    lab = Lab()
    nodes = lab.up()                      # default topology (topologies/default.yaml)
    rc, out, err = lab.ssh("gpu-01", "lspci -nn")
    lab.reboot("cpu-01")                  # returns the new boot_id
    lab.snapshot("bootstrapped"); lab.restore("bootstrapped")
    lab.down()
"""

from __future__ import annotations

import importlib
from typing import Any

#: name -> the submodule that defines it, imported on first use (PEP 562): `invoke` loads
#: tests.lab.tasks for every command, and importing the whole lab cost each run ~0.1 s
_WHERE = {"Lab": "lab", "Node": "lab", "NodeStatus": "lab", "sshd_ready": "lab",
          "LabError": "paths", "cache_dir": "paths", "state_dir": "paths",
          "NodeSpec": "topology", "Topology": "topology", "inventory": "topology",
          "write_inventory": "topology"}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
