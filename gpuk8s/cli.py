"""Command-line front end shared by tasks.py and the ``gpuk8s`` console script."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gpuk8s import api
from gpuk8s.errors import Gpuk8sError, PhaseFailed, PreflightError


def run(fn_name: str, **kwargs: object) -> int:
    """Call one api function; print a Gpuk8sError as one clear message; return an exit code."""
    try:
        getattr(api, fn_name)(**kwargs)
    except PreflightError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except PhaseFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Gpuk8sError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: the hosts keep what was applied; run again to converge",
              file=sys.stderr)
        return 130
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuk8s", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("bootstrap", "plan", "facts"):
        p = sub.add_parser(name)
        p.add_argument("--inventory", "-i", required=True)
        p.add_argument("--limit", "-l")
        p.add_argument("--set", "-e", action="append", default=[], dest="sets")
        p.add_argument("--ask-become-pass", "-K", action="store_true")
        if name != "facts":
            p.add_argument("--diff", action="store_true")
        if name == "bootstrap":
            p.add_argument("--yes", "-y", action="store_true")
            p.add_argument("--check", action="store_true")
    args = vars(parser.parse_args(argv))
    command = args.pop("command")
    return run(command, **args)


if __name__ == "__main__":
    sys.exit(main())
