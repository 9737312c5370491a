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

from .lab import Lab, Node, NodeStatus, sshd_ready
from .paths import LabError, cache_dir, state_dir
from .topology import NodeSpec, Topology, inventory, write_inventory

__all__ = [
    "Lab",
    "LabError",
    "Node",
    "NodeSpec",
    "NodeStatus",
    "Topology",
    "cache_dir",
    "inventory",
    "sshd_ready",
    "state_dir",
    "write_inventory",
]
