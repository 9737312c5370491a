"""What ``invoke bundle`` packs of a checkout: its committed files, never secrets.

From a git checkout, HEAD's blobs (never the working tree); from a bundle's own checkout (no
.git), the files its BUNDLE-FILES.sha256 lists, unchanged; anything else is refused. Edits not
committed and untracked files are left out and named; artifacts/ and run folders, private keys
and kubeconfigs are never packed, even when committed (review 2, M2).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuk8s.errors import BundleError
from gpuk8s.report import untrusted

#: folders of a bundle's checkout that are not named as left out (they are never packed)
_JUNK = {".git", ".venv", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "runs",
         "dist", "build"}
#: the manifest a bundle's checkout carries: sha256sum lines of every file it was packed with;
#: a bundle made from that checkout (which has no .git) packs exactly these files, unchanged
MANIFEST = "BUNDLE-FILES.sha256"
#: folders never packed, at any depth, even when committed: admin.conf goes to
#: <inventory dir>/artifacts/, run logs to runs/<time>-<command>/
_SECRET_DIRS = {"artifacts", "runs", ".ssh"}
_RUN_FOLDER = re.compile(r"\d{8}-\d{6}-.+")
#: file names never packed: kubeconfigs, private keys and certificates, SSH keys, password files
_SECRET_NAME = re.compile(
    r"admin\.conf|kubeconfig|.+\.kubeconfig|.+\.(pem|key|p12|pfx|jks|keystore)|"
    r"id_(rsa|dsa|ecdsa|ed25519)(_sk)?|.*(become_pass|vault_pass|\.netrc).*", re.I)
#: file content never packed: a PEM/OpenSSH/PGP private key, a kubeconfig's client key
_SECRET_TEXT = re.compile(rb"^-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|"
                          rb"^[ \t]*client-key-data:[ \t]*[A-Za-z0-9+/=]{8}", re.M)
#: files a bundle cannot do without: when one of them changed in a bundle's checkout, bundling
#: from there is refused rather than leaving it out
_ESSENTIAL = ("gpuk8s/", "roles/", "templates/", "tasks.py", "pyproject.toml")


def withheld_reason(path: str, content: bytes) -> str | None:
    """Why ``path`` is never packed, even when committed, or None: a run folder, an artifacts
    folder (kubeconfigs), a private key, a kubeconfig, a password file."""
    parts = path.split("/")
    for part in parts[:-1]:
        if part in _SECRET_DIRS:
            return f"in a {part}/ folder"
        if _RUN_FOLDER.fullmatch(part):
            return "in a run folder"
    if _SECRET_NAME.fullmatch(parts[-1]):
        return "a key, kubeconfig or password file by its name"
    m = _SECRET_TEXT.search(content)
    if m:
        return ("holds a kubeconfig client key" if b"client-key-data" in m[0]
                else "holds a private key")
    return None


@dataclass
class Source:
    """The checkout as a bundle packs it.

    Attributes:
        files: path -> (content, executable) of every file packed.
        origin: where they come from ("commit 1a2b3c4 (HEAD)", "BUNDLE-FILES.sha256").
        changed: files whose content here differs from ``origin`` (edited, deleted): the
            committed version is packed (from git) or the file is left out (from a manifest).
        untracked: files not in ``origin``: left out.
        withheld: path -> why it is never packed, even when committed.
    """

    files: dict[str, tuple[bytes, bool]]
    origin: str
    changed: list[str]
    untracked: list[str]
    withheld: dict[str, str]


def _git(root: Path, *args: str, stdin: bytes | None = None) -> bytes:
    try:
        proc = subprocess.run(["git", "-C", str(root), *args], input=stdin, capture_output=True,
                              check=False)
    except OSError as exc:
        raise BundleError(f"{root} is a git checkout, but git cannot run ({exc})",
                          fix="install git (apt-get install git): a bundle packs the committed "
                              "files, which git lists") from None
    if proc.returncode:
        err = proc.stderr.decode(errors="replace").strip()
        raise BundleError(f"git {' '.join(args[:3])} failed in {root}: {untrusted(err)}",
                          fix="make `git -C ROOT status` work there (git's message above "
                              "says why it does not), then bundle again".replace("ROOT",
                                                                                str(root)))
    return proc.stdout


def _z(out: bytes) -> list[str]:
    return [n for n in out.decode("utf-8", errors="surrogateescape").split("\0") if n]


def _from_git(root: Path) -> Source:
    """HEAD's files, read from git's objects (never the working tree)."""
    try:
        head = _git(root, "rev-parse", "--verify", "HEAD^{commit}").decode().strip()
    except BundleError:
        raise BundleError(f"{root} is a git checkout without a commit: a bundle packs the "
                          "committed files", fix="commit first (git add ... && git commit), "
                          "then bundle again") from None
    top = Path(_git(root, "rev-parse", "--show-toplevel").decode().strip())
    if top.resolve() != root.resolve():
        raise BundleError(f"{root} is not the top of its git checkout ({top} is)",
                          fix=f"bundle from {top}")
    entries = []
    for line in _git(root, "ls-tree", "-r", "-z", "--full-tree", head).split(b"\0"):
        if line:
            meta, _, name = line.partition(b"\t")
            mode, kind, oid = meta.decode().split()
            entries.append((mode, kind, oid, name.decode("utf-8", errors="surrogateescape")))
    blobs = [e for e in entries if e[0] in ("100644", "100755")]
    data = _git(root, "cat-file", "--batch", stdin="".join(f"{e[2]}\n" for e in blobs).encode())
    files: dict[str, tuple[bytes, bool]] = {}
    withheld: dict[str, str] = {}
    at = 0
    for mode, _kind, oid, path in blobs:
        end = data.index(b"\n", at)
        got, _, size = data[at:end].decode().split()
        if got != oid:
            raise BundleError(f"git cat-file answered {got} for {oid} ({path})",
                              fix="run `git fsck` in the checkout")
        content = data[end + 1:end + 1 + int(size)]
        at = end + 2 + int(size)
        files[path] = (content, mode == "100755")
    for mode, _kind, _oid, path in entries:
        if mode not in ("100644", "100755"):
            withheld[path] = "a symlink" if mode == "120000" else "a submodule"
    diff = _z(_git(root, "diff", "--name-only", "-z", "--no-renames", head, "--"))
    committed = {e[3] for e in entries}
    changed = [p for p in diff if p in committed]
    untracked = [p for p in diff if p not in committed]  # staged, never committed
    untracked += _z(_git(root, "ls-files", "-z", "--others", "--exclude-standard"))
    return Source(files, f"commit {head[:12]} (HEAD)", changed, untracked, withheld)


def _from_manifest(root: Path) -> Source:
    """A bundle's checkout (no .git): the files its BUNDLE-FILES.sha256 lists, as they were
    packed; a file changed since, or new, is left out."""
    files: dict[str, tuple[bytes, bool]] = {}
    changed: list[str] = []
    listed: set[str] = {MANIFEST}
    for n, line in enumerate((root / MANIFEST).read_text(errors="replace").splitlines(), 1):
        m = re.fullmatch(r"([0-9a-f]{64}) [ *](.+)", line)
        if not m or m[2].startswith("/") or ".." in m[2].split("/"):
            raise BundleError(f"{root / MANIFEST}, line {n}: not a sha256sum line of a file "
                              f"in the checkout: {untrusted(line)[:120]!r}",
                              fix="use the BUNDLE-FILES.sha256 the bundle came with, or bundle "
                                  "from a git checkout of gpuk8s")
        rel = m[2]
        listed.add(rel)
        try:
            content, executable = _read_regular(root / rel)
        except OSError:
            changed.append(rel)  # deleted, replaced by a symlink or a folder, unreadable
            continue
        if hashlib.sha256(content).hexdigest() != m[1]:
            changed.append(rel)
            continue
        files[rel] = (content, executable)
    untracked = [str(p.relative_to(root)) for p in sorted(root.rglob("*"))
                 if str(p.relative_to(root)) not in listed and not p.is_dir()
                 and not (_JUNK & set(p.relative_to(root).parts) or ".egg-info" in str(p))]
    essential = [c for c in changed if c.startswith(_ESSENTIAL)]
    if essential:
        shown = ", ".join(untrusted(c) for c in essential[:5])
        raise BundleError(
            f"{root} is a bundle's checkout whose own files changed since it was made: {shown}; "
            "a bundle made from it packs only the files as they were shipped, and gpuk8s "
            "cannot run without these",
            fix=f"restore them from the original bundle (sha256sum -c {MANIFEST} lists what "
                "changed), or bundle from a git checkout of gpuk8s, with your changes "
                "committed")
    return Source(files, MANIFEST, changed, untracked, {})


def _read_regular(path: Path) -> tuple[bytes, bool]:
    """A regular file's content and whether it is executable; never through a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        return fh.read(), bool(st.st_mode & 0o100)


