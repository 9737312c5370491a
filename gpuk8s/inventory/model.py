"""The inventory's model: hosts (how to reach each, its groups, its merged variables),
groups, the inventory itself with --limit selection, and Secret (a value that never prints)."""

from __future__ import annotations

import fnmatch
import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpuk8s.errors import InventoryError
from gpuk8s.inventory.text import _display
from gpuk8s.variables import (
    MergedVars,
    suggest,
)

BECOME_PASSWORD_ENV = "GPUK8S_BECOME_PASSWORD"


CONTROL_PLANE = "control_plane"


WORKERS = "workers"


# Group names used by kubespray, DeepOps and others, read as ours.
GROUP_ALIASES: dict[str, str] = {
    "kube_control_plane": CONTROL_PLANE,
    "kube-master": CONTROL_PLANE,
    "kube_master": CONTROL_PLANE,
    "masters": CONTROL_PLANE,
    "master": CONTROL_PLANE,  # NVIDIA Cloud Native Stack
    "server": CONTROL_PLANE,  # k3s-ansible
    "control": CONTROL_PLANE,  # chutes-miner
    "kube_node": WORKERS,
    "kube-node": WORKERS,
    "nodes": WORKERS,
    "node": WORKERS,  # NVIDIA Cloud Native Stack
    "agent": WORKERS,  # k3s-ansible
}


# Groups whose hosts and variables gpuk8s does not use, and why.
IGNORED_GROUPS: dict[str, str] = {
    "etcd": "kubeadm runs etcd on the control planes (stacked etcd)",
    "calico_rr": "calico route reflectors are not managed by gpuk8s",
}


#: kubespray's jump host: its one host is the ProxyJump of every other host, never a member
BASTION = "bastion"


