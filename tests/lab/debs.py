"""Build lab .deb packages from YAML package definitions (test infrastructure, never shipped).

Schema of one definition file (tests/lab/packages/<group>/<name>.yaml)::

    name: kubeadm                       # @VAR@ allowed (linux-headers-@KREL@)
    versions: ["1.36.1-1.1", "1.36.2-1.1"]
    repo: pkgs.k8s.io/v1.36             # repo id, see tests/lab/repos.py REPOS
    architecture: amd64                 # or all
    depends: ["kubelet (= @VERSION@)"]  # conflicts/replaces/provides/breaks/recommends: same shape
    description: |
      first line (synopsis)
      extended text; must contain "LAB STAND-IN"
    files:
      - {src: tests/lab/standins/x/kubeadm, dest: /usr/bin/kubeadm, mode: "0755"}
      - {dest: /lib/modules/@KREL@/build, link: /usr/src/linux-headers-@KREL@}   # symlink
      - {fetched: containerd, path: usr/bin/ctr, dest: /usr/bin/ctr, mode: "0755"}  # from a
        # real upstream .deb (see `fetch` below); never substituted
      - {pypi: kubernetes_validate, path: x/_definitions.json, dest: /usr/lib/x/defs.json}
        # one file of an installed PyPI package; never substituted
      - {pypi_tree: celpy, dest: /usr/lib/gpuk8s-lab/@PKGNAME@/celpy}  # an installed pure-
        # Python library the stand-ins import on nodes: its files but bytecode and compiled
        # extensions (the nodes run its pure-Python code); never substituted
    conffiles: [/etc/foo.conf]          # files under /etc are conffiles anyway (like dh_installdeb)
    maintainer_scripts:                 # path relative to repo root, or inline text
      {postinst: <path or text>, prerm, postrm, preinst}
    systemd_units:                      # path, or {src, dest, enable, start}
      - tests/lab/standins/x/kubelet.service
    # optional extensions:
    vars: {NVCC_BUILD: "36424714_0"}    # extra @KEY@ substitutions
    version_vars: {"13.0.2-1": {...}}   # per-version extra substitutions
    version_repos: {"580.173.02-1": lab-updates}   # a version published in another repo
    fetch: {containerd: {package: containerd, suite: unstable}}   # real debs from deb.debian.org
    version_from_fetch: "{containerd}-1~debian.12~bookworm"  # versions derived from a fetched deb

Substitutions in every packaged text file (and in names, dests, depends):
@VERSION@ (full Debian version), @UPSTREAM_VERSION@ (before the last '-'), @PKGNAME@, @KREL@
(this host's `uname -r`), plus `vars`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES_DIR = Path(__file__).resolve().parent / "packages"
BUILDER_VERSION = "3"  # bump to invalidate every cached .deb
SOURCE_DATE_EPOCH = 1767225600  # 2026-01-01T00:00:00Z: every packaged mtime
MAINTAINER = "gpuk8s lab <lab@gpuk8s.invalid>"
LIST_FIELDS = (
    "depends",
    "pre_depends",
    "recommends",
    "conflicts",
    "replaces",
    "provides",
    "breaks",
)
SCRIPT_NAMES = ("preinst", "postinst", "prerm", "postrm")
STANDIN_MARK = "LAB STAND-IN"


class PackageError(Exception):
    """A package definition is invalid or a build step failed."""


def upstream_version(version: str) -> str:
    """Debian version -> upstream part: strip the epoch and everything after the last '-'."""
    v = version.split(":", 1)[1] if ":" in version else version
    return v.rsplit("-", 1)[0] if "-" in v else v


def host_kernel_release() -> str:
    return os.uname().release


def substitute(text: str, variables: dict[str, str]) -> str:
    for key, value in variables.items():
        text = text.replace(f"@{key}@", value)
    return text


def _is_text(data: bytes) -> bool:
    if b"\0" in data[:65536]:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@dataclass
class PackageDef:
    path: Path
    raw: dict[str, Any]

    @property
    def repo(self) -> str:
        return str(self.raw["repo"])

    def versions(self, fetched: FetchResolver | None = None) -> list[str]:
        if "version_from_fetch" in self.raw:
            if fetched is None:
                raise PackageError(f"{self.path}: needs fetched upstream packages")
            fmt = str(self.raw["version_from_fetch"])
            names = re.findall(r"{(\w+)}", fmt)
            return [fmt.format(**{n: fetched.upstream_version(self, n) for n in names})]
        return [str(v) for v in self.raw["versions"]]


def load_definitions(directory: Path = PACKAGES_DIR) -> list[PackageDef]:
    defs = []
    for p in sorted(directory.rglob("*.yaml")) + sorted(directory.rglob("*.yml")):
        raw = yaml.safe_load(p.read_text())
        if not isinstance(raw, dict):
            raise PackageError(f"{p}: not a mapping")
        for key in ("name", "repo", "description"):
            if key not in raw:
                raise PackageError(f"{p}: missing {key!r}")
        if "versions" not in raw and "version_from_fetch" not in raw:
            raise PackageError(f"{p}: missing 'versions'")
        defs.append(PackageDef(p, raw))
    return defs


class FetchResolver:
    """Resolves `fetch:` entries to extracted upstream .debs (see repos.fetch_upstream_deb)."""

    def __init__(self, fetch: Callable[[str, str], Path], extract_root: Path):
        self._fetch = fetch  # (package, suite) -> path of the downloaded .deb
        self._extract_root = extract_root

    def deb(self, pkg: PackageDef, key: str) -> Path:
        spec = (pkg.raw.get("fetch") or {}).get(key)
        if not spec:
            raise PackageError(f"{pkg.path}: no fetch entry {key!r}")
        return self._fetch(str(spec.get("package", key)), str(spec["suite"]))

    def upstream_version(self, pkg: PackageDef, key: str) -> str:
        version = deb_field(self.deb(pkg, key), "Version")
        up = upstream_version(version)
        return re.sub(r"[+~](ds|dfsg)\d*$", "", up)

    def tree(self, pkg: PackageDef, key: str) -> Path:
        deb = self.deb(pkg, key)
        dest = self._extract_root / deb.stem
        if not (dest / ".extracted").exists():
            # extract beside and rename: the downloads folder is shared by concurrent builders
            # (lab sessions, test_repos), which must never see or remove a half-extracted tree
            self._extract_root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{deb.stem}.", dir=self._extract_root))
            try:
                subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp)], check=True)
                (tmp / ".extracted").write_text(deb_field(deb, "Version") + "\n")
                if not (dest / ".extracted").exists():
                    if dest.exists():
                        shutil.rmtree(dest, ignore_errors=True)
                    try:
                        tmp.rename(dest)
                    except OSError:  # another builder renamed its copy first
                        if not (dest / ".extracted").exists():
                            raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return dest


def deb_field(deb: Path, name: str) -> str:
    return subprocess.run(
        ["dpkg-deb", "-f", str(deb), name], check=True, capture_output=True, text=True
    ).stdout.strip()


@dataclass
class Entry:
    dest: str
    mode: int = 0o644
    data: bytes | None = None
    link: str | None = None


@dataclass
class BuildSpec:
    name: str
    version: str
    architecture: str
    repo: str
    control: str
    scripts: dict[str, str]
    entries: list[Entry] = field(default_factory=list)
    conffiles: list[str] = field(default_factory=list)

    @property
    def filename(self) -> str:
        v = self.version.split(":", 1)[-1]
        return f"{self.name}_{v}_{self.architecture}.deb"

    def content_hash(self) -> str:
        h = hashlib.sha256()
        h.update(f"builder {BUILDER_VERSION}\n{self.control}\n".encode())
        for name in sorted(self.scripts):
            h.update(f"script {name}\n".encode() + self.scripts[name].encode() + b"\n")
        for c in self.conffiles:
            h.update(f"conffile {c}\n".encode())
        for e in sorted(self.entries, key=lambda e: e.dest):
            if e.link is not None:
                h.update(f"link {e.dest} {e.link}\n".encode())
            else:
                digest = hashlib.sha256(e.data or b"").hexdigest()
                h.update(f"file {e.dest} {e.mode:o} {digest}\n".encode())
        return h.hexdigest()


def _read_src(src: str) -> bytes:
    p = Path(src)
    if not p.is_absolute():
        p = REPO_ROOT / p
    if not p.is_file():
        raise PackageError(f"missing source file {p}")
    return p.read_bytes()


def _read_pypi(module: str, path: str) -> bytes:
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise PackageError(f"Python package {module!r} is not installed (scripts/setup installs "
                           "the dev extras)")
    p = Path(next(iter(spec.submodule_search_locations))) / path
    if not p.is_file():
        raise PackageError(f"missing {path} in the installed {module}")
    return p.read_bytes()


def _read_pypi_tree(module: str) -> list[tuple[str, bytes]]:
    """(path under the package folder, content) of every file of an installed Python package,
    but bytecode and compiled extension modules."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise PackageError(f"Python package {module!r} is not installed (scripts/setup installs "
                           "the dev extras)")
    top = Path(next(iter(spec.submodule_search_locations)))
    out = []
    for p in sorted(top.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".so"):
            out.append((p.relative_to(top).as_posix(), p.read_bytes()))
    return out


