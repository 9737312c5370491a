# LAB STAND-IN: not the real crictl (cri-tools). Test infrastructure for gpuk8s; never shipped.
"""crictl stand-in: `crictl ps [-a]`, the one command gpuk8s names (its hint when a control plane
does not come back: roles/control_plane/role.py), answered from the real containerd through ctr.
Nothing in gpuk8s runs crictl; kubeadm's preflight needs it on PATH (FileExisting-crictl)."""

from __future__ import annotations

import argparse
import datetime as dt
import sys

from . import nodeinfo
from .common import read, run, yaml_load_all

DEFAULTS = ["unix:///run/containerd/containerd.sock", "unix:///run/crio/crio.sock",
            "unix:///var/run/cri-dockerd.sock"]


def fatal(msg: str) -> int:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    sys.stderr.write(f'time="{now}" level=fatal msg="{msg.replace(chr(34), chr(92) + chr(34))}"\n')
    return 1


def endpoint(args: argparse.Namespace) -> str:
    if args.runtime_endpoint:
        return str(args.runtime_endpoint)
    for doc in yaml_load_all(read(args.config or "/etc/crictl.yaml") or ""):
        if isinstance(doc, dict) and doc.get("runtime-endpoint"):
            return str(doc["runtime-endpoint"])
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    sys.stderr.write(f'time="{now}" level=warning msg="runtime connect using default endpoints: '
                     f"[{' '.join(DEFAULTS)}]. As the default settings are now deprecated, you "
                     'should set the endpoint instead."\n')
    return DEFAULTS[0]


def table(rows: list[list[str]]) -> str:
    from .tables import tabwriter as t

    return t(rows)


def ctr_lines(*args: str) -> list[str]:
    p = run(["ctr", "-n", "k8s.io", *args])
    return [ln for ln in p.stdout.splitlines() if ln.strip()] if p.returncode == 0 else []


def main(argv: list[str], version_raw: str) -> int:
    p = argparse.ArgumentParser(prog="crictl", add_help=False)
    p.add_argument("cmd", nargs="?")
    p.add_argument("rest", nargs="*")
    p.add_argument("-r", "--runtime-endpoint")
    p.add_argument("-i", "--image-endpoint")
    p.add_argument("-c", "--config")
    p.add_argument("-a", "--all", action="store_true")
    p.add_argument("-t", "--timeout")
    args, _ = p.parse_known_args(argv)
    ep = endpoint(args)
    err = nodeinfo.cri_error(ep)
    if err:
        return fatal(err)
    if args.cmd == "ps":
        rows = [["CONTAINER", "IMAGE", "CREATED", "STATE", "NAME", "ATTEMPT", "POD ID", "POD"]]
        for ln in ctr_lines("containers", "ls")[1:]:
            cols = ln.split()
            rows.append([cols[0][:13], cols[1] if len(cols) > 1 else "", "", "Running", "",
                         "0", "", ""])
        sys.stdout.write(table(rows))
    else:
        sys.stderr.write(f"No help topic for '{args.cmd}'\n")
        return 1
    return 0
