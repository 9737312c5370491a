"""The batched probe: one script, delimited sections, robust to hostile output."""

from __future__ import annotations

import subprocess

import pytest

from gpuk8s.errors import FactError
from gpuk8s.facts import Fact
from gpuk8s.facts.probe import build_probe, parse_probe


class Echo(Fact[tuple[str, int]]):
    def command(self) -> str:
        return self.args[0]

    def parse(self, output: str, exit_code: int) -> tuple[str, int]:
        return output, exit_code


def run_local(script: str) -> str:
    return subprocess.run(["sh", "-s"], input=script.encode(), capture_output=True,
                          check=False).stdout.decode()


def test_probe_sections_exit_codes_and_stderr() -> None:
    requests = [Echo("echo one"), Echo("echo two >&2; exit 3"), Echo("printf 'no newline'"),
                Echo("true")]
    script, marker = build_probe(requests)
    facts = parse_probe("h", run_local(script), requests, marker)
    assert facts[requests[0]] == ("one", 0)
    assert facts[requests[1]] == ("two", 3)
    assert facts[requests[2]] == ("no newline", 0)
    assert facts[requests[3]] == ("", 0)


def test_probe_output_that_looks_like_markers() -> None:
    requests = [Echo("echo '@@GPUK8S-fake B 0'; echo '@@ E 0 1'; echo real")]
    script, marker = build_probe(requests)
    facts = parse_probe("h", run_local(script), requests, marker)
    assert facts[requests[0]][0].splitlines()[-1] == "real"


def test_probe_truncated_output_is_a_fact_error() -> None:
    requests = [Echo("echo a"), Echo("echo b")]
    script, marker = build_probe(requests)
    out = run_local(script)
    with pytest.raises(FactError, match="ended before fact"):
        parse_probe("h", out[: out.index(f"{marker} B 1")], requests, marker)


def test_unprobed_fact_is_a_planning_bug() -> None:
    requests = [Echo("true")]
    script, marker = build_probe(requests)
    facts = parse_probe("h", run_local(script), requests, marker)
    with pytest.raises(FactError, match="not probed"):
        facts[Echo("false")]
    assert facts.get(Echo("false")) is None


def test_probe_stdin_is_closed() -> None:
    requests = [Echo("cat; echo done")]
    script, marker = build_probe(requests)
    facts = parse_probe("h", run_local(script + "this must not be read\n"), requests, marker)
    assert facts[requests[0]] == ("done", 0)
