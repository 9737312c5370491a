"""Reading an inventory in Ansible's INI format."""

from __future__ import annotations

import re
import shlex
from dataclasses import replace

from gpuk8s.inventory.reader import _Entry, _RawGroup, _Reader


class _IniReader(_Reader):
    """Ansible's INI inventory: [group], [group:vars], [group:children], host lines."""

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
        pattern, entries = self._split_port(tokens[0], path, lineno)
        names = self._host_names(pattern, path, lineno)
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
