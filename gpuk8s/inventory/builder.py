"""Reading an inventory (YAML or INI, group_vars/host_vars, --set) into an Inventory, with
every problem named by file, line and fix.

Everything here runs before any host is contacted. load_inventory() raises the first problem
as an InventoryError naming the file, the line and the fix; validate_all() returns them all.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from gpuk8s.errors import InventoryError
from gpuk8s.inventory.ansible import (
    _ANSIBLE_RENAMES,
    _CONNECTIONS,
    _FALSE,
    _PASSWORD_KEYS,
    _TRUE,
    ANSIBLE_KEYS,
    _has_line_break,
    _parse_ssh_args,
    _resolve_path,
    _Ssh,
    _SshArgError,
)
from gpuk8s.inventory.model import (
    BECOME_PASSWORD_ENV,
    GROUP_ALIASES,
    IGNORED_GROUPS,
    Group,
    Host,
    Inventory,
    Secret,
)
from gpuk8s.inventory.text import (
    _GROUP_KEYS,
    _GROUP_NAME,
    _HOST_NAME,
    _MAX_DEPTH,
    _display,
    _expand_hosts,
    _text_value,
)
from gpuk8s.inventory.yamlio import _Fatal, _LineDict, _load_yaml, _nested_duplicates, _plain
from gpuk8s.variables import (
    CLUSTER_WIDE,
    MergedVars,
    Origin,
    VarLayer,
    VarProblem,
    VarSpec,
    check_combination,
    check_value,
    defaults_layer,
    load_variable_specs,
    merge_vars,
    parse_override_value,
    suggest,
    unknown_variable,
)


def load_inventory(path: str | Path, *, overrides: Mapping[str, Any] | Sequence[str] = (),
                   env: Mapping[str, str] | None = None,
                   project_root: Path | None = None) -> Inventory:
    """Read, validate and merge an inventory; raise the first problem as InventoryError.

    ``overrides``: ``--set`` values, as ``["k=v", ...]`` or ``{"k": "v"}`` (text values are
    parsed as YAML). ``env``: where GPUK8S_BECOME_PASSWORD is read (default os.environ).
    """
    builder = _Builder(Path(path), overrides, env, project_root)
    inventory = builder.build()
    problems = builder.sorted_problems()
    if problems:
        raise problems[0]
    assert inventory is not None
    return inventory


def validate_all(path: str | Path, *, overrides: Mapping[str, Any] | Sequence[str] = (),
                 env: Mapping[str, str] | None = None,
                 project_root: Path | None = None) -> list[InventoryError]:
    """Every problem of the inventory (empty list: valid), in file order."""
    builder = _Builder(Path(path), overrides, env, project_root)
    builder.build()
    return builder.sorted_problems()


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


class _Builder:
    """Reads the inventory, records problems, builds the Inventory."""

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
        self.groups: dict[str, _RawGroup] = {}
        self.hosts: dict[str, _RawHost] = {}
        self.vars_files: dict[tuple[str, str], list[_Entry]] = {}  # (kind, name) -> entries
        self.override_entries: list[_Entry] = []
        self.structural = False  # problems in the shape of the inventory were found

    # ---------------------------------------------------------------- problems

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

    # ---------------------------------------------------------------- top level

    def build(self) -> Inventory | None:
        try:
            self.specs = load_variable_specs(self.project_root)
        except InventoryError as exc:
            self.problems.append(exc)
            return None
        self._read_overrides()
        try:
            text = self._read_text(self.path, self.shown)
            fmt = self._detect(text)
            if fmt == "yaml":
                self._read_yaml(text)
            else:
                self._read_ini(text)
        except _Fatal:
            return None
        self.structural = bool(self.problems)
        if not self.hosts:
            if self.structural:  # "no hosts" would only repeat the problem above
                return None
            self.problem("the inventory defines no hosts", line=None,
                         fix="add hosts, e.g. all: children: control_plane: hosts: cp-01: "
                         "{ansible_host: 10.0.0.10}")
            return None
        self._check_graph()
        self._read_vars_dirs()
        return self._assemble()

    def _read_text(self, path: Path, shown: str) -> str:
        if not path.exists():
            self.problem("inventory file not found", line=None, path=shown,
                         fix="check the path given to --inventory (e.g. inventories/lab.yaml)")
            raise _Fatal
        if path.is_dir():
            self.problem("the inventory path is a directory", line=None, path=shown,
                         fix="pass the inventory file itself, e.g. inventories/lab.yaml")
            raise _Fatal
        data = path.read_bytes()
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

    # ---------------------------------------------------------------- groups and hosts

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

    # ---------------------------------------------------------------- YAML

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
            names = self._host_names(pattern, path, hline)
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
                self._add_host(name, group, path, hline, entries)

    def _entries(self, d: _LineDict, path: str, where: str) -> list[_Entry]:
        return [_Entry(k, d[k], path, d.key_lines.get(k), where, d.raw.get(k)) for k in d]

    # ---------------------------------------------------------------- INI

    _SECTION = re.compile(r"\[([^\]\s:]+)(?::(\w+))?\]\s*(?:[#;].*)?")

    def _read_ini(self, text: str) -> None:
        path = self.shown
        group = self._group("ungrouped", path, None)
        state = "hosts"
        for lineno, raw_line in enumerate(text.splitlines(), start=1):
            line = raw_line.strip()
            if not line or line[0] in "#;":
                continue
            secret = "pass" in line.lower()
            if line.startswith("["):
                m = self._SECTION.fullmatch(line)
                if not m:
                    self.problem("bad section header", line=lineno,
                                 fix="write [group], [group:vars] or [group:children]")
                    state = "skip"
                    continue
                name, kind = m[1], m[2] or "hosts"
                if m[2] is not None and kind not in ("vars", "children"):
                    self.problem(f"unknown section type :{kind}", line=lineno,
                                 fix=f"write [{name}:vars] or [{name}:children]")
                    state = "skip"
                    continue
                if not self._group_name_ok(name, path, lineno):
                    state = "skip"
                    continue
                group = self._group(name, path, lineno)
                state = kind
                continue
            if state == "skip":
                continue
            if state == "hosts":
                self._ini_host(line, lineno, group, secret)
            elif state == "vars":
                key, sep, value = line.partition("=")
                key = key.strip()
                if not sep or not key or " " in key:
                    shown = "" if secret else f": {line!r}"
                    self.problem(f"expected key=value in [{group.name}:vars]{shown}",
                                 line=lineno, fix="write one key=value per line")
                    continue
                value = value.strip()
                if value[:1] not in "'\"":
                    value = re.split(r"\s+[#;]", value, maxsplit=1)[0]
                group.entries.append(_Entry(key, value, path, lineno,
                                            f"[{group.written[-1]}:vars]", text=True))
            else:
                child = re.split(r"\s+[#;]|\s", line, maxsplit=1)[0]
                if child != line.split("#")[0].split(";")[0].strip():
                    self.problem(f"expected one group name per line in [{group.name}:children]",
                                 line=lineno, fix="write each child group on its own line")
                    continue
                if self._group_name_ok(child, path, lineno):
                    canonical = self._group(child, path, lineno).name
                    if all(c[0] != canonical for c in group.children):
                        group.children.append((canonical, child, lineno))

    def _ini_host(self, line: str, lineno: int, group: _RawGroup, secret: bool) -> None:
        path = self.shown
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError as exc:
            self.problem(f"cannot split the host line ({exc})", line=lineno,
                         fix="balance the quotes: key=\"value with spaces\"")
            return
        if not tokens:
            return
        pattern, entries = tokens[0], []
        port: str | None = None
        outside = re.sub(r"\[[^\]]*\]", "", pattern)
        if outside.count(":") == 1 and re.search(r":\d+$", pattern):
            pattern, _, port = pattern.rpartition(":")
        names = self._host_names(pattern, path, lineno)
        if port is not None:
            entries.append(_Entry("ansible_port", port, path, lineno, "host line", text=True))
        for i, tok in enumerate(tokens[1:], start=2):
            key, sep, value = tok.partition("=")
            if not sep or not key:
                shown = f"word {i}" if secret else repr(tok)
                self.problem(f"expected key=value after the host name, got {shown}",
                             line=lineno, fix="write host ansible_host=10.0.0.21 key=value "
                             "(no spaces around =)")
                continue
            entries.append(_Entry(key, value, path, lineno, "", text=True))
        for name in names:
            host_entries = [replace(e, where=f"host {name}") for e in entries]
            self._add_host(name, group, path, lineno, host_entries)

    # ---------------------------------------------------------------- --set

    def _read_overrides(self) -> None:
        items: list[tuple[str, Any, bool]] = []
        over = self.overrides
        if isinstance(over, Mapping):
            items = [(str(k), v, isinstance(v, str)) for k, v in over.items()]
        else:
            for item in [over] if isinstance(over, str) else list(over):
                key, sep, value = str(item).partition("=")
                key = key.strip()
                if not sep or not key:
                    self.problem(f"--set {item!r} is not key=value", line=None, path="--set",
                                 fix="write --set key=value, e.g. --set kubernetes_version=1.36")
                    continue
                items.append((key, value, True))
        for key, value, is_text in items:
            if key in _PASSWORD_KEYS:  # the value is never shown, nor kept
                self.problem(f"{key} cannot be given with --set: a password on the command line "
                             "is visible to every user of this machine (ps) and stays in the "
                             "shell history", line=None, path="--set",
                             fix="put ansible_become_password in host_vars/<host>.yaml or "
                             f"group_vars, export {BECOME_PASSWORD_ENV}, or pass "
                             "--ask-become-pass to be prompted")
                continue
            if is_text and not key.startswith("ansible_"):
                value = parse_override_value(self.specs.get(key), value)
                is_text = False
            self.override_entries.append(_Entry(key, value, "--set", None, "--set",
                                                text=is_text))

    # ---------------------------------------------------------------- group_vars, host_vars

    def _read_vars_dirs(self) -> None:
        names = {"group_vars": {"all": "all"}, "host_vars": {}}
        for gname, group in self.groups.items():
            for written in group.written:
                names["group_vars"][written] = gname
        for hname in self.hosts:
            names["host_vars"][hname] = hname
        for kind in ("group_vars", "host_vars"):
            folder = self.base / kind
            if not folder.is_dir():
                continue
            used: set[str] = set()
            for written, target in sorted(names[kind].items()):
                for f in self._vars_files(folder, written):
                    used.add(f.relative_to(folder).parts[0])
                    if kind == "group_vars" and target in IGNORED_GROUPS:
                        continue
                    entries = self.vars_files.setdefault((kind, target), [])
                    entries.extend(self._read_vars_file(f))
            for child in sorted(folder.iterdir()):
                if child.name not in used and not child.name.startswith("."):
                    what = "group" if kind == "group_vars" else "host"
                    self.notes.append(f"{kind}/{child.name} matches no {what} of the inventory "
                                      "and is not used")

    def _vars_files(self, folder: Path, name: str) -> list[Path]:
        out: list[Path] = []
        for suffix in ("", ".yaml", ".yml", ".json"):
            p = folder / f"{name}{suffix}"
            if p.is_file():
                out.append(p)
            elif suffix == "" and p.is_dir():
                out.extend(sorted(
                    f for f in p.rglob("*") if f.is_file()
                    and not any(part.startswith(".") for part in f.relative_to(p).parts)
                    and f.suffix.lower() in ("", ".yaml", ".yml", ".json")
                    and not f.name.endswith("~")))
        return out

    def _read_vars_file(self, f: Path) -> list[_Entry]:
        shown = _display(f)
        self.file_order.setdefault(shown, len(self.file_order))
        try:
            text = self._read_text(f, shown)
        except _Fatal:
            return []
        try:
            data = _load_yaml(text, shown)
        except InventoryError as exc:
            self.problems.append(exc)
            return []
        if data is None:
            return []
        if not isinstance(data, _LineDict):
            self.problem(f"a vars file must be a mapping of variable: value, got "
                         f"{type(data).__name__}", line=1, path=shown,
                         fix="write one `name: value` per line")
            return []
        self._duplicates(data, shown, "variable")
        return self._entries(data, shown, "")

    # ---------------------------------------------------------------- structure checks

    def _check_graph(self) -> None:
        for name, host in self.hosts.items():
            clash = next((g for g in self.groups.values() if name in (g.name, *g.written)),
                         None)
            if clash is not None:
                self.problem(f"{name!r} is both a host and a group", line=host.line,
                             path=host.path, fix="rename the host or the group")
        state: dict[str, int] = {}

        def visit(name: str, trail: list[str]) -> None:
            state[name] = 1
            for child, written, line in self.groups[name].children:
                if state.get(child) == 1:
                    loop = " -> ".join([*trail[trail.index(child):], child]) \
                        if child in trail else f"{name} -> {child}"
                    self.problem(f"group {written!r} is its own ancestor ({loop})", line=line,
                                 path=self.groups[name].path,
                                 fix=f"remove {written} from the children of {name}")
                elif state.get(child) is None:
                    visit(child, [*trail, child])
            state[name] = 2

        for name in list(self.groups):
            if name not in state:
                visit(name, [name])

    def _parents(self) -> dict[str, set[str]]:
        parents: dict[str, set[str]] = {g: set() for g in self.groups}
        for name, group in self.groups.items():
            for child, _, _ in group.children:
                parents[child].add(name)
        return parents

    # ---------------------------------------------------------------- entries

    def _check_entry(self, e: _Entry) -> bool:
        """Validate (once) and normalise an entry; False when it has a problem."""
        if e.checked:
            return e.ok
        e.checked = True
        key = e.key
        if not isinstance(key, str):
            self.problem(f"variable names must be text, got {type(key).__name__} {key!r}",
                         line=e.line, path=e.path, fix="use a variable name like "
                         "kubernetes_version")
            return False
        if key.startswith("ansible_"):
            return self._check_ansible(e)
        spec = self.specs.get(key)
        if spec is None:
            p = unknown_variable(key, [*self.specs, *ANSIBLE_KEYS])
            self.problem(p.message, line=e.line, path=e.path, fix=p.fix)
            return False
        for dkey, dline, first in _nested_duplicates(e.value):
            self.problem(f"{key}: duplicate key {dkey!r} (first at line {first}); YAML keeps "
                         "only the last one", line=dline, path=e.path, fix="keep one of them")
            return False
        value = _text_value(e.value, spec) if e.text and isinstance(e.value, str) else e.value
        try:
            value, problem = check_value(spec, value, e.raw)
            plain = _plain(value)
        except RecursionError:
            self.problem(f"{key} is nested too deeply (or refers to itself)", line=e.line,
                         path=e.path, fix=f"write {key} as a plain value")
            return False
        if problem:
            self._report(problem, e, e.value)
            return False
        e.ok, e.result = True, plain
        return True

    def _report(self, p: VarProblem, e: _Entry, value: Any) -> None:
        line = e.line
        if p.subkey is not None and isinstance(value, _LineDict):
            line = value.key_lines.get(p.subkey, line)
        self.problem(p.message, line=line, path=e.path, fix=p.fix)

    def _check_ansible(self, e: _Entry) -> bool:
        key, value = e.key, e.value
        if key not in ANSIBLE_KEYS:
            if key in _ANSIBLE_RENAMES:
                better = _ANSIBLE_RENAMES[key]
                fix = (f"rename it to {better}" if better else
                       "remove it: gpuk8s logs in with SSH keys (ansible_ssh_private_key_file "
                       "or an agent) as ansible_user, and uses sudo")
            else:
                best = suggest(key, ANSIBLE_KEYS)
                fix = f"did you mean {best!r}?" if best else \
                    f"use one of {', '.join(sorted(ANSIBLE_KEYS))}"
            self.problem(f"{key} is not supported by gpuk8s", line=e.line, path=e.path, fix=fix)
            return False
        if e.text and isinstance(value, str):
            value = _text_value(value, None) if key == "ansible_port" else value.strip()
            if key != "ansible_port" and len(value) >= 2 and value[0] == value[-1] \
                    and value[0] in "'\"":
                value = value[1:-1]
        bad: tuple[str, str] | None = None
        if key == "ansible_port":
            if isinstance(value, str) and value.strip().isdigit():
                value = int(value)
            if not isinstance(value, int) or isinstance(value, bool) \
                    or not 1 <= value <= 65535:
                bad = (f"ansible_port must be a port number 1-65535, got {value!r}",
                       "write ansible_port: 22")
        elif key == "ansible_become":
            if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
                value = value.strip().lower() in _TRUE
            if not isinstance(value, bool):
                bad = (f"ansible_become must be true or false, got {value!r}",
                       "write ansible_become: true")
        elif key == "ansible_become_password":
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                value = str(value)
            if not isinstance(value, str):
                bad = ("ansible_become_password must be text (value not shown)",
                       "quote it, or leave it out and set GPUK8S_BECOME_PASSWORD")
            elif _has_line_break(value):
                bad = ("ansible_become_password contains a line break (value not shown): sudo "
                       "reads a password only up to the first one",
                       "write it on one line, in quotes (a YAML `|` block adds a newline)")
            else:
                value = Secret(value)
        else:
            if isinstance(value, int) and not isinstance(value, bool) and key == "ansible_user":
                value = str(value)
            if not isinstance(value, str) or (not value.strip() and key not in (
                    "ansible_ssh_common_args", "ansible_ssh_extra_args")):
                bad = (f"{key} must be non-empty text, got {value!r}", f"write {key}: <text>")
            elif key in ("ansible_host", "ansible_user") and re.search(r"\s", value.strip()):
                bad = (f"{key} must not contain spaces: {value!r}",
                       f"write {key}: 10.0.0.21" if key == "ansible_host" else
                       f"write {key}: ubuntu")
            elif key == "ansible_connection" and value not in _CONNECTIONS:
                bad = (f"ansible_connection {value!r} is not supported (gpuk8s connects with "
                       "ssh, or local for this machine)", "write ansible_connection: ssh")
            elif key in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
                try:
                    _parse_ssh_args(value, self.base)
                except _SshArgError as exc:
                    bad = (f"{key}: {exc.message}", exc.fix)
            if bad is None and isinstance(value, str):
                value = value.strip()
        if bad:
            self.problem(bad[0], line=e.line, path=e.path, fix=bad[1])
            return False
        e.ok, e.result = True, value
        return True

    def _layer(self, entries: Iterable[_Entry], label: str) -> VarLayer:
        values: dict[str, Any] = {}
        origins: dict[str, Origin] = {}
        for e in entries:
            if self._check_entry(e):
                values[e.key] = e.result
                origins[e.key] = e.origin
        return VarLayer(values, origins, label)

    # ---------------------------------------------------------------- assemble

    def _assemble(self) -> Inventory:
        parents = self._parents()
        depth_memo: dict[str, int] = {"all": 0}

        def depth(g: str, seen: frozenset[str] = frozenset()) -> int:
            if g in depth_memo:
                return depth_memo[g]
            ps = [p for p in parents.get(g, ()) if p not in seen and p != "all"]
            d = 1 + max((depth(p, seen | {g}) for p in ps), default=0)
            depth_memo[g] = d
            return d

        def ancestors(g: str) -> set[str]:
            out: set[str] = set()
            todo = [g]
            while todo:
                cur = todo.pop()
                for p in parents.get(cur, ()):
                    if p not in out:
                        out.add(p)
                        todo.append(p)
            return out

        usable = [g for g in self.groups if g not in IGNORED_GROUPS]
        host_groups: dict[str, list[str]] = {}
        dropped: list[str] = []
        for name, raw in self.hosts.items():
            all_groups: set[str] = set()
            for g in raw.groups:
                all_groups |= {g} | ancestors(g)
            kept = [g for g in all_groups if g not in IGNORED_GROUPS
                    and g not in ("all", "ungrouped")]
            direct = [g for g in raw.groups if g not in IGNORED_GROUPS]
            if not direct:
                dropped.append(name)
                self.notes.append(f"host {name!r} is only in ignored groups and is not used")
                continue
            host_groups[name] = sorted(kept, key=lambda g: (depth(g), g))

        # Entries of every used place are validated even where a later layer overrides them.
        defaults = defaults_layer(self.specs)
        all_group = self.groups.get("all")
        all_layers = [self._layer(all_group.entries if all_group else [], "all.vars"),
                      self._layer(self.vars_files.get(("group_vars", "all"), []), "group_vars")]
        group_layers = {g: [self._layer(self.groups[g].entries, f"{g}.vars"),
                            self._layer(self.vars_files.get(("group_vars", g), []),
                                        "group_vars")]
                        for g in usable if g != "all"}
        override = self._layer(self.override_entries, "--set")

        hosts: dict[str, Host] = {}
        addresses: dict[tuple[str, int], str] = {}
        for name, raw in self.hosts.items():
            if name in dropped:
                continue
            layers = [defaults, *all_layers]
            for g in host_groups[name]:
                layers.extend(group_layers.get(g, []))
            layers.append(self._layer(raw.entries, f"host {name}"))
            layers.append(self._layer(self.vars_files.get(("host_vars", name), []),
                                      "host_vars"))
            layers.append(override)
            merged = merge_vars(layers)
            host = self._host(name, raw, merged, host_groups[name])
            hosts[name] = host
            for p in check_combination(host.vars):
                self._report_merged(p, host.vars)
            if host.connection == "ssh":
                addr = (host.address.lower(), host.port)
                if addr in addresses:
                    where = merged.origin_of("ansible_host") if "ansible_host" in merged \
                        else Origin("", raw.path, raw.line)
                    self.problem(f"hosts {addresses[addr]!r} and {name!r} both connect to "
                                 f"{host.address}:{host.port}", line=where.line or raw.line,
                                 path=where.path or raw.path,
                                 fix=f"give {name} its own ansible_host, or remove the "
                                 "duplicate host")
                else:
                    addresses[addr] = name
        self._check_cluster(hosts)
        groups = self._groups(hosts, host_groups)
        if not any(h.is_control_plane for h in hosts.values()) and hosts \
                and not self.structural:
            self.problem("no control plane: no host is in the control_plane group", line=None,
                         fix="add a host under children: control_plane: hosts: (INI: "
                         "[control_plane] then the host name)")
        for name, host in hosts.items():
            if not host.is_control_plane and not host.is_worker:
                self.notes.append(f"host {name!r} is in neither control_plane nor workers")
            for w in host.warnings:
                self.notes.append(f"host {name!r}: {w}")
        return Inventory(self.path, hosts, groups, tuple(dict.fromkeys(self.notes)))

    def _report_merged(self, p: VarProblem, merged: MergedVars) -> None:
        origins = [merged.origin_of(k) for k in (p.key, *p.others) if k in merged]
        user_set = [o for o in origins if not _is_default(o)]
        origin = (user_set or origins or [Origin("")])[0]
        self.problem(p.message, line=origin.line, path=origin.path or self.shown, fix=p.fix)

    def _check_cluster(self, hosts: Mapping[str, Host]) -> None:
        first: dict[str, tuple[str, Any]] = {}
        for name, host in hosts.items():
            for key in CLUSTER_WIDE:
                if key not in host.vars:
                    continue
                value = host.vars[key]
                if key not in first:
                    first[key] = (name, value)
                elif first[key][1] != value:
                    other, ovalue = first[key]
                    origin = host.vars.origin_of(key)
                    if _is_default(origin):
                        origin = hosts[other].vars.origin_of(key)
                    self.problem(f"{key} differs between hosts: {other} has {ovalue!r}, {name} "
                                 f"has {value!r} ({key} is cluster-wide)", line=origin.line,
                                 path=origin.path or self.shown,
                                 fix=f"set {key} once, under all: vars:")

    def _host(self, name: str, raw: _RawHost, merged: MergedVars, groups: list[str]) -> Host:
        conn = {k: merged[k] for k in merged if k.startswith("ansible_")}
        user = conn.get("ansible_user", "root")
        become = conn.get("ansible_become", user != "root")
        password = conn.get("ansible_become_password")
        if password is None and become and self.env.get(BECOME_PASSWORD_ENV):
            if _has_line_break(self.env[BECOME_PASSWORD_ENV]):
                self.problem(f"{BECOME_PASSWORD_ENV} contains a line break (value not shown): "
                             "sudo reads a password only up to the first one", line=None,
                             path="environment",
                             fix=f'export {BECOME_PASSWORD_ENV}="..." with the password on one '
                             "line")
            else:
                password = Secret(self.env[BECOME_PASSWORD_ENV])
        ssh = _Ssh()
        for key in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
            if conn.get(key):
                with contextlib.suppress(_SshArgError):  # reported where it was written
                    _parse_ssh_args(conn[key], self.base, ssh)
        if ssh.proxy_jump and ssh.proxy_command:
            ssh.warnings.append("both ProxyJump and ProxyCommand are set; ProxyJump is used")
        key_file = conn.get("ansible_ssh_private_key_file")
        key_file = _resolve_path(key_file, self.base) if key_file else None
        identities = list(dict.fromkeys([*([key_file] if key_file else []),
                                         *ssh.identity_files]))
        spec_vars = merged.subset([k for k in merged if not k.startswith("ansible_")])
        return Host(
            name=name, address=conn.get("ansible_host", name), port=conn.get("ansible_port", 22),
            user=user, groups=tuple(groups), vars=spec_vars,
            private_key_file=key_file or (identities[0] if identities else None),
            identity_files=tuple(identities), become=become, become_password=password,
            connection=_CONNECTIONS[conn.get("ansible_connection", "ssh")],
            proxy_jump=ssh.proxy_jump, proxy_command=ssh.proxy_command,
            known_hosts_files=tuple(ssh.known_hosts_files),
            strict_host_key_checking=ssh.strict, ssh_config_file=ssh.config_file,
            warnings=tuple(ssh.warnings),
            source=f"{raw.path}:{raw.line}" if raw.line else raw.path)

    def _groups(self, hosts: Mapping[str, Host], host_groups: Mapping[str, list[str]]
                ) -> dict[str, Group]:
        out: dict[str, Group] = {"all": Group("all", tuple(hosts), (), ("all",), self.shown)}
        for name, raw in self.groups.items():
            if name in IGNORED_GROUPS or name in ("all", "ungrouped"):
                continue
            members = tuple(h for h in hosts if name in host_groups[h])
            children = tuple(c for c, _, _ in raw.children if c not in IGNORED_GROUPS)
            source = f"{raw.path}:{raw.line}" if raw.line else raw.path
            out[name] = Group(name, members, children, tuple(raw.written), source)
        ungrouped = tuple(h for h in hosts if not host_groups[h])
        if ungrouped:
            out["ungrouped"] = Group("ungrouped", ungrouped, (), ("ungrouped",), self.shown)
        return out


def _is_default(origin: Origin) -> bool:
    return origin.text.startswith(("default (", "role default ("))
