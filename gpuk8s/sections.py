"""Marker-delimited sections of one remote script's output (the fact probe and the op scripts
both send many steps in one exec and split the output here)."""

from __future__ import annotations


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
