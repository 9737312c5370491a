"""Marker-delimited sections of one remote script's output (the fact probe and the op scripts
both send many steps in one exec and split the output here)."""

from __future__ import annotations

import math


def split_sections(output: str, marker: str) -> dict[int, tuple[str, int | None]]:
    """``{index: (text, exit code)}`` from lines ``<marker> B <i>`` ... ``<marker> E <i> <rc>``.

    The scripts print a newline before each end marker, so output without a trailing newline
    still ends its own line; that one newline is removed again. A section whose end marker is
    missing (the script died inside it) has exit code None."""
    sections: dict[int, tuple[str, int | None]] = {}
    current: int | None = None
    buf: list[str] = []
    prefix = marker + " "
    for line in output.split("\n"):
        if line.startswith(prefix):
            word = line.split()
            if word[1] == "B":
                current, buf = int(word[2]), []
            elif word[1] == "E" and current is not None:
                text = "\n".join(buf)
                sections[current] = (text[:-1] if text.endswith("\n") else text, int(word[3]))
                current = None
            continue
        if current is not None:
            buf.append(line)
    if current is not None:
        sections[current] = ("\n".join(buf).rstrip("\n"), None)
    return sections


def section_times(output: str, marker: str) -> dict[int, tuple[float, float | None]]:
    """``{index: (start, end)}`` on the node's clock, from marker lines that carry it
    (``<marker> B <i> <seconds>`` ... ``<marker> E <i> <rc> <seconds>``; end None when the
    section never finished). Sections whose marker carries no time, or a time that is not a
    finite number, are left out: output from before the times were added reads as none."""
    times: dict[int, tuple[float, float | None]] = {}
    prefix = marker + " "
    for line in output.split("\n"):
        if not line.startswith(prefix):
            continue
        word = line.split()
        try:
            if len(word) > 3 and word[1] == "B":
                times[int(word[2])] = (_finite(word[3]), None)
            elif len(word) > 4 and word[1] == "E" and int(word[2]) in times:
                times[int(word[2])] = (times[int(word[2])][0], _finite(word[4]))
        except ValueError:  # not a number, or nan/inf: that section's time stays unknown
            continue
    return times


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value
