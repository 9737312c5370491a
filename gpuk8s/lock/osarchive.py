"""The OS archive's part of a lock: which Debian/Ubuntu archive packages a node would download
to install what the roles ask for, found by the node's own apt (its real resolver: alternatives,
Provides, Recommends as the node's apt.conf says), without changing the node.

On each host, in a scratch folder that is removed afterwards: apt's state is private (its own
lists, cache and sources: the node's OS sources, never the lists gpuk8s manages, plus gpuk8s's
sources with the keys the lock checked), and dpkg's status is the node's *minimal* part (the
packages of priority required or important, and what they need), so that the lock also covers
what an already bootstrapped node has installed (a reprovisioned one needs it again). Then
``apt-get install --print-uris`` prints every .deb it would fetch, with its SHA256 from the
signed indexes (apt-get(8)); nothing is downloaded or installed.
"""

from __future__ import annotations

import base64
import gzip
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuk8s.lock.aptindex import LockError, Source, stanzas
from gpuk8s.lock.debversion import parse_relations
from gpuk8s.ops.apt import RESOLVE_HELPERS, source_line
from gpuk8s.sinks import shell as q

#: the first line of every apt source file gpuk8s writes (ops.apt.repo)
MANAGED = "# managed by gpuk8s"
#: reads the node's dpkg status (gzip, base64: one line in the run log)
READ_STATUS = "gzip -c /var/lib/dpkg/status | base64 -w0"


def minimal_status(status: str) -> str:
    """The installed packages of priority required or important (or Essential) and every
    installed package they depend on: a dpkg status file of the node as a minimal install of
    its release would be, consistent (no unmet dependency), for apt to resolve against."""
    paragraphs = [p for p in status.split("\n\n") if p.strip()]
    installed: dict[str, tuple[dict[str, str], str]] = {}
    provides: dict[str, list[str]] = {}
    for raw in paragraphs:
        fields = next(stanzas(raw), {})
        if not fields.get("Status", "").endswith(" installed") or "Package" not in fields:
            continue
        installed[fields["Package"]] = (fields, raw)
        for group in parse_relations(fields.get("Provides", "")):
            provides.setdefault(group[0][0], []).append(fields["Package"])
    keep = [n for n, (f, _) in installed.items()
            if f.get("Priority") in ("required", "important") or f.get("Essential") == "yes"]
    seen = set(keep)
    while keep:
        fields = installed[keep.pop()][0]
        deps = ", ".join(v for v in (fields.get("Pre-Depends", ""), fields.get("Depends", ""))
                         if v)
        for group in parse_relations(deps):
            found = [n for alt in group for n in ([alt[0]] if alt[0] in installed else [])
                     + provides.get(alt[0], [])]
            if not found or any(n in seen for n in found):
                continue
            seen.add(found[0])
            keep.append(found[0])
    return "".join(installed[n][1].strip("\n") + "\n\n" for n in sorted(seen))


@dataclass(frozen=True)
class Fetched:
    """One .deb apt would fetch: what --print-uris says."""

    name: str
    version: str
    url: str
    size: int
    sha256: str

    def as_dict(self) -> dict[str, object]:
        return {"version": self.version, "url": self.url, "size": self.size,
                "sha256": self.sha256}


def parse_print_uris(text: str) -> list[Fetched]:
    """resolve_script's output: ``'URI' FILE SIZE [HASH]`` lines (apt-get --print-uris), then
    after ``--- records`` each package's index record (apt-cache show), whose SHA256 is the
    one taken; a package apt would fetch without a SHA256 in its index is an error."""
    uris, _, records = text.partition("--- records")
    sha = {(r.get("Package"), r.get("Version")): r.get("SHA256", "") for r in stanzas(records)}
    out = []
    for line in uris.splitlines():
        parts = line.split()
        if len(parts) < 3 or not parts[0].startswith("'") or not parts[2].isdigit():
            continue
        url = parts[0].strip("'")
        name, version, _ = urllib.parse.unquote(parts[1]).rsplit(".deb", 1)[0].split("_", 2)
        digest = sha.get((name, version), "")
        if not digest:
            raise LockError(f"{name} {version} ({url}): its index record has no SHA256; the "
                            "lock cannot pin it")
        out.append(Fetched(name, version, url, int(parts[2]), digest))
    return out


