"""``invoke bench``: the lab benchmark (bench/run.py)."""

from __future__ import annotations

from invoke import Exit, task


@task(help={"sizes": "lab sizes for the no-op runs, e.g. 4,16 (default 4,16,64; 4 with --facts)",
            "repeat": "timed runs of each measurement per size (median reported)",
            "no_cache_bytes": "skip the package cache bytes (1- and 4-node bootstraps)",
            "keep": "leave the last lab up",
            "facts": "only this: each fact's node-side time (ms) per host in one no-op probe, "
                     "slowest first"})
def bench(c, sizes="", repeat=5, no_cache_bytes=False, keep=False, facts=False):
    """No-op bootstrap/plan vs the SSH floor at several lab sizes; package cache bytes. With
    --facts: each fact's time on the node in one no-op probe, per host."""
    from bench.run import main

    argv = ["--sizes", str(sizes)] * bool(sizes) + ["--repeat", str(repeat)]
    argv += ["--no-cache-bytes"] * bool(no_cache_bytes) + ["--keep"] * bool(keep)
    argv += ["--facts"] * bool(facts)
    code = main(argv)
    if code:
        raise Exit(code=code)
