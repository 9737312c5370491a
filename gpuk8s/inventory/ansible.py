"""Ansible's side of an inventory: the group names of kubespray and DeepOps, the connection
keys gpuk8s honours (and their old names), and ssh arguments (ProxyJump, known hosts...)."""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuk8s.inventory.model import BECOME_PASSWORD_ENV, Host, Secret
from gpuk8s.variables import MergedVars

#: The sudo password and its Ansible aliases: never accepted from --set (argv is public).
_PASSWORD_KEYS = frozenset({"ansible_become_password", "ansible_become_pass",
                            "ansible_sudo_pass"})


def _has_line_break(password: str) -> bool:
    """sudo -S reads a password up to the first line break; the rest would reach root's sh."""
    return "\n" in password or "\r" in password


# Connection keys we honour; any other ansible_* key is an error.
ANSIBLE_KEYS = frozenset({
    "ansible_host", "ansible_port", "ansible_user", "ansible_ssh_private_key_file",
    "ansible_become", "ansible_become_password", "ansible_connection",
    "ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_python_interpreter",
})


#: Ansible's other names for the keys gpuk8s honours: read as the key they alias (as Ansible
#: does), with a note
ANSIBLE_ALIASES = {
    "ansible_ssh_host": "ansible_host",
    "ansible_ssh_port": "ansible_port",
    "ansible_ssh_user": "ansible_user",
    "ansible_private_key_file": "ansible_ssh_private_key_file",
    "ansible_become_pass": "ansible_become_password",
    "ansible_sudo_pass": "ansible_become_password",
    "ansible_sudo": "ansible_become",
}
#: keys gpuk8s accepts only with the one value it works with (it always becomes root by sudo)
ANSIBLE_FIXED = {"ansible_become_user": "root", "ansible_become_method": "sudo"}
#: login passwords: refused (gpuk8s logs in with keys only), with a one-line switch to a key
_ANSIBLE_REFUSED = frozenset({"ansible_ssh_pass", "ansible_password", "ansible_ssh_password"})
#: Ansible's own settings that change nothing in what gpuk8s does (retries, timeouts, how
#: Ansible copies its modules, other languages' interpreters): ignored like other playbooks'
#: variables. ansible_host_key_checking is among them: gpuk8s checks host keys regardless
#: (StrictHostKeyChecking=accept-new in ansible_ssh_common_args trusts on first use).
ANSIBLE_IGNORED = frozenset({
    "ansible_ssh_retries", "ansible_ssh_pipelining", "ansible_pipelining", "ansible_timeout",
    "ansible_ssh_timeout", "ansible_ssh_transfer_method", "ansible_scp_if_ssh",
    "ansible_sftp_batch_mode", "ansible_host_key_checking", "ansible_ssh_host_key_checking",
    "ansible_shell_executable", "ansible_remote_tmp",
})


def ansible_ignored(key: str) -> bool:
    return key in ANSIBLE_IGNORED or (key.endswith("_interpreter") and key.count("_") == 2)


_CONNECTIONS = {"ssh": "ssh", "paramiko": "ssh", "smart": "ssh", "local": "local"}


_TRUE = {"true", "yes", "on", "1"}


_FALSE = {"false", "no", "off", "0"}


@dataclass
class _Ssh:
    proxy_jump: str | None = None
    proxy_command: str | None = None
    known_hosts_files: list[str] = field(default_factory=list)
    strict: str | None = None
    config_file: str | None = None
    identity_files: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class _SshArgError(Exception):
    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


def _resolve_path(value: str, base: Path) -> str:
    p = Path(os.path.expanduser(value))
    if not p.is_absolute():
        p = base / p
    return os.path.normpath(str(p))


_SSH_ARG_FLAGS = set("bceilmopBDEFIJLOPQRSwW")


def _parse_ssh_args(text: str, base: Path, into: _Ssh | None = None) -> _Ssh:
    """Parse ansible_ssh_common_args / ansible_ssh_extra_args; the first value wins, as in ssh."""
    ssh = into or _Ssh()
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise _SshArgError(f"cannot split the ssh arguments ({exc})",
                           "balance the quotes, e.g. '-o ProxyCommand=\"ssh -W %h:%p bastion\"'"
                           ) from None
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if len(tok) < 2 or not tok.startswith("-"):
            ssh.warnings.append(f"ssh argument {tok!r} ignored")
            continue
        flag = tok[1]
        if flag not in _SSH_ARG_FLAGS:
            ssh.warnings.append(f"ssh flag {tok} ignored")
            continue
        if len(tok) > 2:
            val = tok[2:]
        elif i < len(tokens):
            val = tokens[i]
            i += 1
        else:
            raise _SshArgError(f"ssh flag -{flag} needs a value", f"write -{flag} VALUE")
        if flag == "o":
            _ssh_option(ssh, val, base)
        elif flag == "J":
            ssh.proxy_jump = ssh.proxy_jump or val
        elif flag == "F":
            ssh.config_file = ssh.config_file or _resolve_path(val, base)
        elif flag == "i":
            ssh.identity_files.append(_resolve_path(val, base))
        elif flag in "pl":
            what = "ansible_port" if flag == "p" else "ansible_user"
            ssh.warnings.append(f"ssh flag -{flag} ignored: use {what}")
        else:
            ssh.warnings.append(f"ssh flag -{flag} ignored")
    return ssh


