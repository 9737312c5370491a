"""Files: the state of files on a host (mode, owner, sha256, content), read for every Files
fact of a probe at once by one shared read (FileReads): one ``stat`` and one ``sha256sum``
for all of them, instead of two or three processes per path."""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass

from gpuk8s.facts import Fact, Source
from gpuk8s.sinks import shell

#: what a probed path may not hold: the shared read's lines are split on newlines, and
#: sha256sum escapes a name with a backslash (gpuk8s's own paths never have these)
_ODD_PATH = re.compile(r"[\n\r\\]")
#: the shared read's newline (its loop cuts stat's and sha256sum's output line by line)
_NL = "_gk_nl='\n'"


@dataclass(frozen=True)
class FileState:
    """One path: existence, mode (octal string), owner, sha256 and (if asked) content."""

    path: str
    exists: bool
    mode: str = ""
    owner: str = ""
    sha256: str = ""
    content: bytes | None = None
    #: last modification (Unix time) of a file whose content was probed; 0: not known
    mtime: int = 0

    @property
    def text(self) -> str | None:
        return None if self.content is None else self.content.decode(errors="replace")


def tag(path: str) -> str:
    """The fixed word that starts a path's lines in the shared read."""
    return "@" + hashlib.sha256(path.encode()).hexdigest()[:16]


def _paths(args: tuple[str, ...]) -> dict[str, tuple[bool, bool]]:
    """Each path of ``args`` once, first seen first: (its sha256 is asked, its content is)."""
    out: dict[str, tuple[bool, bool]] = {}
    for arg in args:
        path = arg.removeprefix("+")
        if not path or _ODD_PATH.search(path):
            raise ValueError(f"Files: {path!r} is not a path the probe reads (no newline "
                             "or backslash)")
        sha, content = out.get(path, (False, False))
        out[path] = (sha or not arg.startswith("+"), content or arg.startswith("+"))
    return out


class FileReads(Source):
    """The files of a probe's Files facts (args as theirs: a path, or ``+path`` for its
    content too), read at once: one ``stat`` of every path that exists, one ``sha256sum`` of
    every regular file whose hash is asked, a ``base64`` per file whose content is. It leaves
    in $_gk_files the lines each Files fact prints for its own paths: ``N <path>`` (absent),
    ``F <path> <mode> <owner> <sha256>``, ``P <path> <mode> <owner> <mtime>`` then
    ``C <path> <base64>``. ``stat`` reads a symlink itself, ``[ -e ]`` and the readers follow
    it, as the Files command of before did. A ``stat`` that fails (a path gone since it was
    seen) is asked again path by path, and so is one whose line is not next (each line
    ends with its path)."""

    def command(self) -> str:
        paths = _paths(self.args)
        words = " ".join(shell(p) for p in paths)
        hashed = " ".join(shell(p) for p, (sha, _) in paths.items() if sha)
        # each path's lines start with its tag (fixed, from the path), so that a Files fact
        # finds them whatever other paths begin like it
        tags = [f"  {shell(p)}) g={tag(p)} w={'s' * sha}{'c' * content};;"
                for p, (sha, content) in paths.items()]
        sums = "sums="
        if hashed:
            sums = (f"sums=$(set --; for f in {hashed}; do\n"
                    '  [ -f "$f" ] && [ -r "$f" ] && set -- "$@" "$f"; done\n'
                    '  [ $# -eq 0 ] || sha256sum -- "$@" 2>/dev/null)')
        return "\n".join([
            "_gk_files=$(" + _NL,
            "set --",
            f'for f in {words}; do [ -e "$f" ] && set -- "$@" "$f"; done',
            """st=; [ $# -eq 0 ] || st=$(stat -c '%a %U %Y %n' -- "$@" 2>/dev/null) || st=""",
            sums,
            f"for f in {words}; do",
            "case $f in",
            *tags,
            "esac",
            """[ -e "$f" ] || { printf '%s N %s\\n' "$g" "$f"; continue; }""",
            # stat's next line is this path's when it ends with its name (a path that came or
            # went since the first loop is asked alone, and never takes another's line)
            's=; case ${st%%"$_gk_nl"*} in *" $f") s=${st%%"$_gk_nl"*}; s=${s%" $f"}',
            '  case $st in *"$_gk_nl"*) st=${st#*"$_gk_nl"};; *) st=;; esac;; esac',
            """[ -n "$s" ] || s=$(stat -c '%a %U %Y' -- "$f" 2>/dev/null)""",
            "m=${s% *}; t=${s##* }",
            # sha256sum's next line is this file's when it ends with its name (it printed
            # none for a file it could not read)
            'case $w in *s*) h=; case ${sums%%"$_gk_nl"*} in *"  $f")',
            '    h=${sums%%"$_gk_nl"*}; h=${h%% *}',
            '    case $sums in *"$_gk_nl"*) sums=${sums#*"$_gk_nl"};; *) sums=;; esac;; esac',
            """  printf '%s F %s %s %s\\n' "$g" "$f" "$m" "$h";; esac""",
            """case $w in *c*) printf '%s P %s %s %s\\n' "$g" "$f" "$m" "$t\"""",
            """  printf '%s C %s %s\\n' "$g" "$f" "$(base64 -w0 < "$f")";; esac""",
            "done)"])

    def ready(self) -> str:
        return '[ -n "${_gk_files+x}" ]'


class Files(Fact[dict[str, FileState]]):
    """State of files; args are paths, a path prefixed with ``+`` also returns its content.
    Read through FileReads, one read for every Files fact of a probe."""

    def sources(self) -> tuple[Source, ...]:
        return (FileReads(*self.args),)

    def command(self) -> str:
        # one sed over the shared read picks this fact's lines by their tags (fixed hex
        # words, never a path), and only the kinds it asked for: N and F for a path, N, P and
        # C for a +path. (Shell pattern cuts of the whole read were quadratic: 200 ms a fact.)
        picks = []
        for arg in self.args:
            kinds = "NPC" if arg.startswith("+") else "NF"
            picks.append(f"s/^{tag(arg.removeprefix('+'))} \\([{kinds}]\\) /\\1 /p")
        return "\n".join([self.sources()[0].ensure(),
                          f"printf '%s\\n' \"$_gk_files\" | sed -n {shell(';'.join(picks))}"])

    def parse(self, output: str, exit_code: int) -> dict[str, FileState]:
        states: dict[str, FileState] = {}
        contents: dict[str, bytes] = {}
        mtimes: dict[str, int] = {}
        for line in output.splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "F":
                path, mode, owner, sha = rest.rsplit(" ", 3)
                states[path] = FileState(path, True, mode, owner, sha)
            elif kind == "P":  # a file whose content follows: mode, owner, mtime
                path, mode, owner, stamp = rest.rsplit(" ", 3)
                states[path] = FileState(path, True, mode, owner)
                if stamp.isdigit():
                    mtimes[path] = int(stamp)
            elif kind == "N":
                states[rest] = FileState(rest, False)
            elif kind == "T":
                path, _, stamp = rest.rpartition(" ")
                if path and stamp.isdigit():
                    mtimes[path] = int(stamp)
            elif kind == "C":
                path, _, encoded = rest.rpartition(" ")
                if not path:
                    path, encoded = encoded, ""
                contents[path] = base64.b64decode(encoded)
        for path, raw in contents.items():
            old = states[path]
            states[path] = FileState(old.path, old.exists, old.mode, old.owner,
                                     old.sha256 or hashlib.sha256(raw).hexdigest(), raw,
                                     mtimes.get(path, 0))
        return states
