"""The state and shared steps of reading one inventory (YAML or INI): problems, raw groups
and hosts, names, variable entries."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuk8s.errors import InventoryError
from gpuk8s.inventory.model import (
    GROUP_ALIASES,
    IGNORED_GROUPS,
)
from gpuk8s.inventory.text import (
    _GROUP_NAME,
    _HOST_NAME,
    _display,
    _expand_hosts,
)
from gpuk8s.inventory.yamlio import _Fatal, _LineDict
from gpuk8s.variables import (
    Origin,
    VarSpec,
)

#: the inventory file of an Ansible inventory folder (kubespray's inventory/mycluster/, DeepOps'
#: config/), first found
FOLDER_FILES = ("hosts.yaml", "hosts.yml", "hosts.ini", "hosts", "inventory.yaml",
                "inventory.yml", "inventory.ini", "inventory")


#: a commented-out host line of a template: INI `# node1 ansible_host=...`, YAML `#  node1:`
#: followed by `#    ansible_host: ...`
_COMMENTED_HOST = re.compile(r"^\s*#+\s*[A-Za-z0-9_][\w.\-\[\]:]*\s+\w+=\S|"
                             r"^\s*#+\s*ansible_host\s*:\s*\S", re.M)


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def commented_hosts(text: str) -> str:
    """", but N host lines are commented out..." for a template whose hosts wait to be
    uncommented; "" otherwise."""
    count = len(_COMMENTED_HOST.findall(text))
    if not count:
        return ""
    return (f", but {count} host line{'s are' if count > 1 else ' is'} commented out (a "
            "template: uncomment and fill them in)")


def inventory_file(path: str | Path) -> Path:
    """The file to read: ``path`` itself, or for a folder its inventory file (its group_vars/
    and host_vars/ then apply as Ansible applies them)."""
    p = Path(path)
    if p.is_dir():
        for name in FOLDER_FILES:
            if (p / name).is_file():
                return p / name
    return p


@dataclass
class _Entry:
    """One `key: value` as written: in the inventory, a vars file or --set."""

    key: Any
    value: Any
    path: str
    line: int | None
    where: str = ""
    raw: str | None = None  # number as written (YAML)
    text: bool = False  # INI or --set: value is text to convert by the variable's type
    checked: bool = False
    ok: bool = False
    result: Any = None

    @property
    def origin(self) -> Origin:
        if self.path == "--set":
            return Origin("--set", "--set", None)
        at = f"{self.path}:{self.line}" if self.line else self.path
        return Origin(f"{at} ({self.where})" if self.where else at, self.path, self.line)


@dataclass
class _RawGroup:
    name: str  # canonical
    path: str
    line: int | None
    written: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    children: list[tuple[str, str, int | None]] = field(default_factory=list)
    entries: list[_Entry] = field(default_factory=list)


@dataclass
class _RawHost:
    name: str
    path: str
    line: int | None
    entries: list[_Entry] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)  # canonical, direct


class _Reader:
    """What reading an inventory needs: the problems found so far (file, line, fix), the raw
    groups and hosts, and how names and entries are read."""

    def __init__(self, path: Path, overrides: Mapping[str, Any] | Sequence[str],
                 env: Mapping[str, str] | None, project_root: Path | None) -> None:
        self.path = path
        self.shown = _display(path)
        self.base = path.resolve().parent if path.exists() else path.parent.absolute()
        self.overrides = overrides
        self.env = os.environ if env is None else env
        self.project_root = project_root
        self.specs: dict[str, VarSpec] = {}
        self.problems: list[InventoryError] = []
        self.file_order: dict[str | None, int] = {self.shown: 0}
        self.notes: list[str] = []
        self.foreign: dict[str, dict[str, int | None]] = {}  # file -> unused variable -> line
        # (file, gpuk8s variable) -> (other tool's name, translated value, line)
        self.mapped: dict[tuple[str, str], tuple[str, Any, int | None]] = {}
        self.groups: dict[str, _RawGroup] = {}
        self.hosts: dict[str, _RawHost] = {}
        self.vars_files: dict[tuple[str, str], list[_Entry]] = {}  # (kind, name) -> entries
        self.override_entries: list[_Entry] = []
        self.structural = False  # problems in the shape of the inventory were found

    def problem(self, message: str, *, line: int | None, fix: str, path: str | None = None
                ) -> None:
        where = self.shown if path is None else path
        self.file_order.setdefault(where, len(self.file_order))
        self.problems.append(InventoryError(message, path=where, line=line, fix=fix))

    def sorted_problems(self) -> list[InventoryError]:
        seen: set[tuple[Any, ...]] = set()
        unique = []
        for p in self.problems:
            key = (p.path, p.line, p.message)
            if key not in seen:
                seen.add(key)
                unique.append(p)
        big = len(self.file_order) + 1
        return sorted(unique, key=lambda p: (self.file_order.get(p.path, big),
                                             p.line if p.line is not None else 10**9))

    def _read_text(self, path: Path, shown: str) -> str:
        if not path.exists():
            self.problem("inventory file not found", line=None, path=shown,
                         fix="check the path given to --inventory (e.g. inventories/lab.yaml)")
            raise _Fatal
        if path.is_dir():
            self.problem("the inventory folder holds none of hosts.yaml, hosts.yml, hosts.ini, "
                         "hosts, inventory.yaml, inventory.yml, inventory.ini, inventory",
                         line=None, path=shown,
                         fix="pass the inventory file itself, e.g. inventories/lab.yaml")
            raise _Fatal
        data = path.read_bytes()
        if data.startswith(b"#!") and os.access(path, os.X_OK):
            self.problem("this is an executable (dynamic) inventory script; gpuk8s reads static "
                         "YAML or INI inventories and never runs it", line=1, path=shown,
                         fix=f"write a static inventory from it: ansible-inventory -i {shown} "
                         "--list -y > inventory.yaml (then check the groups)")
            raise _Fatal
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.problem("the file is not UTF-8 text", line=data[:exc.start].count(b"\n") + 1,
                         path=shown, fix="save the file as UTF-8")
            raise _Fatal from None

    def _detect(self, text: str) -> str:
        suffix = self.path.suffix.lower()
        if suffix in (".yaml", ".yml", ".json"):
            return "yaml"
        if suffix in (".ini", ".cfg", ".txt", ".hosts"):
            return "ini"
        # No telling suffix (e.g. "hosts"): YAML if it reads as a mapping, else INI.
        try:
            data = yaml.load(text, Loader=yaml.SafeLoader)
        except Exception:  # any failure means "not YAML"
            return "ini"
        return "yaml" if isinstance(data, dict) else "ini"

    def _group(self, written: str, path: str, line: int | None) -> _RawGroup:
        name = GROUP_ALIASES.get(written, written)
        group = self.groups.get(name)
        if group is None:
            group = self.groups[name] = _RawGroup(name, path, line)
        if written not in group.written:
            group.written.append(written)
            if written != name:
                self.notes.append(f"group {written!r} is read as {name!r}")
            if name in IGNORED_GROUPS:
                self.notes.append(f"group {name!r} is ignored: {IGNORED_GROUPS[name]}")
        return group

    def _add_host(self, name: str, group: _RawGroup, path: str, line: int | None,
                  entries: list[_Entry]) -> None:
        host = self.hosts.get(name)
        if host is None:
            host = self.hosts[name] = _RawHost(name, path, line)
        host.entries.extend(entries)
        if group.name not in host.groups:
            host.groups.append(group.name)
        if name not in group.hosts:
            group.hosts.append(name)

    @staticmethod
    def _split_port(pattern: Any, path: str, line: int | None) -> tuple[Any, list[_Entry]]:
        """``host:5309`` as Ansible reads it: host ``host``, ansible_port 5309 (a variable the
        host's own ansible_port overrides); a range's brackets may hold colons."""
        if not isinstance(pattern, str):
            return pattern, []
        v6 = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d+))?", pattern)
        if v6 and _is_ipv6(v6.group(1)):  # [2001:db8::1]:2222, not a range
            given = [_Entry("ansible_port", v6.group(2), path, line, "host name", text=True)]
            return v6.group(1), given if v6.group(2) else []
        outside = re.sub(r"\[[^\]]*\]", "", pattern)
        if outside.count(":") != 1 or not re.search(r":\d+$", pattern):
            return pattern, []
        pattern, _, port = pattern.rpartition(":")
        return pattern, [_Entry("ansible_port", port, path, line, "host name", text=True)]

    def _host_names(self, pattern: Any, path: str, line: int | None) -> list[str]:
        if isinstance(pattern, int) and not isinstance(pattern, bool):
            pattern = str(pattern)
        if not isinstance(pattern, str) or not pattern.strip():
            self.problem(f"a host name must be text, got {type(pattern).__name__}", line=line,
                         path=path, fix='quote it: "gpu-01":')
            return []
        try:
            names = _expand_hosts(pattern)
        except ValueError as exc:
            self.problem(f"bad host range {pattern!r}: {exc}", line=line, path=path,
                         fix="write a range like gpu-[01:04] (gpu-01 ... gpu-04)")
            return []
        good = []
        for name in names:
            if not _HOST_NAME.fullmatch(name):
                self.problem(f"host name {name!r} has characters gpuk8s does not accept",
                             line=line, path=path,
                             fix="name hosts with letters, digits, '-', '_' and '.'; put the "
                             "address in ansible_host")
            else:
                good.append(name)
        return good

    def _group_name_ok(self, name: Any, path: str, line: int | None) -> bool:
        if not isinstance(name, str) or not _GROUP_NAME.fullmatch(name):
            shown = name if isinstance(name, str) else type(name).__name__
            self.problem(f"bad group name {shown!r}", line=line, path=path,
                         fix="name groups with letters, digits, '_', '-' and '.'")
            return False
        return True

    def _duplicates(self, d: _LineDict, path: str, what: str) -> None:
        for key, line, first in d.duplicates:
            if what == "host":
                msg = f"host {key!r} is listed twice in this hosts: mapping (first at line " \
                      f"{first}); YAML keeps only the last one and drops its variables"
                fix = "list each host once per group, with all its variables"
            else:
                msg = f"duplicate {what} {key!r} (first at line {first}); YAML keeps only " \
                      "the last one"
                fix = f"keep one {key}: and merge the two"
            self.problem(msg, line=line, path=path, fix=fix)

    def _entries(self, d: _LineDict, path: str, where: str) -> list[_Entry]:
        return [_Entry(k, d[k], path, d.key_lines.get(k), where, d.raw.get(k)) for k in d]

    _SECTION = re.compile(r"\[([^\]\s:]+)(?::(\w+))?\]\s*(?:[#;].*)?")
