"""One remote script per host gathers every requested fact, sections delimited by markers.

Reads that several facts share (Source: one ``nvidia-smi --query-gpu``, one ``systemctl
show``, one round of kubectl reads) run once, in sections of their own before the facts', in
the script's own shell; the facts then take their part from the variables those left.

Every marker line ends with the node's clock, so the node's own time for each section is
known (probe_times): ``<marker> B <i> <seconds>`` and ``<marker> E <i> <rc> <seconds>``."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from gpuk8s.errors import FactError
from gpuk8s.facts import Fact, HostFacts, Source
from gpuk8s.sections import section_times, split_sections

#: the node's clock for the marker lines: sh lines that set $_gk_t to seconds. UPTIME reads
#: /proc/uptime with sh's own ``read``, so it starts no process (a probe's forty-odd sections
#: would otherwise start as many ``date`` processes); it counts in 10 ms steps. DATE runs
#: ``date`` at each marker, to the nanosecond, for measurements (``invoke bench --facts``).
UPTIME = "_gk_t=; { read -r _gk_t _ </proc/uptime; } 2>/dev/null"
DATE = "_gk_t=$(date +%s.%N 2>/dev/null)"


def probe_sources(requests: Sequence[Fact[Any]]) -> list[Source]:
    """The sources a probe of ``requests`` runs: those of one class merged into one, in the
    order first named. Source i of this list is the probe's section -(i + 1)."""
    by_class: dict[type[Source], list[Source]] = {}
    for fact in requests:
        for source in fact.sources():
            by_class.setdefault(type(source), []).append(source)
    return [cls.merge(found) for cls, found in by_class.items()]


def build_probe(requests: Sequence[Fact[Any]], marker: str | None = None, *,
                clock: str = UPTIME) -> tuple[str, str]:
    """Return (script, marker). Each fact's output sits between ``<marker> B n <t>`` and
    ``<marker> E n <exit code> <t>`` lines (n from 0, in the order of ``requests``; the
    shared sources' sections, which come first, count down from -1); the random marker
    cannot collide with fact output. ``clock``: UPTIME or DATE, what ``<t>`` is read with."""
    marker = marker or "@@GPUK8S-" + secrets.token_hex(6)
    parts = ["exec 2>&1", "export LC_ALL=C PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:"
             "/usr/bin:/sbin:/bin"]

    def section(i: int, body: str) -> None:
        parts.append(f"{clock}; echo \"{marker} B {i} $_gk_t\"")
        parts.append(body)
        parts.append(f"_gk_rc=$?; {clock}; echo \"\n{marker} E {i} $_gk_rc $_gk_t\"")

    sources = probe_sources(requests)
    # a source with a background part starts it first; its collecting section and the facts
    # that read it come after every other fact, so that the background read overlaps them
    # (sections are found by number, not by place)
    late = [s for s in sources if s.start()]
    for source in late:
        parts.append(f"{{ {source.start()}\n}} </dev/null")
    waiting = {i for i, fact in enumerate(requests)
               if any(type(s) is type(x) for s in fact.sources() for x in late)}
    for i, source in enumerate(sources):
        if source not in late:
            # in the script's own shell (a group, not a subshell), so that its variables stay
            section(-(i + 1), f"{{ {source.command()}\n}} </dev/null")
    for i, fact in enumerate(requests):
        if i not in waiting:
            section(i, f"( {fact.command()}\n) </dev/null")
    for i, source in enumerate(sources):
        if source in late:
            section(-(i + 1), f"{{ {source.command()}\n}} </dev/null")
    for i in sorted(waiting):
        section(i, f"( {requests[i].command()}\n) </dev/null")
    return "\n".join(parts) + "\n", marker


def parse_probe(host: str, output: str, requests: Sequence[Fact[Any]], marker: str) -> HostFacts:
    """Split the probe output into sections and parse each with its fact."""
    sections = split_sections(output, marker)
    values: dict[Fact[Any], Any] = {}
    for i, fact in enumerate(requests):
        text, code = sections.get(i, ("", None))
        if code is None:
            done = sum(c is not None for n, (_, c) in sections.items() if 0 <= n < len(requests))
            raise FactError(f"{host}: probe output ended before fact {fact.key} "
                            f"(got {done} of {len(requests)} sections)")
        try:
            values[fact] = fact.parse(text, code)
        except FactError:
            raise
        except (ValueError, KeyError, IndexError) as exc:
            raise FactError(f"{host}: cannot parse fact {fact.key}: {exc}") from exc
    return HostFacts(host, values)


def probe_times(output: str, marker: str, requests: Sequence[Fact[Any]]) -> dict[str, float]:
    """Seconds each section took on the node, by fact key; a shared source's section is
    named ``source <key>``. Sections without both times (output of a probe without them, a
    section the script died in, an unreadable clock) are left out."""
    names = {i: fact.key for i, fact in enumerate(requests)}
    names.update({-(i + 1): f"source {s.key}" for i, s in enumerate(probe_sources(requests))})
    return {names[i]: max(0.0, end - start) for i, (start, end) in
            section_times(output, marker).items() if end is not None and i in names}
