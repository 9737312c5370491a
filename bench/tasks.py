"""``invoke bench``: the lab benchmark (bench/run.py)."""

from __future__ import annotations

from invoke import Exit, task


@task(help={"sizes": "lab sizes for the no-op runs, e.g. 4,16 (default 4,16,64)",
            "repeat": "timed runs of each measurement per size (median reported)",
            "no_cache_bytes": "skip the package cache bytes (1- and 4-node bootstraps)",
            "keep": "leave the last lab up"})
def bench(c, sizes="4,16,64", repeat=5, no_cache_bytes=False, keep=False):
    """No-op bootstrap/plan vs the SSH floor at several lab sizes; package cache bytes."""
    from bench.run import main

    argv = ["--sizes", str(sizes), "--repeat", str(repeat)]
    argv += ["--no-cache-bytes"] * bool(no_cache_bytes) + ["--keep"] * bool(keep)
    code = main(argv)
    if code:
        raise Exit(code=code)
