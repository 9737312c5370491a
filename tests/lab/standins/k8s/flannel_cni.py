#!/usr/bin/python3
# LAB STAND-IN: not the real flannel CNI plugin. Test infrastructure for gpuk8s; never shipped.
"""flannel's CNI plugin (github.com/flannel-io/cni-plugin), played in Python: it does what the
real one does and no more. It reads the subnet the flannel daemon leased to this node
(/run/flannel/subnet.env), turns the `delegate` of its network config into a config for the
REAL `bridge` plugin with `host-local` IPAM over that subnet, saves it under
/var/lib/cni/flannel/<container id> (so DEL undoes exactly what ADD did), and runs the delegate
with the same CNI environment. The kubelet stand-in installs this file as /opt/cni/bin/flannel
when flannel's install-cni-plugin init container would have copied the real binary there."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from typing import Any

SUBNET_ENV = "/run/flannel/subnet.env"
DATA_DIR = "/var/lib/cni/flannel"
VERSIONS = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"]


def fail(code: int, msg: str) -> int:
    print(json.dumps({"cniVersion": "0.3.1", "code": code, "msg": msg}))
    return 1


def subnet_env(path: str) -> dict[str, str]:
    out = {}
    with open(path) as f:
        for line in f:
            key, sep, value = line.strip().partition("=")
            if sep:
                out[key] = value
    return out


def delegate_config(conf: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """The bridge config flannel builds from its `delegate` and the node's lease."""
    delegate = dict(conf.get("delegate") or {})
    delegate.setdefault("name", conf.get("name", "cbr0"))
    delegate.setdefault("type", "bridge")
    delegate.setdefault("cniVersion", conf.get("cniVersion", "0.3.1"))
    # the flannel daemon masquerades itself when FLANNEL_IPMASQ is true
    delegate.setdefault("ipMasq", env.get("FLANNEL_IPMASQ") != "true")
    if "FLANNEL_MTU" in env:
        delegate.setdefault("mtu", int(env["FLANNEL_MTU"]))
    if delegate["type"] == "bridge":
        delegate.setdefault("isGateway", True)
    # the lease is the gateway's address (10.244.2.1/24); IPAM takes its network
    subnet = str(ipaddress.ip_network(env["FLANNEL_SUBNET"], strict=False))
    delegate["ipam"] = {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                        "routes": [{"dst": env["FLANNEL_NETWORK"]}]}
    return delegate


def run_delegate(conf: dict[str, Any]) -> int:
    plugin = next((os.path.join(d, conf["type"]) for d in
                   os.environ.get("CNI_PATH", "/opt/cni/bin").split(os.pathsep)
                   if os.access(os.path.join(d, conf["type"]), os.X_OK)), None)
    if plugin is None:
        return fail(7, f'failed to find plugin "{conf["type"]}" in path '
                       f'[{os.environ.get("CNI_PATH", "")}]')
    p = subprocess.run([plugin], input=json.dumps(conf).encode(), capture_output=True)
    sys.stdout.buffer.write(p.stdout)
    sys.stderr.buffer.write(p.stderr)
    return p.returncode


def main() -> int:
    command = os.environ.get("CNI_COMMAND", "")
    if command == "VERSION" or not command:
        print(json.dumps({"cniVersion": "1.0.0", "supportedVersions": VERSIONS}))
        return 0
    conf = json.loads(sys.stdin.read() or "{}")
    saved = os.path.join(DATA_DIR, os.environ.get("CNI_CONTAINERID", "").replace("/", "_"))
    if command == "ADD":
        try:
            env = subnet_env(conf.get("subnetFile", SUBNET_ENV))
        except OSError as e:
            return fail(11, f"failed to load flannel 'subnet.env' file: {e}. Check the "
                            "flannel pod log for this node.")
        delegate = delegate_config(conf, env)
        os.makedirs(DATA_DIR, exist_ok=True)
        with open(saved, "w") as f:
            json.dump(delegate, f)
        return run_delegate(delegate)
    try:
        with open(saved) as f:
            delegate = json.load(f)
    except OSError:
        return 0 if command == "DEL" else fail(11, f"no saved delegate config {saved}")
    rc = run_delegate(delegate)
    if command == "DEL" and rc == 0:
        os.unlink(saved)
    return rc


if __name__ == "__main__":
    sys.exit(main())
