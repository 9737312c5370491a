"""Reading an inventory (YAML or INI, group_vars/host_vars, --set) into an Inventory, with
every problem named by file, line and fix.

Everything here runs before any host is contacted. load_inventory() raises the first problem
as an InventoryError naming the file, the line and the fix; validate_all() returns them all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuk8s.errors import InventoryError, InventoryProblems
from gpuk8s.inventory.ansible import (
    _ANSIBLE_REFUSED,
    _CONNECTIONS,
    _FALSE,
    _TRUE,
    ANSIBLE_ALIASES,
    ANSIBLE_FIXED,
    ANSIBLE_KEYS,
    _has_line_break,
    _parse_ssh_args,
    _SshArgError,
    ansible_ignored,
    connection_host,
)
from gpuk8s.inventory.bastion import through_bastion
from gpuk8s.inventory.ini_reader import _IniReader
from gpuk8s.inventory.model import (
    BASTION,
    IGNORED_GROUPS,
    Group,
    Host,
    Inventory,
    Secret,
)
from gpuk8s.inventory.names import _OtherTools, near_miss, unknown_variable
from gpuk8s.inventory.reader import _Entry, _RawHost, commented_hosts, inventory_file
from gpuk8s.inventory.text import (
    _text_value,
)
from gpuk8s.inventory.vars_reader import _VarsReader
from gpuk8s.inventory.yaml_reader import _YamlReader
from gpuk8s.inventory.yamlio import _Fatal, _LineDict, _nested_duplicates, _plain
from gpuk8s.variables import (
    MergedVars,
    Origin,
    VarLayer,
    VarProblem,
    check_combination,
    check_value,
    cluster_wide,
    defaults_layer,
    load_variable_specs,
    merge_vars,
)


def load_inventory(path: str | Path, *, overrides: Mapping[str, Any] | Sequence[str] = (),
                   env: Mapping[str, str] | None = None,
                   project_root: Path | None = None) -> Inventory:
    """Read, validate and merge an inventory; raise its problem as InventoryError (several:
    InventoryProblems, which lists them all and carries the first one's file, line and fix).

    ``overrides``: ``--set`` values, as ``["k=v", ...]`` or ``{"k": "v"}`` (text values are
    parsed as YAML). ``env``: where GPUK8S_BECOME_PASSWORD is read (default os.environ).
    """
    builder = _Builder(inventory_file(path), overrides, env, project_root)
    inventory = builder.build()
    problems = builder.sorted_problems()
    if len(problems) > 1:
        raise InventoryProblems(problems)
    if problems:
        raise problems[0]
    assert inventory is not None
    return inventory


def validate_all(path: str | Path, *, overrides: Mapping[str, Any] | Sequence[str] = (),
                 env: Mapping[str, str] | None = None,
                 project_root: Path | None = None) -> list[InventoryError]:
    """Every problem of the inventory (empty list: valid), in file order."""
    builder = _Builder(inventory_file(path), overrides, env, project_root)
    builder.build()
    return builder.sorted_problems()


def inspect_inventory(path: str | Path, *, overrides: Mapping[str, Any] | Sequence[str] = (),
                      env: Mapping[str, str] | None = None, project_root: Path | None = None
                      ) -> tuple[Inventory | None, list[InventoryError], tuple[str, ...]]:
    """What `gpuk8s check` shows: the inventory as read (None when it cannot be read at
    all), every problem in file order, and the loader's notes."""
    builder = _Builder(inventory_file(path), overrides, env, project_root)
    inventory = builder.build()
    return inventory, builder.sorted_problems(), tuple(dict.fromkeys(builder.notes))


class _Builder(_YamlReader, _IniReader, _VarsReader, _OtherTools):
    """Reads the inventory, records problems, builds the Inventory."""

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
            self.problem("the inventory defines no hosts" + commented_hosts(text), line=None,
                         fix="add hosts, e.g. all: children: control_plane: hosts: cp-01: "
                         "{ansible_host: 10.0.0.10}")
            return None
        self._check_graph()
        self._read_vars_dirs()
        return self._assemble()

    def _check_graph(self) -> None:
        for name, host in self.hosts.items():
            clash = next((g for g in self.groups.values() if name in (g.name, *g.written)),
                         None)
            if clash is not None and not (clash.name == BASTION and name in clash.hosts):
                # kubespray's documented bastion is a host and a group, both named bastion
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
        if not self._other_tools(e):
            return False
        key = e.key
        spec = self.specs.get(key)
        if spec is None:
            p = unknown_variable(key, self.specs)
            if p is not None:
                self.problem(p.message, line=e.line, path=e.path, fix=p.fix)
            else:  # another playbook's variable: ignored, reported once per file
                self.foreign.setdefault(e.path or self.shown, {}).setdefault(key, e.line)
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
        if e.key in ANSIBLE_ALIASES:  # Ansible's other name: read as the key it aliases
            self.notes.append(f"{e.key} is read as {ANSIBLE_ALIASES[e.key]}")
            e.key = ANSIBLE_ALIASES[e.key]
        key, value = e.key, e.value
        if key in ANSIBLE_FIXED:
            text = str(value).strip().strip("'\"")
            if text != ANSIBLE_FIXED[key]:
                self.problem(f"{key}: {text!r} is not supported: gpuk8s becomes "
                             f"{ANSIBLE_FIXED['ansible_become_user']} with "
                             f"{ANSIBLE_FIXED['ansible_become_method']}", line=e.line,
                             path=e.path, fix=f"remove {key}, or set it to "
                             f"{ANSIBLE_FIXED[key]}")
            return False  # nothing to keep: it says what gpuk8s does anyway
        if key in _ANSIBLE_REFUSED:
            self.problem(f"{key}: gpuk8s does not log in with passwords, only with SSH keys",
                         line=e.line, path=e.path, fix="run `ssh-copy-id USER@HOST` once per "
                         f"host (it asks for the password this one time), then remove {key}")
            return False
        if key not in ANSIBLE_KEYS and ansible_ignored(key):
            self.foreign.setdefault(e.path or self.shown, {}).setdefault(key, e.line)
            return False
        if key not in ANSIBLE_KEYS:
            best = near_miss(key, ANSIBLE_KEYS)
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
            if host.connection == "ssh" and BASTION not in host.groups:  # a bastion may be a
                addr = (host.address.lower(), host.port)                # node's own address
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
        through_bastion(hosts, self.groups.get(BASTION), self.problem, self.notes)
        self._check_cluster(hosts)
        groups = self._groups(hosts, host_groups)
        if not any(h.is_control_plane for h in hosts.values()) and hosts \
                and not self.structural:
            seen = sorted(w for g in self.groups.values() if g.name not in ("all", "ungrouped")
                          for w in g.written)
            self.problem("no control plane: no host is in the control_plane group (or "
                         "kube_control_plane, master, server...); groups here: "
                         f"{', '.join(seen) or 'none'}", line=None,
                         fix="add a host under children: control_plane: hosts: (INI: "
                         "[control_plane] then the host name)")
        for name, host in hosts.items():
            if not host.is_control_plane and not host.is_worker and BASTION not in host.groups:
                self.notes.append(f"host {name!r} is in neither control_plane nor workers")
            for w in host.warnings:
                self.notes.append(f"host {name!r}: {w}")
        warnings = self._foreign_variables(
            any(h.vars.get("strict_variables") is True for h in hosts.values()))
        etcd = tuple(h for h, raw in self.hosts.items() if "etcd" in raw.groups and h in hosts)
        return Inventory(self.path, hosts, groups, tuple(dict.fromkeys(self.notes)),
                         warnings=tuple(warnings), etcd_group=etcd)

    def _foreign_variables(self, strict: bool) -> list[str]:
        """Variables gpuk8s does not use: one warning per file (ignored), or with
        strict_variables: true one problem per variable."""
        out = []
        for path, names in self.foreign.items():
            if strict:
                for name, line in names.items():
                    self.problem(f"unknown variable {name!r} (strict_variables is on)", line=line,
                                 path=path, fix="remove it, or set strict_variables: false to "
                                 "let the inventory carry other playbooks' variables")
                continue
            listed = ", ".join(sorted(names))
            out.append(f"{path}: {len(names)} variable{'s' if len(names) > 1 else ''} gpuk8s "
                       f"does not use (ignored): {listed}")
        return out

    def _report_merged(self, p: VarProblem, merged: MergedVars) -> None:
        origins = [merged.origin_of(k) for k in (p.key, *p.others) if k in merged]
        user_set = [o for o in origins if not _is_default(o)]
        origin = (user_set or origins or [Origin("")])[0]
        self.problem(p.message, line=origin.line, path=origin.path or self.shown, fix=p.fix)

    def _check_cluster(self, hosts: Mapping[str, Host]) -> None:
        first: dict[str, tuple[str, Any]] = {}
        for name, host in hosts.items():
            if not host.is_control_plane and not host.is_worker:
                continue  # a login node or the bastion: kubespray's k8s_cluster vars skip it
            for key in cluster_wide():
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
        host, problem = connection_host(name, merged, groups, self.env, self.base,
                                        f"{raw.path}:{raw.line}" if raw.line else raw.path)
        if problem is not None:
            self.problem(problem[0], line=None, path="environment", fix=problem[1])
        return host

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
