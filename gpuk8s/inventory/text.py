"""Host and group names, host ranges (gpu-[01:04]), and INI values as Ansible reads them."""

from __future__ import annotations

import ast
import re
import string
from pathlib import Path
from typing import Any

import yaml

from gpuk8s.variables import (
    VarSpec,
)

_GROUP_KEYS = ("hosts", "vars", "children")


_MAX_RANGE_HOSTS = 10000


_MAX_DEPTH = 50


_HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*")


_GROUP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def _display(path: Path | str) -> str:
    p = Path(path)
    try:
        return p.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except (ValueError, OSError):
        return str(p)


def _expand_hosts(pattern: str) -> list[str]:
    """Expand Ansible host ranges: gpu-[01:04], node[a:c], x-[0:10:2]. ValueError if bad."""
    m = re.search(r"\[([^\[\]]*)\]", pattern)
    if not m:
        if "[" in pattern or "]" in pattern:
            raise ValueError("unbalanced [ ] in a host range")
        return [pattern]
    parts = m[1].split(":")
    if len(parts) not in (2, 3):
        raise ValueError("a host range is [start:end] or [start:end:step]")
    beg, end = parts[0] or "0", parts[1]
    step_text = parts[2] if len(parts) == 3 else "1"
    if not end or not step_text.isdigit() or int(step_text) < 1:
        raise ValueError("a host range needs an end and a positive step")
    step = int(step_text)
    seq: list[str]
    if beg.isdigit() and end.isdigit():
        if len(beg) > 1 and beg.startswith("0") and len(beg) != len(end):
            raise ValueError("a zero-padded range needs start and end of the same width, "
                             "e.g. [01:12]")
        width = len(beg) if beg.startswith("0") and len(beg) > 1 else 0
        if int(beg) > int(end):
            raise ValueError("a host range must go up, e.g. [01:04]")
        if (int(end) - int(beg)) // step + 1 > _MAX_RANGE_HOSTS:
            raise ValueError("a host range with that many hosts is surely a typo")
        seq = [str(i).zfill(width) for i in range(int(beg), int(end) + 1, step)]
    elif len(beg) == 1 and len(end) == 1 and beg in string.ascii_letters \
            and end in string.ascii_letters:
        i, j = string.ascii_letters.index(beg), string.ascii_letters.index(end)
        if i > j:
            raise ValueError("a host range must go up, e.g. [a:d]")
        seq = list(string.ascii_letters[i:j + 1:step])
    else:
        raise ValueError("a host range is numbers [01:04] or single letters [a:d]")
    out: list[str] = []
    for item in seq:
        out.extend(_expand_hosts(pattern[:m.start()] + item + pattern[m.end():]))
        if len(out) > _MAX_RANGE_HOSTS:
            raise ValueError("a host range with that many hosts is surely a typo")
    return out


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
        return text


def _text_value(text: str, spec: VarSpec | None) -> Any:
    """Convert INI text by the variable's type (an Ansible INI inventory holds only text)."""
    text = text.strip()
    quoted = len(text) >= 2 and text[0] == text[-1] and text[0] in "'\""
    if quoted:
        value = _literal(text)
        return value if isinstance(value, str) else text[1:-1]
    kind = spec.type if spec else None
    if kind is str:
        return text
    if kind is bool:
        if text.lower() in ("true", "yes", "on"):
            return True
        if text.lower() in ("false", "no", "off"):
            return False
    value = _literal(text)
    if isinstance(value, str) and kind in (list, dict) and text[:1] in "[{":
        try:
            value = yaml.safe_load(text)
        except (yaml.YAMLError, ValueError, TypeError, RecursionError):
            return text
    return value