def _script_text(value: str) -> str:
    """Maintainer script: a path relative to the repo root, or inline text."""
    if "\n" not in value.strip() and (REPO_ROOT / value).is_file():
        return (REPO_ROOT / value).read_text()
    return value


def _systemd_snippet(units: list[tuple[str, bool, bool]]) -> dict[str, str]:
    """dh_installsystemd-like maintainer snippets for (unit, enable, start)."""
    post, prerm, postrm = [], [], []
    for unit, enable, start in units:
        if enable:
            post.append(
                'if [ "$1" = "configure" ] || [ "$1" = "abort-upgrade" ]'
                ' || [ "$1" = "abort-deconfigure" ] || [ "$1" = "abort-remove" ] ; then\n'
                f"""\tif command -v deb-systemd-helper >/dev/null 2>&1; then
\t\tdeb-systemd-helper unmask '{unit}' >/dev/null || true
\t\tif [ -z "$2" ] || deb-systemd-helper --quiet was-enabled '{unit}'; then
\t\t\tdeb-systemd-helper enable '{unit}' >/dev/null || true
\t\telse
\t\t\tdeb-systemd-helper update-state '{unit}' >/dev/null || true
\t\tfi
\telse
\t\tsystemctl enable '{unit}' >/dev/null 2>&1 || true
\tfi
fi"""
            )
            postrm.append(
                f"""if [ "$1" = "purge" ] && command -v deb-systemd-helper >/dev/null 2>&1; then
\tdeb-systemd-helper purge '{unit}' >/dev/null || true
fi"""
            )
        reload = """if [ -d /run/systemd/system ]; then
\tsystemctl --system daemon-reload >/dev/null || true"""
        if start:
            post.append(
                reload
                + f"""
\tif [ -n "$2" ]; then _dh_action=restart; else _dh_action=start; fi
\tdeb-systemd-invoke $_dh_action '{unit}' >/dev/null || systemctl $_dh_action '{unit}' || true
fi"""
            )
            prerm.append(
                f"""if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
\tdeb-systemd-invoke stop '{unit}' >/dev/null || true
fi"""
            )
        else:
            post.append(reload + "\nfi")
    tag = "# Automatically added by the gpuk8s lab builder (like dh_installsystemd)\n"
    out = {}
    for name, parts in (("postinst", post), ("prerm", prerm), ("postrm", postrm)):
        if parts:
            out[name] = tag + "\n".join(parts) + "\n# End automatically added section\n"
    return out


