"""apt ops: signed repositories and pinned, held packages."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuk8s.errors import PlanError
from gpuk8s.facts.system import FileState, PackageState
from gpuk8s.lockfile import AptPins
from gpuk8s.ops import Op, change, q, sha256, write_file
from gpuk8s.sinks import UnsafeValue, apt_conf_host, apt_conf_string

#: Op.meta keys `invoke lock` reads from a plan: an apt source a role configures (JSON of
#: name, url, suite, components, key_url, fingerprint) and the packages an op wants (JSON of
#: name -> version pattern, see version_matches)
SOURCE_META = "apt.source"
PACKAGES_META = "apt.packages"


@dataclass(frozen=True)
class Apt:
    """How apt-get runs in an op: how long it waits for the dpkg lock (apt_lock_timeout), and
    apt.conf settings for this run only (``conf``: they travel in a 0600 scratch file read with
    ``apt-get -c``, never on argv, where any user of the node could read them with ps)."""

    lock_timeout: int = 300
    conf: str = ""
    #: one ``apt-get update`` may take this long; a stalled one is killed and tried once more
    update_timeout: int = 240
    #: the inventory's lock, this host's OS release of it (None: no lock): packages() installs
    #: exactly the versions it pins, with the pinned packages they need
    pins: AptPins | None = None
    #: the https hosts of the apt sources whose certificates apt_ca_file's CA signs: a key
    #: fetched from one of them is checked against that CA (APT_CA_FILE on the node)
    ca_hosts: frozenset[str] = frozenset()

    @classmethod
    def for_host(cls, vars: Mapping[str, Any], conf: str = "",
                 pins: AptPins | None = None) -> Apt:
        """apt as a host's variables say (its apt_lock_timeout, apt_ca_file), with its lock's
        pins."""
        hosts = https_hosts(vars) if vars.get("apt_ca_file") else frozenset()
        return cls(int(vars.get("apt_lock_timeout", 300)), conf, pins=pins, ca_hosts=hosts)

    @property
    def cmd(self) -> str:
        """The apt-get command line prefix (noninteractive, keep changed config files)."""
        extra = ' -c "$c"' if self.conf else ""
        return ("DEBIAN_FRONTEND=noninteractive apt-get -q -y "
                f"-o DPkg::Lock::Timeout={int(self.lock_timeout)}{extra} "
                "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold")

    def update(self, options: str = "") -> str:
        """``apt-get update`` that waits up to lock_timeout for the package lists' lock, which
        DPkg::Lock::Timeout does not cover (an ``apt-get update`` left running on the node by an
        interrupted run holds it), and that never hangs: an update still running after
        update_timeout (apt can wait for good on a stalled mirror or proxy connection) is
        killed and tried once more. Any other failure prints apt's output and fails at once."""
        opts = f" {options}" if options else ""
        t = int(self.update_timeout)
        cmd = self.cmd.replace(" apt-get ", f" timeout -k 10 {t} apt-get ", 1)
        return (f"_r=1; _h=0; _e=$(( $(date +%s) + {int(self.lock_timeout)} )); while :; do "
                f"_o=$({cmd} update{opts} 2>&1) && {{ _r=0; break; }}; _c=$?; "
                'if [ $_c -eq 124 ] && [ $_h -eq 0 ]; then _h=1; echo "gpuk8s: apt-get update '
                f'did not finish in {t}s; trying once more" >&2; continue; fi; '
                'case "$_o" in *"lists/lock"*) if [ "$(date +%s)" -lt "$_e" ]; then sleep 2; '
                'continue; fi;; esac; [ $_c -eq 124 ] && _o="$_o (gpuk8s: apt-get update did '
                f'not finish in {t}s, twice: a stalled mirror or proxy?)"; '
                "printf '%s\\n' \"$_o\" >&2; break; done; [ $_r -eq 0 ]")

    def script(self, body: str) -> str:
        """``body`` (which uses :attr:`get`) with the scratch config around it, if any."""
        if not self.conf:
            return body
        return (f"(c=$(mktemp) && trap 'rm -f \"$c\"' EXIT && printf '%s\\n' {q(self.conf)} "
                f'> "$c"\n{body}\n)')