class Secret:
    """A string that never shows itself in repr/str/format; ``reveal()`` gives the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('********')"

    def __str__(self) -> str:
        return "********"

    def __format__(self, spec: str) -> str:
        return "********"

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash((Secret, self._value))


@dataclass(frozen=True, repr=False)
class Host:
    """One machine: how to reach it, its groups (canonical names) and its merged variables."""

    name: str
    address: str
    port: int = 22
    user: str = "root"
    groups: tuple[str, ...] = ()
    vars: MergedVars = field(default_factory=lambda: MergedVars({}, {}))
    private_key_file: str | None = None
    identity_files: tuple[str, ...] = ()  # every key to try, private_key_file first
    become: bool | None = None  # None: True when user != "root"
    become_password: Secret | None = None
    connection: str = "ssh"  # "ssh" or "local"
    proxy_jump: str | None = None
    proxy_command: str | None = None
    known_hosts_files: tuple[str, ...] = ()
    strict_host_key_checking: str | None = None  # "yes", "no" or "accept-new"
    ssh_config_file: str | None = None
    warnings: tuple[str, ...] = ()
    source: str = field(default="", compare=False)  # "inventories/lab.yaml:12"

    def __post_init__(self) -> None:
        if self.become is None:
            object.__setattr__(self, "become", self.user != "root")
        if self.become_password is not None and not isinstance(self.become_password, Secret):
            object.__setattr__(self, "become_password", Secret(str(self.become_password)))

    def __hash__(self) -> int:
        return hash((Host, self.name, self.address, self.port))

    def __repr__(self) -> str:
        password = "<set>" if self.become_password is not None else None
        return (f"Host({self.name!r}, address={self.address!r}, port={self.port}, "
                f"user={self.user!r}, groups={self.groups!r}, connection={self.connection!r}, "
                f"become={self.become}, become_password={password})")

    @property
    def key_file(self) -> str | None:
        """Same as private_key_file."""
        return self.private_key_file

    @property
    def is_control_plane(self) -> bool:
        return CONTROL_PLANE in self.groups

    @property
    def is_worker(self) -> bool:
        """A node that joins as a worker (a control plane also listed in workers is not)."""
        return WORKERS in self.groups and not self.is_control_plane

    @property
    def schedulable(self) -> bool:
        """Runs workloads: workers, and control planes also in workers (kubespray style) or with
        control_plane_schedulable: true."""
        if self.is_worker:
            return True
        return self.is_control_plane and (WORKERS in self.groups
                                          or self.vars.get("control_plane_schedulable") is True)

    @property
    def absent(self) -> bool:
        return self.vars.get("absent") is True


@dataclass(frozen=True)
class Group:
    """A group; ``hosts`` includes the hosts of its child groups, in inventory order."""

    name: str
    hosts: tuple[str, ...] = ()
    children: tuple[str, ...] = ()
    aliases: tuple[str, ...] = field(default=(), compare=False)  # names it was written as
    source: str = field(default="", compare=False)


@dataclass(frozen=True)
class Inventory:
    """A loaded, validated inventory."""

    path: Path = field(compare=False)
    hosts: Mapping[str, Host]
    groups: Mapping[str, Group]
    notes: tuple[str, ...] = field(default=(), compare=False)
    #: what every run prints: the variables gpuk8s ignores, one line per file
    warnings: tuple[str, ...] = field(default=(), compare=False)
    #: the hosts of an ``etcd`` group (kubespray runs etcd there, apart from the control
    #: planes); unused, but named when the control planes are an even number
    etcd_group: tuple[str, ...] = field(default=(), compare=False)

    def __repr__(self) -> str:
        return f"Inventory({str(self.path)!r}, hosts={list(self.hosts)!r})"

    @property
    def control_planes(self) -> list[Host]:
        return [h for h in self.hosts.values() if h.is_control_plane]

    @property
    def workers(self) -> list[Host]:
        return [h for h in self.hosts.values() if h.is_worker]

    def present(self) -> list[Host]:
        """Hosts not marked ``absent: true``."""
        return [h for h in self.hosts.values() if not h.absent]

    def vars_for(self, name: str) -> MergedVars:
        if name not in self.hosts:
            raise InventoryError(f"unknown host {name!r}", path=_display(self.path),
                                 fix=f"known hosts: {', '.join(self.hosts)}")
        return self.hosts[name].vars

    def needs_become_password(self) -> list[str]:
        """Present hosts that use sudo and have no password (inventory or environment)."""
        return [h.name for h in self.present() if h.become and h.become_password is None]

    def with_become_password(self, password: str | Secret,
                             names: Iterable[str] | None = None) -> Inventory:
        """A copy where ``names`` (default: needs_become_password()) use ``password``."""
        secret = password if isinstance(password, Secret) else Secret(password)
        chosen = set(self.needs_become_password() if names is None else names)
        hosts = {n: (replace(h, become_password=secret) if n in chosen else h)
                 for n, h in self.hosts.items()}
        return replace(self, hosts=hosts)

    def select(self, limit: str | None = None, *, present_only: bool = False) -> list[Host]:
        """Hosts matching an Ansible-like limit, in inventory order.

        ``limit``: comma-separated host names, group names, globs (``gpu-*``), ``~regex``,
        ``all``; ``!pattern`` excludes, ``&pattern`` intersects. None or "" selects every host.
        A pattern that matches nothing is an InventoryError listing the known hosts.
        """
        order = list(self.hosts)
        if limit is None or not limit.strip():
            chosen = set(order)
        else:
            sep = "," if "," in limit or "[" in limit else ":"
            include: set[str] = set()
            has_include = False
            intersect: list[set[str]] = []
            exclude: set[str] = set()
            for part in (p.strip() for p in limit.split(sep)):
                if not part:
                    continue
                op = part[0] if part[0] in "!&" else ""
                matched = self._match(part[len(op):].strip(), part)
                if op == "!":
                    exclude |= matched
                elif op == "&":
                    intersect.append(matched)
                else:
                    has_include = True
                    include |= matched
            chosen = include if has_include else set(order)
            for other in intersect:
                chosen &= other
            chosen -= exclude
        hosts = [self.hosts[n] for n in order if n in chosen]
        return [h for h in hosts if not h.absent] if present_only else hosts

    def _match(self, pattern: str, written: str) -> set[str]:
        if pattern in ("all", "*"):
            return set(self.hosts)
        if pattern in self.hosts:
            return {pattern}
        group = GROUP_ALIASES.get(pattern, pattern)
        if group in self.groups:
            return set(self.groups[group].hosts)
        found: set[str] = set()
        if pattern.startswith("~"):
            try:
                rx = re.compile(pattern[1:])
            except re.error as exc:
                raise InventoryError(f"--limit {written!r}: bad regular expression ({exc})",
                                     fix="write --limit '~gpu-0[1-4]'") from None
            found = {n for n in self.hosts if rx.search(n)}
            for g in self.groups.values():
                if rx.search(g.name):
                    found |= set(g.hosts)
        elif any(c in pattern for c in "*?["):
            found = set(fnmatch.filter(list(self.hosts), pattern))
            for g in self.groups.values():
                if fnmatch.fnmatchcase(g.name, pattern):
                    found |= set(g.hosts)
        if not found:
            known = ", ".join(self.hosts)
            groups = ", ".join(g for g in self.groups if g not in ("all", "ungrouped"))
            best = suggest(pattern, [*self.hosts, *self.groups])
            hint = f"did you mean {best!r}? " if best else ""
            raise InventoryError(
                f"--limit {written!r} matches no host or group (known hosts: {known})",
                path=_display(self.path),
                fix=f"{hint}use host names, group names ({groups}) or globs like 'gpu-*'")
        return found
