"""One remote script per host gathers every requested fact, sections delimited by markers."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from gpuk8s.errors import FactError
from gpuk8s.facts import Fact, HostFacts
from gpuk8s.sections import split_sections


def build_probe(requests: Sequence[Fact[Any]], marker: str | None = None) -> tuple[str, str]:
    """Return (script, marker). Each fact's output sits between ``<marker> B n`` and
    ``<marker> E n <exit code>`` lines; the random marker cannot collide with fact output."""
    marker = marker or "@@GPUK8S-" + secrets.token_hex(6)
    parts = ["exec 2>&1", "export LC_ALL=C PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:"
             "/usr/bin:/sbin:/bin"]
    for i, fact in enumerate(requests):
        parts.append(f"echo '{marker} B {i}'")
        parts.append(f"( {fact.command()}\n) </dev/null")
        parts.append(f"echo \"\n{marker} E {i} $?\"")
    return "\n".join(parts) + "\n", marker


def parse_probe(host: str, output: str, requests: Sequence[Fact[Any]], marker: str) -> HostFacts:
    """Split the probe output into sections and parse each with its fact."""
    sections = split_sections(output, marker)
    values: dict[Fact[Any], Any] = {}
    for i, fact in enumerate(requests):
        text, code = sections.get(i, ("", None))
        if code is None:
            done = sum(c is not None for _, c in sections.values())
            raise FactError(f"{host}: probe output ended before fact {fact.key} "
                            f"(got {done} of {len(requests)} sections)")
        try:
            values[fact] = fact.parse(text, code)
        except FactError:
            raise
        except (ValueError, KeyError, IndexError) as exc:
            raise FactError(f"{host}: cannot parse fact {fact.key}: {exc}") from exc
    return HostFacts(host, values)
