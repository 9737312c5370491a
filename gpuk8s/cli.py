"""Command-line front end shared by tasks.py and the ``gpuk8s`` console script."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from gpuk8s import api, bundle, day2, gpucheck, images
from gpuk8s import workloads as _workloads
from gpuk8s.errors import Gpuk8sError, PhaseFailed, PreflightError
from gpuk8s.inventory.check import check
from gpuk8s.report import untrusted

#: command name -> the one function it calls
COMMANDS: dict[str, Callable[..., object]] = {
    "bootstrap": api.bootstrap, "plan": api.plan, "facts": api.facts,
    "reprovision": day2.reprovision, "add_node": day2.add_node,
    "remove_node": day2.remove_node, "reset": day2.reset, "status": day2.status,
    "gpu_usage": day2.gpu_usage,
    "upgrade": day2.upgrade, "kubeconfig": day2.kubeconfig,
    "verify_local": gpucheck.verify_local, "images": images.print_images, "check": check,
    "report": api.report,
    "bundle": bundle.bundle,
}
# workloads on the cluster (gpuk8s/workloads/)
COMMANDS.update({"deploy": _workloads.deploy, "undeploy": _workloads.undeploy,
                 "verify": _workloads.verify})


#: -o/--output of the commands that print a table of the cluster (kubectl's): the default
#: view fits 80 columns; "wide" adds every other column; "json" is the same as --json
TABLE_OUTPUTS = ("wide", "json")


def table_output(output: str | None, as_json: bool = False) -> dict[str, bool]:
    """``as_json`` and ``wide`` for a table command from its --output (and --json)."""
    if output not in (None, "", *TABLE_OUTPUTS):
        raise ValueError(f"--output {output!r}: use wide (every column) or json")
    return {"as_json": as_json or output == "json", "wide": output == "wide"}


def run(command: str, **kwargs: object) -> int:
    """Call one api/day2 function; print a Gpuk8sError as one clear message; return an exit
    code (1 error, 2 a phase failed, 3 preflight problems, 130 interrupted). An error's text
    may quote a node's output, so it is printed through report.untrusted."""
    try:
        COMMANDS[command](**kwargs)
    except PreflightError as exc:
        _error(exc)
        return 3
    except PhaseFailed as exc:
        _error(exc)
        return 2
    except Gpuk8sError as exc:
        _error(exc)
        return 1
    except KeyboardInterrupt:
        print("interrupted: the hosts keep what was applied; run again to converge",
              file=sys.stderr)
        return 130
    return 0


def _error(exc: Gpuk8sError) -> None:
    """One error on stderr: plain text (print, not Rich), control characters escaped."""
    print(f"error: {untrusted(exc)}", file=sys.stderr)


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
        else:
            p.add_argument("--json", action="store_true", dest="as_json")
        if name == "bootstrap":
            p.add_argument("--yes", "-y", action="store_true")
            p.add_argument("--check", action="store_true")
            p.add_argument("--max-fail", default="0", dest="max_fail",
                           help="hosts that may fail (count like 1, or percent like 25%%) "
                           "while the others go on; default 0: any failure stops the run")
            p.add_argument("--quiet", "-q", action="store_true",
                           help="no plan or progress lines; problems, failures and the final "
                           "table only")
    p = sub.add_parser("check", help="every problem, the hosts' roles and the variables an "
                       "inventory sets, in one run; contacts no host")
    p.add_argument("--inventory", "-i", required=True)
    p.add_argument("--set", "-e", action="append", default=[], dest="sets")
    for name in ("reprovision", "add-node", "remove-node"):
        p = sub.add_parser(name)
        p.add_argument("--inventory", "-i", required=True)
        p.add_argument("--host", required=True)
        p.add_argument("--yes", "-y", action="store_true")
        if name == "reprovision":
            p.add_argument("--reinstall-driver", action="store_true")
            p.add_argument("--full", action="store_true")
        if name != "add-node":
            p.add_argument("--drain-timeout", type=int, default=300)
    p = sub.add_parser("reset")
    p.add_argument("--inventory", "-i", required=True)
    p.add_argument("--yes", "-y", action="store_true")
    for name, text in (("status", "one line per host: state, GPUs, what plan would do"),
                       ("gpu-usage", "GPU utilisation, memory and pods per GPU "
                        "(gpu_monitoring)")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--inventory", "-i", required=True)
        p.add_argument("--json", action="store_true", dest="as_json")
        p.add_argument("--output", "-o", choices=TABLE_OUTPUTS,
                       help="wide: every column (the default view fits 80 columns); json")
    p = sub.add_parser("upgrade")
    p.add_argument("--inventory", "-i", required=True)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--driver", help="NVIDIA driver version, e.g. 580.159.04")
    what.add_argument("--kubernetes", help="Kubernetes patch release, e.g. 1.36.2")
    p.add_argument("--limit", "-l")
    p.add_argument("--serial", type=int, default=1)
    p.add_argument("--drain-timeout", type=int, default=300)
    p.add_argument("--yes", "-y", action="store_true")
    p = sub.add_parser("kubeconfig")
    p.add_argument("--inventory", "-i", required=True)
    p = sub.add_parser("images", help="every image the cluster and the workloads pull")
    p.add_argument("--inventory", "-i", required=True)
    p.add_argument("--set", "-e", action="append", default=[], dest="sets")
    p.add_argument("--values", "-f", action="append", default=[], dest="values_files")
    p.add_argument("--output", "-o", choices=("table", "json", "list"), default="table")
    p = sub.add_parser("verify-local", help="node GPU check: nvidia-smi and CUDA on each GPU")
    p.add_argument("--inventory", "-i", required=True)
    p.add_argument("--limit", "-l")
    for name in ("deploy", "undeploy", "verify"):
        p = sub.add_parser(name)
        if name != "verify":
            p.add_argument("name", help="workload: " + ", ".join(_workloads.WORKLOADS))
        p.add_argument("--inventory", "-i", required=True)
        p.add_argument("--values", "-f", action="append", default=[], dest="values_files")
        p.add_argument("--set", action="append", default=[], dest="sets")
        if name == "deploy":
            p.add_argument("--timeout", type=float, default=600)
            p.add_argument("--render", action="store_true", dest="render_only",
                           help="print the manifests deploy would apply; contact no host")
    p = sub.add_parser("bundle", help="gpuk8s, its checkout and every dependency as wheels, "
                       "for an admin machine without a package index (run where PyPI answers)")
    p.add_argument("--output", "-o", default="dist")
    p.add_argument("--python-version", help="the admin machine's Python, e.g. 3.12")
    p.add_argument("--platform", action="append", default=[], dest="platforms",
                   help="its pip platform tag, e.g. manylinux_2_28_x86_64 (repeatable)")
    p.add_argument("--tarball", action="store_true")
    p.add_argument("--find-links", action="append", default=[])
    p.add_argument("--no-index", action="store_true")
    p = sub.add_parser("report", help="a finished run as one self-contained HTML page "
                       "(RUN_DIR/report.html); needs no inventory")
    p.add_argument("run", nargs="?", metavar="RUN_DIR",
                   help="run folder (default: the latest under runs/)")
    args = vars(parser.parse_args(argv))
    command = args.pop("command").replace("-", "_")
    if command in ("status", "gpu_usage"):
        args.update(table_output(args.pop("output"), bool(args["as_json"])))
    return run(command, **args)


if __name__ == "__main__":
    sys.exit(main())
