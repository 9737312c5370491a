"""kubespray's bastion: the one host of its [bastion] group is the jump host of every other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpuk8s.inventory.model import BASTION, Host


def through_bastion(hosts: dict[str, Host], group: Any, problem: Callable[..., None],
                    notes: list[str]) -> None:
    """Give every host with no jump of its own the bastion as ProxyJump (as kubespray's
    ssh-bastion.conf does); the bastion itself is never a cluster member. ``group``: the raw
    bastion group (None: there is none)."""
    names = [name for name, h in hosts.items() if BASTION in h.groups]  # children too
    if len(names) > 1:
        problem(f"group {BASTION} has {len(names)} hosts ({', '.join(names)}); it is the one "
                "jump host of the others", line=group.line, path=group.path,
                fix="keep one host in [bastion] (or set a ProxyJump per host in "
                "ansible_ssh_common_args)")
        return
    if not names:
        return
    bastion = hosts[names[0]]
    if bastion.is_control_plane or bastion.is_worker:
        problem(f"host {bastion.name!r} is the bastion and a cluster member", line=group.line,
                path=group.path, fix=f"take {bastion.name} out of the control_plane and workers "
                "groups, or out of bastion")
        return
    if bastion.proxy_command:
        problem(f"host {bastion.name!r} is the bastion and has a ProxyCommand, which gpuk8s "
                "cannot chain", line=group.line, path=group.path,
                fix=f"give {bastion.name} a ProxyJump instead (-J user@outer in "
                "ansible_ssh_common_args)")
        return
    address = f"[{bastion.address}]" if ":" in bastion.address else bastion.address
    # the bastion's own jump comes first (ProxyJump takes a comma-separated chain)
    jump = ",".join(filter(None, (bastion.proxy_jump, f"{bastion.user}@{address}:{bastion.port}")))
    for name, host in hosts.items():
        if name != bastion.name and host.connection == "ssh" and not host.proxy_jump \
                and not host.proxy_command:
            # every hop is tried with the host's keys: the bastion's own key joins them
            keys = tuple(dict.fromkeys([*host.identity_files, *bastion.identity_files]))
            hosts[name] = replace(host, proxy_jump=jump, identity_files=keys,
                                  private_key_file=host.private_key_file or
                                  (keys[0] if keys else None))
    notes.append(f"host {bastion.name!r} (group {BASTION}) is the jump host of the others "
                 f"(ProxyJump {jump}), as in kubespray")
