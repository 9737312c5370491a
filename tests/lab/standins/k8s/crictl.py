# LAB STAND-IN: not the real crictl (cri-tools). Test infrastructure for gpuk8s; never shipped.
"""crictl stand-in: info, version, ps, pods, images; answers from the real containerd via ctr."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys

from . import nodeinfo
from .common import git_version, package_version, read, run, yaml_load_all

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
    p.add_argument("-o", "--output")
    p.add_argument("-a", "--all", action="store_true")
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("-t", "--timeout")
    p.add_argument("--version", action="store_true")
    args, _ = p.parse_known_args(argv)
    version = git_version(package_version(version_raw, "GPUK8S_LAB_CRI_TOOLS_VERSION"))
    if args.version:
        print(f"crictl version {version}")
        return 0
    ep = endpoint(args)
    err = nodeinfo.cri_error(ep)
    if err:
        return fatal(err)
    if args.cmd == "version":
        print(f"Version:  0.1.0\nRuntimeName:  containerd\nRuntimeVersion:  "
              f"v{nodeinfo.containerd_version()}\nRuntimeApiVersion:  v1")
    elif args.cmd == "info":
        cfg = nodeinfo.containerd_config()
        cni = any(True for _ in _cni_files())
        conds = [{"type": "RuntimeReady", "status": True, "reason": "", "message": ""},
                 {"type": "NetworkReady", "status": cni,
                  "reason": "" if cni else "NetworkPluginNotReady",
                  "message": "" if cni else "Network plugin returns error: cni plugin not "
                  "initialized"}]
        cri = (cfg.get("plugins") or {})
        print(json.dumps({"status": {"conditions": conds},
                          "config": {"containerd": {
                              "defaultRuntimeName": nodeinfo.default_runtime(cfg),
                              "runtimes": {h: {} for h in nodeinfo.runtime_handlers(cfg)}},
                              "enableCDI": True, "plugins": sorted(cri)},
                          "lastCNILoadStatus": "OK" if cni else
                          "cni config load failed: no network config found in /etc/cni/net.d: "
                          "cni plugin not initialized: failed to load cni config"}, indent=2))
    elif args.cmd == "ps":
        rows = [["CONTAINER", "IMAGE", "CREATED", "STATE", "NAME", "ATTEMPT", "POD ID", "POD"]]
        for ln in ctr_lines("containers", "ls")[1:]:
            cols = ln.split()
            rows.append([cols[0][:13], cols[1] if len(cols) > 1 else "", "", "Running", "",
                         "0", "", ""])
        sys.stdout.write(table(rows))
    elif args.cmd == "pods":
        sys.stdout.write(table([["POD ID", "CREATED", "STATE", "NAME", "NAMESPACE", "ATTEMPT",
                                 "RUNTIME"]]))
    elif args.cmd == "images":
        rows = [["IMAGE", "TAG", "IMAGE ID", "SIZE"]]
        for ln in ctr_lines("images", "ls", "-q"):
            name, _, tag = ln.rpartition(":")
            rows.append([name, tag, "", ""])
        sys.stdout.write(table(rows))
    else:
        sys.stderr.write(f"No help topic for '{args.cmd}'\n")
        return 1
    return 0


def _cni_files() -> list[str]:
    import os

    from .common import P

    try:
        return [f for f in os.listdir(P("/etc/cni/net.d")) if f.endswith((".conf", ".conflist"))]
    except OSError:
        return []