#: where apt_ca_file's certificates live on a node (roles/base), and the apt.conf file that
#: gives them to apt for each https source host (Acquire::https::<host>::CAInfo, the key
#: methods/basehttp.cc@2.6.1 reads: the man page's "CAInfo::host" is written the other way)
APT_CA_FILE = "/usr/local/share/gpuk8s/apt-ca.crt"
APT_CA_CONF = "/etc/apt/apt.conf.d/90gpuk8s-ca"


def https_hosts(vars: Mapping[str, Any]) -> frozenset[str]:
    """The hosts of every https apt source and key URL the variables name (*_repo_url,
    *_repo_key_url, apt_os_mirror_url and its key URL)."""
    import urllib.parse

    names = [n for n in vars if n.endswith(("_repo_url", "_repo_key_url"))
             or n in ("apt_os_mirror_url", "apt_os_mirror_key_url")]
    urls = [vars[n] for n in names]
    return frozenset(h for u in urls if isinstance(u, str) and u.startswith("https://")
                     and (h := urllib.parse.urlsplit(u).hostname))


def ca_conf(hosts: Sequence[str]) -> str:
    """apt.conf lines that check each host's certificate against APT_CA_FILE."""
    return "".join(f'Acquire::https::{apt_conf_host(h, "apt_ca_file")}::CAInfo '
                   f'"{APT_CA_FILE}";\n' for h in sorted(hosts))


def proxy_conf(proxy: str, https: str = "", direct: Sequence[str] = ()) -> str:
    """The apt.conf lines that send apt's http through ``proxy`` ("DIRECT": no proxy), its
    https through ``https`` (if any), and both straight to each host of ``direct`` (a mirror
    inside the lab: apt_proxy_direct, kubespray's no_proxy)."""
    lines = [f"Acquire::http::Proxy {apt_conf_string(proxy, 'apt_proxy')};"]
    if https:
        lines.append(f"Acquire::https::Proxy {apt_conf_string(https, 'apt_https_proxy')};")
    for host in direct:
        key = apt_conf_host(host, "apt_proxy_direct")
        lines.extend(f'Acquire::{scheme}::Proxy::{key} "DIRECT";' for scheme, via in
                     (("http", proxy), ("https", https)) if via and via != "DIRECT")
    return "\n".join(lines)


#: apt-get with the default lock wait and no extra settings
DEFAULT_APT = Apt()
APT = DEFAULT_APT.cmd


def source_line(url: str, suite: str, components: str, keyring: str) -> str:
    """One-line apt source; a flat repo (suite "/") has no components."""
    tail = f" {suite} {components}".rstrip() if suite != "/" else " /"
    return f"deb [signed-by={keyring}] {url}{tail}\n"


