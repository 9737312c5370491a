"""Reading the variables around an inventory: group_vars/ and host_vars/ folders beside it, and
--set overrides (the highest precedence)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuk8s.errors import InventoryError
from gpuk8s.inventory.ansible import (
    _PASSWORD_KEYS,
)
from gpuk8s.inventory.model import (
    BECOME_PASSWORD_ENV,
    IGNORED_GROUPS,
)
from gpuk8s.inventory.reader import _Entry, _Reader
from gpuk8s.inventory.text import (
    _display,
)
from gpuk8s.inventory.yamlio import _Fatal, _LineDict, _load_yaml
from gpuk8s.variables import (
    parse_override_value,
)


class _VarsReader(_Reader):
    """group_vars/<group>(.yml|/), host_vars/<host>(.yml|/), and --set."""

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

    def _kubespray_cluster_group(self) -> None:
        """kubespray's playbooks define k8s_cluster (k8s-cluster before 2.16) as its control
        planes and nodes; an inventory often leaves it out while its group_vars/ has it."""
        folder = self.base / "group_vars"
        for name in ("k8s_cluster", "k8s-cluster"):
            if name in self.groups or not self._vars_files(folder, name):
                continue
            group = self._group(name, str(folder / name), None)
            group.children += [(c, str(folder / name), None) for c in ("control_plane", "workers")
                               if c in self.groups]
            self.notes.append(f"group_vars/{name} applies to control_plane and workers "
                              f"(kubespray's {name} group, which this inventory does not list)")

    def _read_vars_dirs(self) -> None:
        if (self.base / "group_vars").is_dir():
            self._kubespray_cluster_group()
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