def source_files(root: Path, skip: Path | None = None) -> Source:
    """What a bundle packs of the checkout at ``root``: the committed files (from git's HEAD,
    never the working tree), or in a bundle's own checkout (no .git) the files its
    BUNDLE-FILES.sha256 lists, unchanged. Everything else is left out and named: edits not
    committed, untracked files (an inventory with passwords dropped in the checkout must not
    travel in a bundle unasked), and, even when committed, run folders, artifacts/ folders
    (admin.conf), private keys and kubeconfigs. A folder that is neither is refused."""
    if (root / ".git").exists():
        source = _from_git(root)
    elif (root / MANIFEST).is_file():
        source = _from_manifest(root)
    else:
        raise BundleError(
            f"{root} is neither a git checkout nor a bundle's checkout (no .git, no "
            f"{MANIFEST}): what in it is gpuk8s's and what is yours (inventories, admin.conf "
            "in artifacts/, run logs) cannot be told apart",
            fix="bundle from a git clone of gpuk8s (commit what the bundle should carry), or "
                f"from the gpuk8s-<version>/ folder of a bundle (its {MANIFEST} lists what it "
                "shipped with)")
    skip_dir = None
    if skip is not None and not root.absolute().is_relative_to(skip.absolute()):
        skip_dir = skip.absolute()
    for rel in list(source.files):
        why = withheld_reason(rel, source.files[rel][0])
        if why is None and any(part.startswith("gpuk8s-bundle-") for part in rel.split("/")):
            why = "a bundle"
        if why is None and skip_dir and (root / rel).absolute().is_relative_to(skip_dir):
            why = "in the bundle's output folder"
        if why:
            source.withheld[rel] = why
            del source.files[rel]
    return source


def _names(paths: Sequence[str], limit: int = 6) -> str:
    shown = ", ".join(untrusted(p) for p in paths[:limit])
    return shown + (f", ... ({len(paths) - limit} more)" if len(paths) > limit else "")


def left_out(source: Source) -> list[str]:
    """The summary's lines naming what the bundle does not carry, and why."""
    lines = []
    if source.changed and source.origin == MANIFEST:
        lines.append(f"    left out, changed since the bundle was made (not as {MANIFEST} "
                     f"lists them): {len(source.changed)} file(s): {_names(source.changed)}")
    elif source.changed:
        lines.append(f"    uncommitted changes left out (packed as in {source.origin}): "
                     f"{len(source.changed)} file(s): {_names(source.changed)}")
    if source.untracked:
        lines.append(f"    left out, not in {source.origin}: {len(source.untracked)} file(s): "
                     f"{_names(source.untracked)}")
    if source.withheld:
        lines.append(f"    never packed, even when committed (keys, kubeconfigs, artifacts/ "
                     f"and run folders): {len(source.withheld)} file(s): "
                     + _names([f"{p} ({why})" for p, why in source.withheld.items()]))
    if lines:
        lines.append("    (commit what the bundle should carry; secrets stay out in any case)")
    return lines