def _packets(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(tag, body) of each OpenPGP packet in a binary keyring; unparseable data ends it."""
    i = 0
    while i < len(data):
        head = data[i]
        if not head & 0x80:
            return
        if head & 0x40:  # new format: tag in the low 6 bits, then a 1, 2 or 5 byte length
            tag = head & 0x3F
            if i + 1 >= len(data):
                return
            first = data[i + 1]
            if first < 192:
                length, start = first, i + 2
            elif first < 224:
                if i + 2 >= len(data):
                    return
                length, start = ((first - 192) << 8) + data[i + 2] + 192, i + 3
            elif first == 255:
                length, start = int.from_bytes(data[i + 2:i + 6], "big"), i + 6
            else:
                return  # partial lengths never occur in key packets
        else:  # old format: tag in bits 5-2, length type in bits 1-0
            tag, kind = (head >> 2) & 0x0F, head & 0x03
            if kind == 3:
                return
            size = (1, 2, 4)[kind]
            length, start = int.from_bytes(data[i + 1:i + 1 + size], "big"), i + 1 + size
        body = data[start:start + length]
        if len(body) < length:
            return
        yield tag, body
        i = start + length


def _subpackets(area: bytes) -> dict[int, bytes]:
    """Signature subpackets by type (RFC 9580 5.2.3.7); the last of a type wins."""
    out: dict[int, bytes] = {}
    i = 0
    while i < len(area):
        first = area[i]
        if first < 192:
            length, i = first, i + 1
        elif first < 255:
            if i + 1 >= len(area):
                break
            length, i = ((first - 192) << 8) + area[i + 1] + 192, i + 2
        else:
            length, i = int.from_bytes(area[i + 1:i + 5], "big"), i + 5
        if length < 1 or i + length > len(area):
            break
        out[area[i] & 0x7F] = area[i + 1:i + length]
        i += length
    return out


@dataclass(frozen=True)
class KeyringKey:
    """A primary key of a keyring: its fingerprint and when it expires (Unix time, None:
    never), as its newest self-signature says (what ``gpg --show-keys`` prints in field 7)."""

    fingerprint: str
    expires: int | None = None


#: self-signatures that carry a primary key's expiry: certifications of its user IDs
#: (0x10-0x13) and direct-key signatures (0x1F)
_SELF_SIGS = {0x10, 0x11, 0x12, 0x13, 0x1F}


def keyring_keys(data: bytes) -> list[KeyringKey]:
    """The primary keys of a binary OpenPGP keyring (subkeys are not listed): fingerprints
    as ``gpg --show-keys`` prints them (v4 keys by SHA-1, v6 by SHA-256, RFC 9580 5.5.4) and
    their expiry from the newest self-signature's key expiration time (subpacket 9, seconds
    after the key's creation; RFC 9580 5.2.3.13). pkgs.k8s.io's key is re-published with a
    later expiry under the same fingerprint, so the fingerprint alone cannot tell an old copy."""
    keys: list[KeyringKey] = []
    created = 0
    newest = -1
    in_subkey = False
    for tag, body in _packets(data):
        if tag == 6 and body and body[0] in (4, 6):
            h = (hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body,
                              usedforsecurity=False) if body[0] == 4 else
                 hashlib.sha256(b"\x9b" + len(body).to_bytes(4, "big") + body))
            keys.append(KeyringKey(h.hexdigest().upper()))
            created, newest, in_subkey = int.from_bytes(body[1:5], "big"), -1, False
        elif tag == 14:
            in_subkey = True
        elif tag == 2 and keys and not in_subkey and len(body) > 6 and body[1] in _SELF_SIGS:
            size = {4: 2, 6: 4}.get(body[0])
            if size is None:
                continue
            hashed_len = int.from_bytes(body[4:4 + size], "big")
            sub = _subpackets(body[4 + size:4 + size + hashed_len])
            issuer = sub.get(33, b"")[1:].hex().upper()
            if issuer and issuer != keys[-1].fingerprint:
                continue  # a certification by another key
            when = int.from_bytes(sub.get(2, b"\0"), "big")
            if when >= newest:
                newest = when
                life = int.from_bytes(sub.get(9, b"\0"), "big")
                keys[-1] = KeyringKey(keys[-1].fingerprint, created + life if life else None)
    return keys


def keyring_fingerprints(data: bytes) -> list[str]:
    """Fingerprints (upper-case hex) of the primary keys in a binary OpenPGP keyring."""
    return [k.fingerprint for k in keyring_keys(data)]


def normalize_fingerprint(value: str) -> str:
    """``"DE15 B144 ..."`` or ``"0xde15b144..."`` -> ``"DE15B144..."``."""
    text = value.replace(" ", "").upper()
    return text[2:] if text.startswith("0X") else text


def _fetch_key(key_url: str, keyring: str, fingerprint: str, variable: str,
               cacert: str = "") -> str:
    """Fetch the key into a scratch keyring, check its fingerprint, then install it: a key
    that is not the expected one never reaches /etc/apt/keyrings. ``cacert``: the CA that
    signs the key host's certificate (apt_ca_file's copy), instead of the system's."""
    proto = "=https" if key_url.startswith("https://") else "=http,https"
    ca = f"--cacert {q(cacert)} " if cacert else ""
    fetch = (f"curl -fsSL --retry 3 {ca}--proto {proto} --proto-redir {proto} {q(key_url)} "
             '| gpg --dearmor --yes -o "$t/keyring"')
    check = ""
    if fingerprint:
        check = (
            '\ngot=$(GNUPGHOME="$t" gpg --batch --show-keys --with-colons "$t/keyring" 2>/dev/null '
            "| awk -F: '$1==\"pub\"{p=1;next} $1==\"fpr\"&&p{print $10;p=0}' | tr '\\n' ' ' "
            "| sed 's/ $//')\n"
            f'if [ "$got" != {q(fingerprint)} ]; then echo "the key at "{q(key_url)}'
            '" has fingerprint ${got:-none}, expected "'
            f'{q(fingerprint)}" ({variable}); refusing it" >&2; exit 1; fi')
    return (f"mkdir -p -m 0755 /etc/apt/keyrings && (t=$(mktemp -d) && trap 'rm -rf \"$t\"' "
            f"EXIT && chmod 0700 \"$t\"\n{fetch}{check}\n"
            f'install -m 0644 "$t/keyring" {q(keyring)})')


