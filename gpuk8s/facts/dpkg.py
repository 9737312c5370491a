"""Facts about Debian packages: installed versions and holds, every Packages fact of a probe
read with one ``dpkg-query`` (gpuk8s.facts.system re-exports these names), and dpkg's own
health."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpuk8s.facts import Fact, Source
from gpuk8s.sinks import shell

#: a Debian package name (Policy 5.6.1), with the architecture dpkg-query adds to some
PACKAGE_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+(:[a-z0-9-]+)?")


@dataclass(frozen=True)
class PackageState:
    version: str
    held: bool
    status: str  # dpkg's two-letter abbreviation, "ii" when installed and configured


#: what dpkg-query prints of a package: a line ``<name> <version> <abbrev> <want> ok <status>``
_DPKG_LINE = "-f='${Package} ${Version} ${db:Status-Abbrev} ${Status}\\n'"


class DpkgPackages(Source):
    """One ``dpkg-query -W`` for every package a probe's Packages facts name (each run parses
    all of dpkg's status file, and a probe has a dozen such facts): its lines in $_gk_dpkg."""

    def command(self) -> str:
        names = " ".join(shell(a) for a in self.args)
        return f"_gk_dpkg=$(dpkg-query -W {_DPKG_LINE} {names} 2>/dev/null)"

    def ready(self) -> str:
        return '[ -n "${_gk_dpkg+x}" ]'


class Packages(Fact[dict[str, PackageState]]):
    """Installed Debian packages among the args (absent ones missing), with hold state, as
    DpkgPackages reads them for every Packages fact of a probe at once. A name with a glob
    character would match other packages: such a fact runs dpkg-query on its own."""

    def _shared(self) -> bool:
        return not any(c in a for a in self.args for c in "*?[]")

    def sources(self) -> tuple[Source, ...]:
        return (DpkgPackages(*self.args),) if self._shared() else ()

    def command(self) -> str:
        if not self._shared():
            names = " ".join(shell(a) for a in self.args)
            return f"dpkg-query -W {_DPKG_LINE} {names} 2>/dev/null; true"
        # this fact's lines of the shared read
        return self.sources()[0].ensure() + '\nprintf \'%s\\n\' "$_gk_dpkg" | ' + \
            "while read -r p rest; do case $p in " + "|".join(shell(a) for a in self.args) + \
            ") printf '%s %s\\n' \"$p\" \"$rest\";; esac; done"

    def parse(self, output: str, exit_code: int) -> dict[str, PackageState]:
        result = {}
        for line in output.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[2].startswith(("ii", "hi")):
                result[parts[0]] = PackageState(parts[1], parts[3] == "hold"
                                                if len(parts) > 3 else False, parts[2])
        return result


class DpkgHealth(Fact[dict[str, Any]]):
    """Interrupted dpkg runs (``dpkg --audit``, or journal entries dpkg left in
    /var/lib/dpkg/updates, which apt refuses to run with), the packages such a run left to be
    reinstalled (half-installed, or flagged reinst-required: dpkg killed inside an unpack;
    ``dpkg --configure -a`` cannot mend those, and apt refuses to run until they are
    reinstalled), and the processes holding the dpkg frontend lock (from /proc/locks: no
    fuser needed), as ``["1234 (unattended-upgr)"]``."""

    def command(self) -> str:
        return r"""a=$(dpkg --audit 2>/dev/null | head -n 5); echo "audit=$(echo "$a" | tr '\n' ' ')"
echo "journal=$(ls /var/lib/dpkg/updates 2>/dev/null | grep -c '^[0-9][0-9]*$')"
dpkg-query -W -f='${db:Status-Abbrev}|${binary:Package}\n' 2>/dev/null | awk -F'|' 'substr($1, 2, 1) == "H" || substr($1, 3, 1) == "R" {print "reinstall=" $2}'
i=$(stat -c %i /var/lib/dpkg/lock-frontend 2>/dev/null)
if [ -n "$i" ]; then
  for p in $(awk -v i=":$i" '$2 != "->" && $5 > 0 && substr($6, length($6) - length(i) + 1) == i {print $5}' /proc/locks 2>/dev/null | sort -un); do
    echo "lock=$p $(cat /proc/$p/comm 2>/dev/null)"; done
fi; true"""

    def parse(self, output: str, exit_code: int) -> dict[str, Any]:
        pairs = [line.split("=", 1) for line in output.splitlines() if "=" in line]
        kv = dict(pairs)
        holders, reinstall = [], []
        for key, value in pairs:
            if key == "lock" and value.split():
                pid, _, name = value.strip().partition(" ")
                holders.append(f"{pid} ({name.strip() or '?'})")
            elif key == "reinstall" and PACKAGE_NAME.fullmatch(value.strip()):
                reinstall.append(value.strip())
        journal = kv.get("journal", "0").strip()
        return {"interrupted": bool(kv.get("audit", "").strip())
                or (journal.isdigit() and int(journal) > 0) or bool(reinstall),
                "reinstall": reinstall, "lock_holders": holders}


#: where an op that notifies a handler leaves a marker (written before its change) until the
#: handler has run: a run killed in between leaves the handler to the next run


#: an apt source file the node's own OS sources may live in (Debian's sources.list, Ubuntu
#: 24.04's sources.list.d/ubuntu.sources, anything else an admin dropped in sources.list.d)
_SOURCE_FILE = re.compile(r"/etc/apt/sources\.list(\.d/[A-Za-z0-9_.:-]+\.(list|sources))?")
#: the suffix gpuk8s gives the node's own source files while apt_os_mirror_url replaces them
SOURCES_OFF = ".gpuk8s-off"


class AptOsSources(Fact[tuple[tuple[str, ...], tuple[str, ...]]]):
    """(active, set aside): the node's own apt source files, i.e. those whose first line is not
    gpuk8s's marker, and those gpuk8s set aside (``<file>.gpuk8s-off``) while the inventory's
    apt_os_mirror_url stands in for them. Other paths are never listed."""

    def command(self) -> str:
        return (f"for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list "
                f"/etc/apt/sources.list.d/*.sources; do [ -f \"$f\" ] || continue; "
                f"head -n 1 \"$f\" | grep -q '^# managed by gpuk8s' || echo \"A $f\"; done; "
                f"for f in /etc/apt/sources.list{SOURCES_OFF} "
                f"/etc/apt/sources.list.d/*{SOURCES_OFF}; do [ -f \"$f\" ] && echo \"D $f\"; "
                "done; true")

    def parse(self, output: str, exit_code: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        active, off = [], []
        for line in output.splitlines():
            kind, _, path = line.partition(" ")
            if kind == "A" and _SOURCE_FILE.fullmatch(path):
                active.append(path)
            elif kind == "D" and path.endswith(SOURCES_OFF) and \
                    _SOURCE_FILE.fullmatch(path.removesuffix(SOURCES_OFF)):
                off.append(path)
        return tuple(sorted(active)), tuple(sorted(off))
