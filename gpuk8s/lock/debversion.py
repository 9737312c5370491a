"""Debian version ordering and dependency relations, as dpkg decides them.

The algorithm is Debian Policy 5.6.12 (epoch, then upstream version, then revision; each
compared as alternating non-digit and digit runs, where ``~`` sorts before everything, even
the end of the string, and letters before other characters). tests/unit/test_lock_apt.py
checks it against ``dpkg --compare-versions`` itself.
"""

from __future__ import annotations

import functools
import re


def _order(ch: str) -> int:
    if ch == "~":
        return -1
    if ch.isalpha():
        return ord(ch)
    return ord(ch) + 256


def _compare_part(a: str, b: str) -> int:
    i = j = 0
    while i < len(a) or j < len(b):
        # the non-digit run, character by character (the end of a string sorts as 0)
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ca = _order(a[i]) if i < len(a) and not a[i].isdigit() else 0
            cb = _order(b[j]) if j < len(b) and not b[j].isdigit() else 0
            if ca != cb:
                return -1 if ca < cb else 1
            i += 1
            j += 1
        # the digit run, as a number (an empty run is 0)
        si = i
        while i < len(a) and a[i].isdigit():
            i += 1
        sj = j
        while j < len(b) and b[j].isdigit():
            j += 1
        na, nb = int(a[si:i] or 0), int(b[sj:j] or 0)
        if na != nb:
            return -1 if na < nb else 1
    return 0


def _split(version: str) -> tuple[int, str, str]:
    epoch, colon, rest = version.partition(":")
    if not colon:
        epoch, rest = "0", version
    upstream, dash, revision = rest.rpartition("-")
    if not dash:
        upstream, revision = rest, ""
    return int(epoch or 0), upstream, revision


def compare(a: str, b: str) -> int:
    """-1, 0 or 1 as Debian version ``a`` sorts before, equal to or after ``b``."""
    ea, ua, ra = _split(a)
    eb, ub, rb = _split(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _compare_part(ua, ub) or _compare_part(ra, rb)


#: sort key for versions (oldest first)
version_key = functools.cmp_to_key(compare)


def satisfies(version: str, op: str, wanted: str) -> bool:
    """Whether ``version`` meets the relation ``op wanted`` of a Depends field (op "" always)."""
    if not op:
        return True
    c = compare(version, wanted)
    return {"<<": c < 0, "<=": c <= 0, "=": c == 0, ">=": c >= 0, ">>": c > 0,
            "<": c <= 0, ">": c >= 0}[op]  # "<" and ">" are the obsolete forms of <= and >=


_RELATION = re.compile(r"^\s*([a-z0-9][a-z0-9+.-]*)(?::[a-z0-9-]+)?\s*"
                       r"(?:\(\s*(<<|<=|=|>=|>>|<|>)\s*([0-9A-Za-z][^)\s]*)\s*\))?\s*(?:\[[^]]*\])?\s*$")


def parse_relations(field: str) -> list[list[tuple[str, str, str]]]:
    """A Depends/Pre-Depends field as AND groups of OR alternatives (name, op, version);
    an architecture qualifier (``:any``) is dropped. A malformed entry raises ValueError."""
    groups = []
    for group in field.split(","):
        if not group.strip():
            continue
        alts = []
        for alt in group.split("|"):
            m = _RELATION.match(alt)
            if not m:
                raise ValueError(f"cannot read the dependency {alt.strip()!r}")
            alts.append((m.group(1), m.group(2) or "", m.group(3) or ""))
        groups.append(alts)
    return groups