#: a keyring whose key expires within this many days is fetched again (pkgs.k8s.io extends its
#: key's expiry by re-publishing it under the same fingerprint: kubernetes/kubernetes#128609)
KEY_RENEW_DAYS = 30
#: while upstream has not extended an expiring key yet, fetch it at most this often
KEY_RECHECK_SECONDS = 86400


def _expiry_reason(key_state: FileState, keys: Sequence[KeyringKey],
                   now: float) -> tuple[bool, str]:
    """(fetch again?, why) for a keyring whose keys expired or expire soon."""
    ends = [k.expires for k in keys if k.expires is not None]
    if not ends:
        return False, ""
    end = min(ends)
    day = dt.datetime.fromtimestamp(end, dt.UTC).strftime("%Y-%m-%d")
    if end <= now:
        return True, (f"the key in {key_state.path} expired on {day} (apt-get update would "
                      "fail with EXPKEYSIG): fetch it again")
    left = end - now
    if left > KEY_RENEW_DAYS * 86400:
        return False, ""
    if key_state.mtime and now - key_state.mtime < KEY_RECHECK_SECONDS:
        return False, (f"key expires on {day}; fetched again within a day and upstream has "
                       "not extended it yet")
    return True, (f"the key in {key_state.path} expires on {day}, in {int(left // 86400)} "
                  "day(s): fetch it again")


def repo(list_state: FileState, key_state: FileState, op_id: str, *, name: str, url: str,
         suite: str, components: str, key_url: str, fingerprint: str = "",
         fingerprint_var: str = "", apt: Apt = DEFAULT_APT, now: float | None = None) -> Op:
    """Ensure the apt source ``name`` with its signing key, and refresh its package index.

    ``fingerprint`` (from ``fingerprint_var``) pins the key: a fetched key with another
    fingerprint is refused before apt sees it, and a keyring on the node whose keys are not
    exactly that one is fetched again (``key_state`` must carry the keyring's content).

    No-op when: the .list file names this URL and key URL and the keyring exists (holding
    exactly the pinned key, when one is pinned) with keys that neither expired nor expire
    within KEY_RENEW_DAYS (an expiring key fetched less than a day ago counts as fresh).
    """
    for what, value in (("repository", url), ("key", key_url)):
        if "@" in value.partition("://")[2].partition("/")[0]:
            raise UnsafeValue(f"the {what} URL of apt source {name} holds a user name or "
                              "password, which would reach curl's command line and a "
                              "world-readable sources.list file on every node; remove it "
                              "(apt takes logins from /etc/apt/auth.conf.d, man apt_auth.conf)")
    keyring = key_state.path
    want = normalize_fingerprint(fingerprint)
    # what `invoke lock` reads from the plan: the sources a node gets, as the roles say
    meta = {SOURCE_META: json.dumps({"name": name, "url": url, "suite": suite,
                                     "components": components, "key_url": key_url,
                                     "fingerprint": want,
                                     "variable": fingerprint_var.removesuffix(
                                         "_key_fingerprint")}, sort_keys=True)}
    text = f"# managed by gpuk8s; key from {key_url}\n" + source_line(url, suite, components,
                                                                       keyring)
    data = text.encode()
    keys = keyring_keys(key_state.content) if key_state.content is not None else None
    have = [k.fingerprint for k in keys] if keys is not None else None
    key_ok = key_state.exists and (not want or have == [want])
    stale, why = (_expiry_reason(key_state, keys, time.time() if now is None else now)
                  if key_ok and keys else (False, ""))
    if list_state.exists and key_ok and not stale and list_state.sha256 == sha256(data):
        pinned = f" (key {want[-16:]})" if want else ""
        note = f"; {why}" if why else ""
        return Op(op_id, (), f"= apt source {name} -> {url}{pinned}{note}", meta=meta)
    reason = f"+ apt source {name} -> {url}"
    if key_state.exists and not key_ok:
        held = ", ".join(h[-16:] for h in have or []) or "no key"
        reason += f" (the keyring holds {held}, not the pinned {want[-16:]}: fetch it again)"
    elif stale:
        reason += f" ({why}, checked against the pinned fingerprint)" if want else f" ({why})"
    update = apt.script(apt.update(f"-o Dir::Etc::sourcelist={q(list_state.path)} "
                                   "-o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0"))
    import urllib.parse

    cacert = APT_CA_FILE if urllib.parse.urlsplit(key_url).hostname in apt.ca_hosts else ""
    return change(op_id, reason, _fetch_key(key_url, keyring, want, fingerprint_var, cacert),
                  write_file(list_state.path, data), update, meta=meta)