def _merge_script(user: str | None, snippet: str | None) -> str | None:
    if snippet is None:
        return user
    if user is None:
        return "#!/bin/sh\nset -e\n\n" + snippet
    if "#DEBHELPER#" in user:
        return user.replace("#DEBHELPER#", snippet.rstrip("\n"))
    lines = user.rstrip("\n").split("\n")
    if lines and lines[-1].strip() == "exit 0":
        return "\n".join(lines[:-1]) + "\n" + snippet + "\nexit 0\n"
    return user.rstrip("\n") + "\n\n" + snippet


def render(pkg: PackageDef, version: str, fetched: FetchResolver | None = None) -> BuildSpec:
    raw = pkg.raw
    variables = {
        "VERSION": version,
        "UPSTREAM_VERSION": upstream_version(version),
        "KREL": host_kernel_release(),
    }
    variables.update({str(k): str(v) for k, v in (raw.get("vars") or {}).items()})
    variables.update(
        {str(k): str(v) for k, v in (raw.get("version_vars") or {}).get(version, {}).items()}
    )
    name = substitute(str(raw["name"]), variables).lower()
    variables["PKGNAME"] = name
    sub = lambda s: substitute(str(s), variables)  # noqa: E731

    description = sub(raw["description"]).strip("\n")
    if STANDIN_MARK not in description:
        raise PackageError(f"{pkg.path}: Description must contain {STANDIN_MARK!r}")
    arch = str(raw.get("architecture", "amd64"))
    if arch not in ("amd64", "all"):
        raise PackageError(f"{pkg.path}: architecture must be amd64 or all")

    entries: list[Entry] = []
    for f in raw.get("files") or []:
        dest = sub(f["dest"])
        if "link" in f:
            entries.append(Entry(dest, link=sub(f["link"])))
            continue
        mode = int(str(f.get("mode", "0644")), 8)
        if "fetched" in f:
            if fetched is None:
                raise PackageError(f"{pkg.path}: needs fetched upstream packages")
            src = fetched.tree(pkg, f["fetched"]) / f["path"]
            if src.is_symlink():
                src = src.resolve()
            entries.append(Entry(dest, mode, src.read_bytes()))
            continue
        if "pypi" in f:
            # real upstream data shipped inside an installed PyPI package (kubernetes-validate's
            # Kubernetes schemas): copied as-is, never substituted
            entries.append(Entry(dest, mode, _read_pypi(str(f["pypi"]), str(f["path"]))))
            continue
        if "pypi_tree" in f:
            entries += [Entry(f"{dest}/{rel}", 0o644, data)
                        for rel, data in _read_pypi_tree(str(f["pypi_tree"]))]
            continue
        data = str(f["content"]).encode() if "content" in f else _read_src(f["src"])
        if _is_text(data):
            data = sub(data.decode()).encode()
        entries.append(Entry(dest, mode, data))

    units: list[tuple[str, bool, bool]] = []
    for u in raw.get("systemd_units") or []:
        spec = {"src": u} if isinstance(u, str) else dict(u)
        data = _read_src(spec["src"])
        unit_name = Path(sub(spec["src"])).name
        dest = sub(spec.get("dest", f"/lib/systemd/system/{unit_name}"))
        entries.append(Entry(dest, 0o644, sub(data.decode()).encode()))
        units.append(
            (Path(dest).name, bool(spec.get("enable", False)), bool(spec.get("start", False)))
        )

    scripts: dict[str, str] = {}
    user_scripts = raw.get("maintainer_scripts") or {}
    snippets = _systemd_snippet(units) if units else {}
    for sname in SCRIPT_NAMES:
        user = user_scripts.get(sname)
        text = _merge_script(sub(_script_text(user)) if user else None, snippets.get(sname))
        if text is not None:
            scripts[sname] = text

    conffiles = [sub(c) for c in raw.get("conffiles") or []]
    for e in entries:
        if e.link is None and e.dest.startswith("/etc/") and e.dest not in conffiles:
            conffiles.append(e.dest)

    installed_kb = sum(len(e.data or b"") for e in entries) // 1024 + 1
    lines = [
        f"Package: {name}",
        f"Version: {version}",
        f"Architecture: {arch}",
        f"Maintainer: {sub(raw.get('maintainer', MAINTAINER))}",
        f"Installed-Size: {installed_kb}",
    ]
    for key in LIST_FIELDS:
        vals = [sub(v) for v in raw.get(key) or []]
        if vals:
            field_name = "-".join(w.capitalize() for w in key.split("_"))
            lines.append(f"{field_name}: {', '.join(vals)}")
    lines.append(f"Section: {raw.get('section', 'misc')}")
    lines.append(f"Priority: {raw.get('priority', 'optional')}")
    if raw.get("homepage"):
        lines.append(f"Homepage: {raw['homepage']}")
    first, *rest = description.split("\n")
    lines.append(f"Description: {first}")
    for line in rest:
        lines.append(" " + line if line.strip() else " .")
    control = "\n".join(lines) + "\n"
    repo = str((raw.get("version_repos") or {}).get(version, pkg.repo))
    return BuildSpec(name, version, arch, repo, control, scripts, entries, conffiles)