def _ssh_option(ssh: _Ssh, option: str, base: Path) -> None:
    key, sep, val = option.partition("=")
    if not sep:
        key, _, val = option.strip().partition(" ")
    key, val = key.strip(), val.strip()
    if not key or not val:
        raise _SshArgError(f"ssh option {option!r} has no value", "write -o Key=Value")
    low = key.lower()
    if low == "proxyjump":
        if val.lower() != "none":
            ssh.proxy_jump = ssh.proxy_jump or val
    elif low == "proxycommand":
        if val.lower() != "none":
            ssh.proxy_command = ssh.proxy_command or val
    elif low in ("userknownhostsfile", "globalknownhostsfile"):
        ssh.known_hosts_files.extend(_resolve_path(v, base) for v in val.split())
    elif low == "stricthostkeychecking":
        word = {"off": "no", "on": "yes"}.get(val.lower(), val.lower())
        if word not in ("yes", "no", "accept-new"):
            raise _SshArgError(f"StrictHostKeyChecking={val} is not supported",
                               "use -o StrictHostKeyChecking=accept-new (or yes, or no)")
        ssh.strict = ssh.strict or word
    elif low == "identityfile":
        ssh.identity_files.append(_resolve_path(val, base))
    elif low in ("user", "port", "hostname"):
        what = {"user": "ansible_user", "port": "ansible_port", "hostname": "ansible_host"}[low]
        ssh.warnings.append(f"ssh option {key} ignored: use {what}")
    else:
        ssh.warnings.append(f"ssh option {key} ignored")


def connection_host(name: str, merged: MergedVars, groups: Sequence[str],
                    env: Mapping[str, str], base: Path, source: str
                    ) -> tuple[Host, tuple[str, str] | None]:
    """The Host its merged variables describe, and a problem (message, fix) with the become
    password taken from the environment, if any."""
    conn = {k: merged[k] for k in merged if k.startswith("ansible_")}
    user = conn.get("ansible_user", "root")
    become = conn.get("ansible_become", user != "root")
    password = conn.get("ansible_become_password")
    problem = None
    if password is None and become and env.get(BECOME_PASSWORD_ENV):
        if _has_line_break(env[BECOME_PASSWORD_ENV]):
            problem = (f"{BECOME_PASSWORD_ENV} contains a line break (value not shown): sudo "
                       "reads a password only up to the first one",
                       f'export {BECOME_PASSWORD_ENV}="..." with the password on one line')
        else:
            password = Secret(env[BECOME_PASSWORD_ENV])
    ssh = _Ssh()
    for key in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        if conn.get(key):
            with contextlib.suppress(_SshArgError):  # reported where it was written
                _parse_ssh_args(conn[key], base, ssh)
    if ssh.proxy_jump and ssh.proxy_command:
        ssh.warnings.append("both ProxyJump and ProxyCommand are set; ProxyJump is used")
    key_file = conn.get("ansible_ssh_private_key_file")
    key_file = _resolve_path(key_file, base) if key_file else None
    identities = list(dict.fromkeys([*([key_file] if key_file else []), *ssh.identity_files]))
    spec_vars = merged.subset([k for k in merged if not k.startswith("ansible_")])
    return Host(
        name=name, address=conn.get("ansible_host", name), port=conn.get("ansible_port", 22),
        user=user, groups=tuple(groups), vars=spec_vars,
        private_key_file=key_file or (identities[0] if identities else None),
        identity_files=tuple(identities), become=become, become_password=password,
        connection=_CONNECTIONS[conn.get("ansible_connection", "ssh")],
        proxy_jump=ssh.proxy_jump, proxy_command=ssh.proxy_command,
        known_hosts_files=tuple(ssh.known_hosts_files),
        strict_host_key_checking=ssh.strict, ssh_config_file=ssh.config_file,
        warnings=tuple(ssh.warnings), source=source), problem
