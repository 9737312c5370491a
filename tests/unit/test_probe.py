"""The batched probe: one script, delimited sections, robust to hostile output."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpuk8s.errors import FactError
from gpuk8s.facts import Fact, Source
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


# ---------------------------------------------------------------- the node's time per section
def test_each_section_carries_the_nodes_time() -> None:
    """Both clocks, run by the real sh: every fact's time is there, the sleeps show, and the
    values are what parse_probe gave before the times were added."""
    from gpuk8s.facts.probe import DATE, UPTIME, probe_times

    requests = [Echo("sleep 0.3; echo a"), Echo("echo b; exit 2"), Echo("sleep 0.1")]
    for clock, step in ((DATE, 0.0), (UPTIME, 0.01)):
        script, marker = build_probe(requests, clock=clock)
        out = run_local(script)
        facts = parse_probe("h", out, requests, marker)
        assert [facts[r] for r in requests] == [("a", 0), ("b", 2), ("", 0)]
        times = probe_times(out, marker, requests)
        assert list(times) == [r.key for r in requests]
        assert 0.3 - step <= times["Echo(sleep 0.3; echo a)"] < 1.5
        assert 0.1 - step <= times["Echo(sleep 0.1)"] < 1.3
        assert times["Echo(echo b; exit 2)"] < 0.2


def test_probe_output_without_times_still_parses() -> None:
    """Output in the marker format before the times (``B i``, ``E i rc``): the same values,
    no times; junk where a time goes leaves that section's time out, never an error."""
    from gpuk8s.facts.probe import probe_times

    requests = [Echo("a"), Echo("b"), Echo("c")]
    old = "@@M B 0\none\n@@M E 0 0\n@@M B 1\ntwo\n@@M E 1 3\n@@M B 2\n\n@@M E 2 0\n"
    facts = parse_probe("h", old, requests, "@@M")
    assert [facts[r] for r in requests] == [("one", 0), ("two", 3), ("", 0)]
    assert probe_times(old, "@@M", requests) == {}
    junk = ("@@M B 0 12.5\n@@M E 0 0 12.75\n@@M B 1 nan\n@@M E 1 0 13\n@@M B 2 13.0\n"
            "@@M E 2 0 x\n@@M B 7 1\n@@M E 7 0 2\n")
    assert probe_times(junk, "@@M", requests) == {"Echo(a)": 0.25}
    assert [parse_probe("h", junk, requests, "@@M")[r] for r in requests] == \
        [("", 0), ("", 0), ("", 0)]


class Counter(Source):
    """A shared read for the tests: appends one line per run to the file named by $COUNT
    and leaves its sorted args in $_gk_count."""

    def command(self) -> str:
        return (f"echo run >>\"$COUNT\"; _gk_count='{' '.join(sorted(self.args))}'; "
                "echo 'not a fact section'")

    def ready(self) -> str:
        return '[ -n "${_gk_count+x}" ]'


class Counted(Fact[str]):
    def sources(self) -> tuple[Source, ...]:
        return (Counter(*self.args),)

    def command(self) -> str:
        return f"{self.sources()[0].ensure()}\necho \"$_gk_count\""

    def parse(self, output: str, exit_code: int) -> str:
        return output


def test_a_shared_source_runs_once_for_every_fact_that_names_it(tmp_path: Path) -> None:
    """Two facts name the source with different args: the probe runs one source with both
    args, once, before them; each fact alone runs its own."""
    from gpuk8s.facts.probe import probe_sources, probe_times

    requests = [Counted("b"), Echo("echo x"), Counted("a", "b")]
    assert probe_sources(requests) == [Counter("b", "a")]
    script, marker = build_probe(requests)
    count = tmp_path / "count"
    out = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True,
                         env={**os.environ, "COUNT": str(count)}, check=True).stdout
    facts = parse_probe("h", out, requests, marker)
    assert (facts[requests[0]], facts[requests[2]]) == ("a b", "a b")
    assert count.read_text() == "run\n"
    assert out.index(f"{marker} B -1 ") < out.index(f"{marker} B 0 ")
    assert "source Counter(b,a)" in probe_times(out, marker, requests)
    alone = subprocess.run(["sh", "-c", Counted("c").command()], capture_output=True,
                           text=True, env={**os.environ, "COUNT": str(count)}, check=True)
    assert alone.stdout.splitlines()[-1] == "c" and count.read_text() == "run\nrun\n"


def test_a_probe_cut_short_counts_only_fact_sections() -> None:
    """The message's count of sections read is of facts, not of the shared sources."""
    requests = [Counted("a"), Echo("echo b")]
    script, marker = build_probe(requests)
    out = run_local(script.replace("$COUNT", "/dev/null"))
    with pytest.raises(FactError, match=r"ended before fact Echo\(echo b\) \(got 1 of 2 "):
        parse_probe("h", out[: out.index(f"{marker} B 1")], requests, marker)
