"""Ansible-compatible inventory (YAML and INI): hosts, groups, merged variables, validation.

- model: Host, Group, Inventory (with --limit selection), Secret; our group names and aliases
- builder: load_inventory / validate_all, reading YAML, INI, group_vars/host_vars and --set
- ansible: the connection keys gpuk8s honours and ssh arguments
- text: host and group names, host ranges, INI values
- yamlio: YAML with line numbers

Everything here runs before any host is contacted. load_inventory() raises the first problem
as an InventoryError naming the file, the line and the fix; validate_all() returns them all.
"""

from __future__ import annotations

from gpuk8s.inventory.builder import load_inventory, validate_all
from gpuk8s.inventory.model import (
    BECOME_PASSWORD_ENV,
    CONTROL_PLANE,
    GROUP_ALIASES,
    IGNORED_GROUPS,
    WORKERS,
    Group,
    Host,
    Inventory,
    Secret,
)

__all__ = ["BECOME_PASSWORD_ENV", "CONTROL_PLANE", "GROUP_ALIASES", "IGNORED_GROUPS", "WORKERS",
           "Group", "Host", "Inventory", "Secret", "load_inventory", "validate_all"]
