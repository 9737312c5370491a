"""Reading an inventory in Ansible's YAML format."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuk8s.errors import InventoryError
from gpuk8s.inventory.reader import _Entry, _RawGroup, _Reader
from gpuk8s.inventory.text import (
    _GROUP_KEYS,
    _MAX_DEPTH,
)
from gpuk8s.inventory.yamlio import _Fatal, _LineDict, _load_yaml
from gpuk8s.variables import (
    suggest,
)


class _YamlReader(_Reader):
    """Ansible's YAML inventory: all/children/hosts/vars, nested groups, host ranges."""

    def _read_yaml(self, text: str) -> None:
        try:
            data = _load_yaml(text, self.shown)
        except InventoryError as exc:
            self.file_order.setdefault(exc.path, len(self.file_order))
            self.problems.append(exc)
            raise _Fatal from None
        if data is None or data == {}:
            self.problem("the inventory is empty", line=None,
                         fix="start with: all: children: control_plane: hosts: cp-01: "
                         "{ansible_host: 10.0.0.10}")
            raise _Fatal
        if not isinstance(data, _LineDict):
            first = next((i for i, t in enumerate(text.splitlines(), 1)
                          if t.strip() and not t.lstrip().startswith("#")), None)
            self.problem(f"the inventory must be a mapping of groups, not a "
                         f"{type(data).__name__}", line=first,
                         fix="start with all: and put hosts under all: children: <group>: "
                         "hosts:")
            raise _Fatal
        self._duplicates(data, self.shown, "top-level group")
        for key in data:
            line = data.key_lines.get(key)
            if key in ("hosts", "vars", "children", "groups"):
                self.problem(
                    f"top-level {key!r}: an Ansible inventory starts with group names",
                    line=line, fix=f"nest it under all:, i.e. all:\\n  {key}: ... "
                    "(groups go under all: children:)")
                continue
            if not self._group_name_ok(key, self.shown, line):
                continue
            self._yaml_group(key, data[key], line, None, [])

    def _yaml_group(self, name: str, body: Any, line: int | None, parent: str | None,
                    stack: list[int]) -> None:
        path = self.shown
        if len(stack) > _MAX_DEPTH or id(body) in stack:
            self.problem(f"group {name!r} is nested too deeply (or refers to itself)",
                         line=line, fix="flatten the children: tree")
            return
        group = self._group(name, path, line)
        if parent is not None:
            group_parent = self.groups[parent]
            if all(c[0] != group.name for c in group_parent.children):
                group_parent.children.append((group.name, name, line))
        if body is None:
            return
        if not isinstance(body, _LineDict):
            self.problem(f"group {name!r} must be a mapping with hosts:, vars: or children:, "
                         f"got {type(body).__name__}", line=line,
                         fix=f"write {name}:\\n  hosts:\\n    <host>: {{ansible_host: ...}}")
            return
        self._duplicates(body, path, "key")
        for key in body:
            kline = body.key_lines.get(key)
            value = body[key]
            if key not in _GROUP_KEYS:
                best = suggest(str(key), _GROUP_KEYS)
                self.problem(
                    f"unknown key {key!r} in group {name!r} (a group has only hosts, vars "
                    "and children)", line=kline,
                    fix=f"did you mean {best}:?" if best else
                    "put hosts under hosts:, variables under vars:, groups under children:")
                continue
            if value is None:
                continue
            if key == "hosts":
                self._yaml_hosts(name, group, value, kline)
            elif key == "vars":
                if not isinstance(value, _LineDict):
                    self.problem(f"vars of group {name!r} must be a mapping, got "
                                 f"{type(value).__name__}", line=kline,
                                 fix="write vars:\\n  kubernetes_version: \"1.36\"")
                    continue
                self._duplicates(value, path, "variable")
                group.entries.extend(self._entries(value, path, f"{name}.vars"))
            else:
                if not isinstance(value, _LineDict):
                    self.problem(f"children of group {name!r} must be a mapping of group "
                                 f"names, got {type(value).__name__}", line=kline,
                                 fix="write children:\\n  control_plane:\\n  workers:")
                    continue
                self._duplicates(value, path, "child group")
                for child in value:
                    cline = value.key_lines.get(child)
                    if self._group_name_ok(child, path, cline):
                        self._yaml_group(child, value[child], cline, group.name,
                                         [*stack, id(body)])

    def _yaml_hosts(self, gname: str, group: _RawGroup, hosts: Any, line: int | None) -> None:
        path = self.shown
        if not isinstance(hosts, _LineDict):
            example = hosts[0] if isinstance(hosts, list) and hosts and isinstance(
                hosts[0], str) else "gpu-01"
            self.problem(f"hosts of group {gname!r} must be a mapping of host names, got "
                         f"{type(hosts).__name__}", line=line,
                         fix=f"write each host as a key: hosts:\\n  {example}:\\n    "
                         "ansible_host: 10.0.0.21")
            return
        self._duplicates(hosts, path, "host")
        for pattern in hosts:
            hline = hosts.key_lines.get(pattern)
            hvars = hosts[pattern]
            name_pattern, port_entries = self._split_port(pattern, path, hline)
            names = self._host_names(name_pattern, path, hline)
            entries: list[_Entry] = []
            if isinstance(hvars, _LineDict):
                self._duplicates(hvars, path, "variable")
            elif hvars is not None:
                self.problem(f"host {pattern!r} must be followed by a mapping of variables, "
                             f"got {type(hvars).__name__}", line=hline,
                             fix=f"write {pattern}:\\n  ansible_host: 10.0.0.21")
                hvars = None
            for name in names:
                if hvars is not None:
                    entries = self._entries(hvars, path, f"host {name}")
                port = [replace(e, where=f"host {name}") for e in port_entries]
                self._add_host(name, group, path, hline, port + entries)