def resolve_script(sources: Sequence[tuple[Source, bytes]], status: str,
                   wanted: Mapping[str, str], pinned: Mapping[str, str]) -> str:
    """The node-side script: private apt state, the OS archive's sources and gpuk8s's (each
    with its checked key), the minimal status; then ``apt-get install --print-uris`` of the
    pinned packages at their versions and the OS archive's wanted ones (a version pattern
    resolved like ops.apt's, newest match first)."""
    lines = [
        "t=$(mktemp -d /tmp/gpuk8s-lock.XXXXXX) || exit 1; trap 'rm -rf \"$t\"' EXIT",
        'mkdir -p "$t/lists/partial" "$t/archives/partial" "$t/parts" "$t/keys"',
        # the node's OS sources: every file but the ones gpuk8s manages
        '[ -f /etc/apt/sources.list ] && cp /etc/apt/sources.list "$t/sources.list" || '
        ': > "$t/sources.list"',
        'for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do '
        '[ -f "$f" ] || continue; head -n 1 "$f" | grep -q ' + q("^" + MANAGED) + ' && '
        'continue; cp "$f" "$t/parts/"; done',
        f'printf %s {q(base64.b64encode(gzip.compress(status.encode(), mtime=0)).decode())} '
        '| base64 -d | gunzip > "$t/status"',
    ]
    for source, keyring in sources:
        key = f"$t/keys/{source.name}.gpg"
        lines.append(f'printf %s {q(base64.b64encode(keyring).decode())} | base64 -d > '
                     f'"{key}"')
        line = source_line(source.url, source.suite, source.components, "KEYRING").rstrip()
        before, _, after = line.partition("KEYRING")
        lines.append(f'printf "%s%s%s\\n" {q(before)} "{key}" {q(after)} >> "$t/sources.list"')
    opts = ('-o Dir::State::Lists="$t/lists" -o Dir::Etc::sourcelist="$t/sources.list" '
            '-o Dir::Etc::sourceparts="$t/parts" -o Dir::Cache::archives="$t/archives" '
            '-o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= '
            '-o Dir::State::status="$t/status" -o Debug::NoLocking=1 '
            '-o APT::Sandbox::User=root')
    lines.append(f"o=$(apt-get -q {opts} update 2>&1) || {{ printf '%s\\n' \"$o\" >&2; "
                 "exit 1; }")
    lines.append(RESOLVE_HELPERS.replace("apt-cache madison", f"apt-cache {opts} madison")
                 .replace("apt-cache show", f"apt-cache {opts} show"))
    specs = [f"{q(n)}={q(v)}" for n, v in sorted(pinned.items())]
    for i, (name, pattern) in enumerate(sorted(wanted.items())):
        if not pattern:
            specs.append(q(name))
            continue
        lines.append(f"v{i}=$(r {q(name)} {q(pattern)}); [ -n \"$v{i}\" ] || {{ printf "
                     f"'no %s version matching \"%s\" in the sources\\n' {q(name)} "
                     f"{q(pattern)} >&2; exit 1; }}")
        specs.append(f'{q(name)}="$v{i}"')
    # --print-uris gives the URI and size, but its hash is the index's first (MD5Sum on apt
    # 2.6, none for an index without MD5): each package's SHA256 comes from apt-cache show
    lines.append(f'apt-get -qq {opts} install --print-uris {" ".join(specs)} > "$t/uris" || '
                 'exit 1')
    lines.append('cat "$t/uris"; echo "--- records"')
    lines.append("sed -n \"s/^'[^']*' \\([^_ ]*\\)_\\([^_ ]*\\)_.*/\\1=\\2/p\" "
                 '"$t/uris" | sed "s/%3a/:/g" | xargs -r apt-cache ' + opts + " show")
    return "\n".join(lines)

