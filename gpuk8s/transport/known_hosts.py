"""Host keys: known_hosts files read as OpenSSH reads them (patterns, hashed names, @revoked,
@cert-authority), and the policy every hop gets (yes, accept-new that always records, no)."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuk8s.sinks import shell

#: Where keys are checked and (accept-new) recorded when no UserKnownHostsFile is named.
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


#: Serialises appends to known_hosts files (hosts connect in parallel threads).
_RECORD_LOCK = threading.Lock()


class _Refused(Exception):
    """Connecting failed in a way a retry cannot fix (a host key, authentication, a config
    loop); the message names the hop and says what to do."""


def _known_name(host: str, port: int) -> str:
    """How known_hosts names a host (and how paramiko asks for it)."""
    return host if port == 22 else f"[{host}]:{port}"


def _pattern_matches(patterns: str, name: str) -> bool:
    """OpenSSH host-pattern matching of a known_hosts name field: comma-separated patterns with
    ``*`` and ``?``, ``!`` negation, or a hashed ``|1|salt|hash`` name."""
    import paramiko

    name = name.lower()
    if patterns.startswith("|1|"):
        try:
            return paramiko.HostKeys.hash_host(name, patterns) == patterns
        except Exception:  # a malformed hash matches nothing
            return False
    matched = False
    for pattern in patterns.lower().split(","):
        negated = pattern.startswith("!")
        pattern = pattern[1:] if negated else pattern
        regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
        if re.fullmatch(regex, name):
            if negated:
                return False
            matched = True
    return matched


def _is_pattern(names: str) -> bool:
    return any(c in names for c in "*?!")


@dataclass(frozen=True)
class _Line:
    patterns: str
    keytype: str
    blob: str
    where: str  # file:line
    key: Any = None  # parsed paramiko PKey (plain lines only)


class KnownHosts:
    """The known_hosts files of one connection, read the way OpenSSH reads them: only the
    files named with UserKnownHostsFile/GlobalKnownHostsFile (else ``~/.ssh/known_hosts``);
    ``@revoked`` keys are refused; ``@cert-authority`` lines are noted (gpuk8s cannot check
    host certificates) and never trusted; lines that cannot be parsed are skipped."""

    def __init__(self, files: Iterable[str] = ()) -> None:
        self.files = [os.path.expanduser(f) for f in files] or \
            [os.path.expanduser(DEFAULT_KNOWN_HOSTS)]
        self.plain: list[_Line] = []
        self.revoked: list[_Line] = []
        self.authorities: list[_Line] = []
        for path in self.files:
            self._read(path)

    @property
    def record_file(self) -> str:
        """Where accept-new records a new key: the first file, as ssh does."""
        return self.files[0]

    def _read(self, path: str) -> None:
        from paramiko.hostkeys import HostKeyEntry

        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return
        except OSError as exc:
            raise _Refused(f"cannot read the known_hosts file {path}: "
                           f"{exc.strerror or exc}; fix its permissions or name another file "
                           "with -o UserKnownHostsFile=...") from None
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split()
            marker = fields.pop(0) if fields[0].startswith("@") else ""
            if len(fields) < 3:
                continue  # not a key line: ssh skips it too
            entry = _Line(fields[0], fields[1], fields[2], f"{path}:{number}")
            if marker == "@revoked":
                self.revoked.append(entry)
            elif marker == "@cert-authority":
                self.authorities.append(entry)
            elif marker:
                continue  # an unknown marker: ssh ignores the line
            else:
                try:
                    parsed = HostKeyEntry.from_line(" ".join(fields[:3]))
                except Exception:  # bad base64 or key data: ssh skips such lines
                    parsed = None
                if parsed is not None and parsed.key is not None:
                    self.plain.append(_Line(fields[0], fields[1], fields[2],
                                            entry.where, parsed.key))

    def revocation(self, name: str, key: Any) -> str | None:
        """Where ``key`` is listed @revoked for ``name`` (None: it is not)."""
        blob = key.get_base64()
        for line in self.revoked:
            if line.blob == blob and _pattern_matches(line.patterns, name):
                return line.where
        return None

    def install(self, client: Any, name: str) -> None:
        """Put the exact-name (and hashed) keys in a paramiko client that connects to ``name``:
        paramiko then prefers their key types and refuses a different key itself. Keys listed
        @revoked for ``name`` are left out, so they reach the policy and are refused there."""
        keys = client.get_host_keys()
        keys.clear()
        for line in self.plain:
            if _is_pattern(line.patterns) and not line.patterns.startswith("|1|"):
                continue  # wildcards: matched by the policy
            if self.revocation(name, line.key) is None:
                for each in line.patterns.split(","):
                    keys.add(each, line.keytype, line.key)

    def by_pattern(self, name: str) -> list[_Line]:
        """Plain lines whose wildcard patterns match ``name`` (paramiko matches exact names)."""
        return [line for line in self.plain if _is_pattern(line.patterns)
                and not line.patterns.startswith("|1|") and _pattern_matches(line.patterns, name)]

    def authority_for(self, name: str) -> _Line | None:
        return next((a for a in self.authorities if _pattern_matches(a.patterns, name)), None)

    def record(self, name: str, key: Any) -> None:
        """Append ``name``'s key to the first file; create ``~/.ssh`` (0700) and the file
        (0600) when missing. Raises _Refused when it cannot be recorded."""
        path = Path(self.record_file)
        line = f"{name} {key.get_name()} {key.get_base64()}\n"
        with _RECORD_LOCK:
            try:
                if not path.parent.is_dir():
                    path.parent.mkdir(mode=0o700, parents=True)
                    path.parent.chmod(0o700)
                if path.exists() and not path.is_file():
                    raise _Refused(
                        f"cannot record the host key of {name}: {path} is not a regular file. "
                        "StrictHostKeyChecking=accept-new must record the keys it accepts; name "
                        "a real file with -o UserKnownHostsFile=..., or use "
                        "StrictHostKeyChecking=no for a throwaway lab")
                created = not path.exists()
                fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
                with os.fdopen(fd, "r+b") as fh:
                    if created:
                        os.chmod(path, 0o600)
                    size = fh.seek(0, os.SEEK_END)
                    if size:
                        fh.seek(size - 1)
                        if fh.read(1) != b"\n":
                            line = "\n" + line
                    fh.write(line.encode())
            except OSError as exc:
                raise _Refused(f"cannot record the host key of {name} in {path}: "
                               f"{exc.strerror or exc}; StrictHostKeyChecking=accept-new must "
                               "record the keys it accepts: fix the file's permissions or name "
                               "another with -o UserKnownHostsFile=...") from None


class _HostKeyPolicy:
    """The one host-key policy of every hop (the host and each bastion). paramiko calls
    ``missing_host_key`` for a name without an exact-name key, and refuses a different key
    itself (BadHostKeyException, turned into ``changed``). Revoked, wildcard-matched,
    certificate-only and unknown keys are decided here; ``policy`` is "yes", "accept-new" (record
    the key, then accept it) or "no" (accept it, in memory only)."""

    def __init__(self, known: KnownHosts, policy: str, label: str, host: str, port: int) -> None:
        self.known = known
        self.policy = policy
        self.label = label  # how errors name this hop: "10.0.0.5", "bastion jump.lab (...)"
        self.host = host
        self.port = port

    def _revoked(self, name: str, key: Any) -> None:
        where = self.known.revocation(name, key)
        if where:
            raise _Refused(
                f"host key of {self.label} is REVOKED: the server presented the "
                f"{key.get_name()} key listed as @revoked at {where}. It must never be accepted; "
                "find out why the host still uses it, and give it a new key.")

    def _keyscan(self) -> str:
        port = f" -p {self.port}" if self.port != 22 else ""
        return f"`ssh-keyscan{port} {self.host}`"

    def changed(self, name: str, key: Any) -> _Refused:
        self._revoked(name, key)
        return _Refused(
            f"HOST KEY CHANGED for {self.label}: the server presented a {key.get_name()} key "
            f"that does not match {', '.join(self.known.files)}. This may be an attack or a "
            "reinstalled host; if you reinstalled it, remove the old key with "
            f"`ssh-keygen -R {shell(_known_name(self.host, self.port))} -f "
            f"{shell(self.known.record_file)}` "
            "and connect again.")

    def missing_host_key(self, client: Any, name: str, key: Any) -> None:
        self._revoked(name, key)
        matches = self.known.by_pattern(name)
        if matches:
            if any(m.blob == key.get_base64() for m in matches):
                return
            raise self.changed(name, key)
        if self.policy == "no":  # opted out: remember it for this connection only
            client.get_host_keys().add(name, key.get_name(), key)
            return
        authority = self.known.authority_for(name)
        if authority is not None:
            raise _Refused(
                f"host key of {self.label} is not known: {authority.where} has a "
                "@cert-authority line for it, but gpuk8s cannot check SSH host certificates. "
                f"Add the host's own key to {self.known.record_file} "
                f"({self._keyscan()}, after checking it).")
        if self.policy == "accept-new":
            self.known.record(name, key)
            client.get_host_keys().add(name, key.get_name(), key)
            return
        raise _Refused(
            f"host key of {self.label} is unknown. Verify it and add it to "
            f"{self.known.record_file} ({self._keyscan()} shows it), or opt in to "
            "trust-on-first-use with "
            "ansible_ssh_common_args: '-o StrictHostKeyChecking=accept-new'.")