def version_matches(version: str, pattern: str) -> bool:
    """A version prefix ("1.36.", "" for any), with a leading "*" a suffix ("*+cuda13.0"), or
    with a leading "=" exactly that version (a lock's pin)."""
    if pattern.startswith("="):
        return version == pattern[1:]
    return version.endswith(pattern[1:]) if pattern.startswith("*") else \
        version.startswith(pattern)


def _pinned(wanted: Mapping[str, str], pins: AptPins) -> dict[str, str]:
    """``wanted`` as the lock pins it: each pinned package at "=<its version>", followed by
    the pinned packages it needs; a package the lock does not pin (the OS archive's) keeps its
    pattern. A pin that no longer matches what the inventory asks is an error: the lock is
    older than the inventory."""
    out: dict[str, str] = {}
    for name, pattern in wanted.items():
        if name not in pins.packages:
            out.setdefault(name, pattern)
            continue
        version = pins.packages[name][0]
        if not version_matches(version, pattern):
            raise PlanError(f"{pins.lock} pins {name} {version} for {pins.release}, but the "
                            f"inventory asks for {pattern!r}: the lock is older than the "
                            "inventory; run `invoke lock` again (or put the inventory back)")
        for item in pins.closure(name):
            out[item] = "=" + pins.packages[item][0]
    return out


def packages(installed: Mapping[str, PackageState], op_id: str, wanted: Mapping[str, str], *,
             hold: bool = False, update_first: bool = False, pin_deps: bool = False,
             apt: Apt = DEFAULT_APT) -> Op:
    """Ensure packages are installed at versions matching their prefix ("" = any; "*suffix":
    ending so, see version_matches), held
    if ``hold``. A prefix ("1.36.", "580.159.04") picks the newest matching version at apply
    time; downgrades are allowed, since the inventory is the truth. ``pin_deps`` also pins
    every dependency declared with ``(= version)`` (NVIDIA's driver metapackages need it to
    install a version that is not the newest).

    No-op when: each package is installed at a matching version (and held when asked).
    """
    meta = {PACKAGES_META: json.dumps(dict(wanted), sort_keys=True)}
    asked = dict(wanted)
    if apt.pins is not None:
        wanted = _pinned(wanted, apt.pins)
    missing: dict[str, str] = {}
    for name in asked:
        state = installed.get(name)
        if state is None or not version_matches(state.version, wanted[name]):
            missing[name] = wanted[name]
    if missing:  # the pinned packages they need come along, at their pins
        missing.update({n: p for n, p in wanted.items() if n not in asked})
    unheld = [n for n in asked if hold and n not in missing and not installed[n].held]
    if not missing and not unheld:
        desc = ", ".join(f"{n} {installed[n].version}" for n in asked)
        locked = " (as the lock pins)" if apt.pins is not None and \
            any(n in apt.pins.packages for n in asked) else ""
        return Op(op_id, (), f"= {desc}" + (" (held)" if hold else "") + locked, meta=meta)
    commands: list[str] = []
    if missing:
        if update_first:
            commands.append(apt.script(apt.update()))
        commands.append(apt.script(_install_script(missing, pin_deps, apt)))
    if hold:
        commands.append("apt-mark hold " + " ".join(q(n) for n in asked) + " >/dev/null")
    what = ", ".join(f"{n}{_shown(p)}" for n, p in missing.items())
    reason = f"+ install {what}" if missing else f"+ hold {', '.join(unheld)}"
    drift = [f"{n} {installed[n].version}" for n, p in missing.items()
             if p.startswith("=") and n in installed]
    if missing and apt.pins is not None and any(p.startswith("=") for p in missing.values()):
        reason += f" (pinned by {Path(apt.pins.lock).name}" + (
            f"; the node has {', '.join(drift)})" if drift else ")")
    return change(op_id, reason, *commands, timeout=1800, meta=meta)


def _shown(pattern: str) -> str:
    """How a version pattern reads after a package name: =1.36.2-1.1, =*+cuda13.0, =1.36.*."""
    if pattern.startswith(("=", "*")):
        return pattern if pattern.startswith("=") else "=" + pattern
    return f"={pattern}*" if pattern else ""


