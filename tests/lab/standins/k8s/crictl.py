# LAB STAND-IN: not the real crictl (cri-tools). Test infrastructure for gpuk8s; never shipped.
"""crictl stand-in, the commands gpuk8s runs or names (kubeadm's preflight also needs crictl on
PATH, FileExisting-crictl):

- `crictl ps [-a] [--state S] [--label K=V]... [--name RE] [-q]`: the real containerd's
  containers through ctr, plus the etcd static pod's container, which the lab runs as the
  transient unit etcd-static-pod (the kubelet stand-in), labelled as the real kubelet labels a
  container (io.kubernetes.container.name=etcd, io.kubernetes.pod.namespace=kube-system);
- `crictl exec [-s] [--timeout N] ID CMD ARG...` in that etcd container (gpuk8s/day2/backup.py
  runs etcdctl there, as an admin would): CMD etcd, etcdctl or etcdutl runs the REAL binary the
  lab's kubelet package carries (/usr/lib/gpuk8s-lab/etcd/), which is what the
  registry.k8s.io/etcd image holds in /usr/local/bin (cluster/images/etcd/Dockerfile of
  Kubernetes: `COPY etcd* etcdctl* /usr/local/bin/`). The container's mounts are kubeadm's
  hostPaths at the same paths (/var/lib/etcd, /etc/kubernetes/pki/etcd), so the process runs
  in the node's own file system. Another CMD fails as runc fails an exec of a missing file;
  another ID as containerd answers one it does not know.

Flags and messages: cmd/crictl/container.go and exec.go of cri-tools v1.36.0 (the lab's cri-tools
package version)."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import subprocess
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


#: the etcd static pod's container (the kubelet stand-in's transient unit and the real binaries)
ETCD_UNIT = "etcd-static-pod"
ETCD_BIN = "/usr/lib/gpuk8s-lab/etcd"
ETCD_LABELS = {"io.kubernetes.container.name": "etcd",
               "io.kubernetes.pod.namespace": "kube-system"}
#: global flags that take a value (they come before the command)
GLOBAL_VALUED = {"-r", "--runtime-endpoint", "-i", "--image-endpoint", "-c", "--config", "-t",
                 "--timeout"}


def etcd_container() -> str | None:
    """The etcd container's ID (64 hex, from the unit's invocation), None when it is not
    running."""
    if run(["systemctl", "is-active", "--quiet", ETCD_UNIT]).returncode != 0:
        return None
    inv = run(["systemctl", "show", "-P", "InvocationID", ETCD_UNIT]).stdout.strip()
    return (inv * 2)[:64] if inv else None


def split_global(argv: list[str]) -> tuple[list[str], list[str]]:
    """(global flags, the command and everything after it)."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 1 if "=" in argv[i] or argv[i] not in GLOBAL_VALUED else 2
    return argv[:i], argv[i:]


def ps(rest: list[str]) -> int:
    p = argparse.ArgumentParser(prog="crictl ps", add_help=False)
    p.add_argument("-a", "--all", action="store_true")
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("-s", "--state")
    p.add_argument("--name")
    p.add_argument("--label", action="append", default=[])
    args = p.parse_args(rest)
    want = dict(lbl.partition("=")[::2] for lbl in args.label)
    found: list[tuple[str, str, str, str, dict[str, str]]] = []  # id, image, state, name, labels
    etcd = etcd_container()
    if etcd:
        found.append((etcd, "registry.k8s.io/etcd", "Running", "etcd", ETCD_LABELS))
    for ln in ctr_lines("containers", "ls")[1:]:
        cols = ln.split()
        found.append((cols[0], cols[1] if len(cols) > 1 else "", "Running", "", {}))
    state = (args.state or ("" if args.all else "running")).lower()
    rows = [c for c in found
            if (not state or c[2].lower() == state)
            and all(c[4].get(k) == v for k, v in want.items())
            and (not args.name or re.search(args.name, c[3]))]
    if args.quiet:
        sys.stdout.write("".join(f"{c[0]}\n" for c in rows))
        return 0
    out = [["CONTAINER", "IMAGE", "CREATED", "STATE", "NAME", "ATTEMPT", "POD ID", "POD",
            "NAMESPACE"]]
    out += [[c[0][:13], c[1], "", c[2], c[3], "0", "", "", c[4].get(
        "io.kubernetes.pod.namespace", "")] for c in rows]
    sys.stdout.write(table(out))
    return 0


#: exec's flags that take a value (cmd/crictl/exec.go@v1.36.0); the others are booleans
EXEC_VALUED = {"--timeout", "-r", "--transport", "--name", "-p", "--pod", "--image", "--state",
               "--label", "--last"}


def exec_in(rest: list[str]) -> int:
    i, sync = 0, False
    while i < len(rest) and rest[i].startswith("-"):  # urfave/cli stops at the first argument
        flag = rest[i].split("=", 1)[0]
        if flag in ("--name", "-p", "--pod", "--image", "--state", "--label", "--last"):
            return fatal("exec by filter flags is not played by the lab stand-in: give the ID")
        sync = sync or flag in ("-s", "--sync") or (flag.startswith("-") and not
                                                    flag.startswith("--") and "s" in flag)
        i += 2 if flag in EXEC_VALUED and "=" not in rest[i] else 1
    if len(rest) < i + 2:
        sys.stderr.write("NAME:\n   crictl exec - Run a command in a running container\n")
        return 1
    cid, cmd = rest[i], rest[i + 1:]
    etcd = etcd_container()
    if not etcd or not etcd.startswith(cid):
        return fatal(f"execing command in container {cid}: rpc error: code = NotFound desc = "
                     f'an error occurred when try to find container "{cid}": not found')
    name = os.path.basename(cmd[0])
    if name not in ("etcd", "etcdctl", "etcdutl"):
        return fatal(f"execing command in container {etcd}: command error: exec failed: unable "
                     f'to start container process: exec: "{cmd[0]}": executable file not found '
                     "in $PATH")
    code = subprocess.run([f"{ETCD_BIN}/{name}", *cmd[1:]], cwd="/").returncode
    if code == 0:
        return 0
    if sync:  # ExecSync: cli.Exit("non-zero exit code", code)
        sys.stderr.write("non-zero exit code\n")
        return code
    # the streaming exec: remotecommand's CodeExitError, logged fatal by crictl (exit 1)
    return fatal(f"execing command in container {etcd}: command terminated with non-zero exit "
                 f"code: error executing command {cmd}, exit code {code}")


def main(argv: list[str], version_raw: str) -> int:
    flags, rest = split_global(argv)
    p = argparse.ArgumentParser(prog="crictl", add_help=False)
    p.add_argument("-r", "--runtime-endpoint")
    p.add_argument("-i", "--image-endpoint")
    p.add_argument("-c", "--config")
    p.add_argument("-t", "--timeout")
    args, _ = p.parse_known_args(flags)
    ep = endpoint(args)
    err = nodeinfo.cri_error(ep)
    if err:
        return fatal(err)
    cmd = rest[0] if rest else None
    if cmd == "ps":
        return ps(rest[1:])
    if cmd == "exec":
        return exec_in(rest[1:])
    sys.stderr.write(f"No help topic for '{cmd}'\n")
    return 1