def build_deb(spec: BuildSpec, cache_dir: Path) -> Path:
    """Build spec into cache_dir/<hash>/<file>.deb unless that exists; return the path."""
    digest = spec.content_hash()[:20]
    out = cache_dir / digest / spec.filename
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="labdeb-", dir=cache_dir) as tmp:
        root = Path(tmp) / "root"
        (root / "DEBIAN").mkdir(parents=True)
        for e in spec.entries:
            target = root / e.dest.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            if e.link is not None:
                target.symlink_to(e.link)
            else:
                target.write_bytes(e.data or b"")
                target.chmod(e.mode)
        (root / "DEBIAN" / "control").write_text(spec.control)
        if spec.conffiles:
            (root / "DEBIAN" / "conffiles").write_text("".join(c + "\n" for c in spec.conffiles))
        for sname, text in spec.scripts.items():
            p = root / "DEBIAN" / sname
            p.write_text(text)
            p.chmod(0o755)
        md5 = []
        for p in sorted(root.rglob("*")):
            rel = p.relative_to(root).as_posix()
            if p.is_file() and not p.is_symlink() and not rel.startswith("DEBIAN/"):
                md5.append(f"{hashlib.md5(p.read_bytes()).hexdigest()}  {rel}\n")
        (root / "DEBIAN" / "md5sums").write_text("".join(md5))
        for p in [root, *root.rglob("*")]:
            if p.is_dir() and not p.is_symlink():
                p.chmod(0o755)
            os.utime(p, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH), follow_symlinks=False)
        env = dict(os.environ, SOURCE_DATE_EPOCH=str(SOURCE_DATE_EPOCH))
        tmp_out = Path(tmp) / spec.filename
        res = subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zgzip", "-z6", "-b", str(root), str(tmp_out)],
            capture_output=True,
            text=True,
            env=env,
        )
        if res.returncode != 0:
            raise PackageError(f"dpkg-deb failed for {spec.filename}: {res.stderr.strip()}")
        os.replace(tmp_out, out)
    return out


def build_all_debs(
    defs: Iterable[PackageDef], cache_dir: Path, fetched: FetchResolver | None = None
) -> list[tuple[BuildSpec, Path]]:
    built = []
    for pkg in defs:
        for version in pkg.versions(fetched):
            spec = render(pkg, version, fetched)
            built.append((spec, build_deb(spec, cache_dir)))
    return built


def gzip_bytes(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=9, mtime=0)


def describe(built: list[tuple[BuildSpec, Path]]) -> str:
    return json.dumps(sorted((s.repo, s.name, s.version) for s, _ in built), indent=1)