def purge_script(names: Sequence[str], apt: Apt = DEFAULT_APT) -> str:
    """Unhold and purge ``names`` (with the dependencies only they needed)."""
    words = " ".join(q(n) for n in names)
    return apt.script(f"apt-mark unhold {words} >/dev/null 2>&1; "
                      f"{apt.cmd} purge --autoremove {words}")


#: shell helpers: r NAME PREFIX -> newest version of NAME starting with PREFIX;
#: d NAME VERSION -> "dep=VERSION" for each dependency of NAME=VERSION pinned with (= VERSION)
RESOLVE_HELPERS = (
    # the newest version (madison lists newest first) that starts with $2, or that ends with
    # what follows a leading "*" ("*+cuda13.0": NVIDIA's libnccl2 built for CUDA 13.0)
    "r() { apt-cache madison \"$1\" 2>/dev/null | awk -v p=\"$2\" "
    "'{ if (substr(p, 1, 1) == \"*\") { s = substr(p, 2); n = length($3) - length(s) + 1; "
    "ok = n >= 1 && substr($3, n) == s } else ok = index($3, p) == 1; "
    "if (ok) { print $3; exit } }'; }\n"
    "d() { apt-cache show \"$1=$2\" 2>/dev/null | sed -n 's/^Depends: //p' | tr ',' '\\n' | "
    "sed -n \"s/^ *\\([^ (]*\\) (= $2).*/\\1=$2/p\"; }\n")


def _install_script(missing: Mapping[str, str], pin_deps: bool, apt: Apt) -> str:
    """Resolve version prefixes on the host (refreshing stale package lists once), then one
    apt-get install of everything."""
    lines = [RESOLVE_HELPERS]
    pinned = {n: p for n, p in missing.items() if p and not p.startswith("=")}
    var = {n: f"v{i}" for i, n in enumerate(pinned)}
    if pinned:
        resolve = "; ".join(f"{var[n]}=$(r {q(n)} {q(p)})" for n, p in pinned.items())
        empty = " || ".join(f'[ -z "${var[n]}" ]' for n in pinned)
        lines.append(f"{resolve}\nif {empty}; then {apt.update()}; {resolve}; fi")
        for n, p in pinned.items():
            # name and prefix may come from a node (the installed driver's version): data
            lines.append(f'[ -n "${var[n]}" ] || {{ printf \'no %s version matching "%s" in '
                         f"the configured apt sources\\n' {q(n)} {q(p)} >&2; exit 100; }}")
    specs = []
    for name, pattern in missing.items():
        if pattern.startswith("="):  # a lock's pin: that version, its pinned needs listed too
            specs.append(f"{q(name)}={q(pattern[1:])}")
        elif name in pinned:
            specs.append(f"{q(name)}=\"${var[name]}\"")
            if pin_deps:
                specs.append(f"$(d {q(name)} \"${var[name]}\")")
        else:
            specs.append(q(name))
    install = (f"{apt.cmd} install --allow-change-held-packages --allow-downgrades "
               + " ".join(specs))
    # stale or missing package lists (a fresh box): refresh them once and try again; but a
    # dpkg lock still held after apt_lock_timeout is one clear error naming its holder
    lines.append(
        f'o=$(mktemp); rc=0; {install} >"$o" 2>&1 || rc=$?; cat "$o"\n'
        'if [ $rc -ne 0 ] && grep -q "frontend lock\\|Could not get lock" "$o"; then\n'
        "  h=$(sed -n 's/.*held by process \\([0-9]* ([^)]*)\\).*/\\1/p' \"$o\" | tail -n 1)\n"
        '  rm -f "$o"; echo "gpuk8s: error: the dpkg lock was still held after '
        f'apt_lock_timeout={int(apt.lock_timeout)} s, by process '
        '${h:-(unknown: it has exited since)}; let it '
        'finish (unattended-upgrades?) or raise apt_lock_timeout, then run again"; exit 100\n'
        'fi; rm -f "$o"\n'
        # explicit: under set -e, a failure inside `a || { b && c; }` would pass unnoticed
        "if [ $rc -ne 0 ]; then\n  echo 'gpuk8s: apt-get update, then retry'\n"
        f"  {apt.update()} || exit $?\n  {install} || exit $?\nfi")
    return "\n".join(lines)
