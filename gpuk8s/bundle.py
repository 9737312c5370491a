"""``invoke bundle``: gpuk8s for an admin machine that reaches no package index.

Run it where PyPI (or a mirror) answers and carry the result over. gpuk8s reads roles/ and
templates/ from its checkout (:func:`gpuk8s.paths.project_root`), so the bundle holds the
checkout itself (its committed files, never secrets: :func:`source_files`) and, in wheels/,
a wheel of gpuk8s and of every runtime dependency for the target's Python and platform, with
setuptools, which ``pip install -e .`` builds with. Only the admin machine's Python
matters: gpuk8s runs there and reaches the nodes over SSH; it installs nothing Python on them.
"""

from __future__ import annotations

import hashlib
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from gpuk8s.bundlefiles import MANIFEST, left_out, source_files
from gpuk8s.errors import BundleError
from gpuk8s.paths import project_root

Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]

#: pip output that means the index (or a proxy in front of it) did not answer
_NETWORK = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Max retries exceeded|"
    r"Temporary failure in name resolution|Name or service not known|ProxyError|SSLError|"
    r"ConnectTimeoutError|ReadTimeoutError|Could not fetch URL|not a trusted or secure host|"
    r"40[137] Client Error")
_LEGACY = {"2014": 17, "2010": 12, "1": 5}  # manylinux2014 is manylinux_2_17, ...
#: the install command, run in the bundle's copy of the checkout
INSTALL = "python3 -m venv .venv && .venv/bin/pip install --no-index --find-links ../wheels -e ."
_ARCH = re.compile(r"(x86_64|aarch64|ppc64le|s390x|i686|armv7l|arm64|amd64|universal2)$")


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          check=False)


def expand_platforms(platforms: Sequence[str]) -> list[str]:
    """pip platform tags with the older ones a target also runs: a glibc 2.28 box runs
    manylinux_2_17 (= manylinux2014) wheels too, but ``pip --platform`` matches tags literally."""
    out: list[str] = []
    for p in platforms:
        m = re.match(r"^manylinux(?:_2_(\d+)|(2014|2010|1))_(.+)$", p)
        if m:
            glibc, arch = int(m[1]) if m[1] else _LEGACY[m[2]], m[3]
            low = 5 if arch in ("x86_64", "i686") else 17
            tags = [f"manylinux_2_{v}_{arch}" for v in range(glibc, low - 1, -1)]
            tags += [f"manylinux{k}_{arch}" for k, v in _LEGACY.items() if low <= v <= glibc]
        elif m := re.match(r"^musllinux_1_(\d+)_(.+)$", p):
            tags = [f"musllinux_1_{v}_{m[2]}" for v in range(int(m[1]), 0, -1)]
        else:
            tags = [p]
        out += [t for t in tags if t not in out]
    return out


@dataclass(frozen=True)
class Target:
    """The admin machine the bundle is for: its Python (``"3.12"``) and pip platform tags;
    None and () mean the Python running this and this machine."""

    python_version: str | None = None
    platforms: tuple[str, ...] = ()

    @property
    def version(self) -> str:
        return self.python_version or "{}.{}".format(*sys.version_info[:2])

    @property
    def tag(self) -> str:
        return "py" + self.version.replace(".", "")

    @property
    def arch(self) -> str:
        m = _ARCH.search(self.platforms[0]) if self.platforms else None
        return m[1] if m else (self.platforms[0] if self.platforms else platform.machine())

    def describe(self) -> str:
        where = ", ".join(self.platforms) or f"this machine's platform ({sysconfig.get_platform()})"
        return f"CPython {self.version} on {where}"

    def pip_args(self) -> list[str]:
        if not (self.python_version or self.platforms):
            return []  # pip's own tags for this interpreter
        args = ["--python-version", self.version, "--implementation", "cp",
                "--abi", "cp" + self.version.replace(".", "")]
        for tag in expand_platforms(self.platforms):
            args += ["--platform", tag]
        return args


def project(root: Path, text: str | None = None) -> dict[str, Any]:
    """name, version, requires-python and the requirements to download, from pyproject.toml
    (``text``, else the one in ``root``): ``[project] dependencies`` and ``[build-system]
    requires`` (for ``pip install -e .``)."""
    data = tomllib.loads(text if text is not None else (root / "pyproject.toml").read_text())
    meta = data["project"]
    return {"name": meta["name"], "version": meta["version"],
            "requires_python": meta.get("requires-python", ""),
            "requirements": [*meta.get("dependencies", []),
                             *data.get("build-system", {}).get("requires", [])]}


def download_command(requirements: Sequence[str], dest: Path, target: Target,
                     index: Sequence[str] = ()) -> list[str]:
    """pip download of every requirement, wheels only, for the target."""
    return [sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
            "--only-binary=:all:", *target.pip_args(), *index, "-d", str(dest), *requirements]


def wheel_command(source: Path, dest: Path, index: Sequence[str] = ()) -> list[str]:
    """pip wheel of gpuk8s itself (pure Python: one wheel fits every target)."""
    return [sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--no-deps",
            *index, "-w", str(dest), str(source)]


def _tail(output: str, lines: int = 12) -> str:
    keep = [line for line in output.splitlines() if line.strip() and not re.match(
        r"\s*(━|Collecting |Downloading |Using cached |Saved |File was already|Processing "
        r"|WARNING: Location )",
        line)]
    return "\n".join(f"    {line}" for line in keep[-lines:])


def check_pip(proc: subprocess.CompletedProcess[str], target: Target) -> None:
    """Raise a BundleError that says why pip failed and the fix; nothing when it succeeded."""
    if proc.returncode == 0:
        return
    out, tail = proc.stdout or "", _tail(proc.stdout or "")
    if "No module named pip" in out:
        raise BundleError(f"{sys.executable} has no pip:\n{tail}",
                          fix=f"{sys.executable} -m ensurepip, or run from gpuk8s's venv")
    if _NETWORK.search(out):
        raise BundleError(
            f"pip cannot reach the package index:\n{tail}",
            fix="run `invoke bundle` on a machine that reaches PyPI, or point pip at one it "
                "reaches (PIP_INDEX_URL=https://mirror/simple, a proxy in HTTPS_PROXY), or "
                "pass --find-links FOLDER (a folder of wheels) with --no-index")
    missing = [re.split(r"[<>=!~;\[ ]", m)[0]
               for m in re.findall(r"No matching distribution found for (\S+)", out)]
    if not missing and "ResolutionImpossible" in out:  # pip backtracked: what is depended on
        missing = re.findall(r"depends on ([A-Za-z0-9_.-]+)", out)
    if missing:
        names = ", ".join(dict.fromkeys(missing))
        raise BundleError(
            f"no wheel of {names} (at a version the other requirements accept) for "
            f"{target.describe()}:\n{tail}",
            fix="give the admin machine's own Python and platform (there: `python3 -V`, "
                "`python3 -c 'import sysconfig; print(sysconfig.get_platform())'` and "
                "`ldd --version` for the glibc: --python-version 3.X --platform "
                f"manylinux_2_<glibc minor>_<arch>); a Python newer than {names}'s releases "
                "has no wheel of it yet: use an older python3.X on the admin machine")
    raise BundleError(f"pip failed (exit {proc.returncode}):\n{tail}",
                      fix="the pip output above says why; run the same pip command by hand "
                          "for all of it")


def _check_version(version: str | None, requires: str) -> str | None:
    if version is None:
        return None
    if not re.fullmatch(r"3\.\d{1,2}", version):
        raise BundleError(f"--python-version {version!r} is not a Python version",
                          fix="the admin machine's major.minor, e.g. --python-version 3.12")
    low = re.fullmatch(r">=\s*3\.(\d+)", requires.strip())
    if low and int(version.split(".")[1]) < int(low[1]):
        raise BundleError(f"gpuk8s needs Python {requires}; {version} cannot run it",
                          fix=f"install python3.{low[1]} or newer on the admin machine")
    return version


def install_text(version: str, target: Target, name: str, wheels: int) -> tuple[str, str]:
    """INSTALL.txt and install.sh of a bundle (from gpuk8s/data/bundle-*)."""
    fit = (f"--platform {', '.join(target.platforms)} (and older tags)" if target.platforms
           else f"the machine that built it ({sysconfig.get_platform()}): an older glibc "
                "may need a bundle made with --platform manylinux_2_<glibc minor>_<arch>")
    fields = {"version": version, "python": target.version, "fit": fit, "name": name,
              "src": f"gpuk8s-{version}", "wheels": wheels, "install": INSTALL}
    data = Path(__file__).parent / "data"
    text, script = ((data / f).read_text().format(**fields)
                    for f in ("bundle-INSTALL.txt", "bundle-install.sh"))
    return text, script


def bundle(output: str | Path = "dist", *, python_version: str | None = None,
           platforms: Sequence[str] = (), tarball: bool = False,
           find_links: Sequence[str] = (), no_index: bool = False, root: Path | None = None,
           runner: Runner = _run, out: TextIO | None = None,
           extra: Callable[[Path], list[str]] | None = None) -> dict[str, Any]:
    """Build ``<output>/gpuk8s-bundle-<version>-py3X-<arch>/`` (or, with ``tarball``, that
    ``.tar.gz``): the checkout, wheels/ and INSTALL.txt; print a summary and return it.

    Args:
        output: folder the bundle goes in.
        python_version: the admin machine's Python (``"3.12"``); default: this one.
        platforms: pip platform tags of the admin machine; default: this machine's.
        tarball: one .tar.gz instead of a folder.
        find_links, no_index: pip's options of those names (a local folder of wheels).
        root: the checkout (default: the one gpuk8s runs from).
        runner: runs one pip command (tests pass fakes).
        extra: adds to the bundle's folder before it is packed (`bundle --cluster`: the
            cluster's packages and images); the summary lines it returns are printed.
    """
    out = out or sys.stdout
    root = root or project_root()
    source = source_files(root, skip=Path(output))
    if "pyproject.toml" not in source.files:
        raise BundleError(f"{root}: {source.origin} has no pyproject.toml",
                          fix="bundle from a gpuk8s checkout, with pyproject.toml committed")
    meta = project(root, source.files["pyproject.toml"][0].decode())
    target = Target(_check_version(python_version, meta["requires_python"]), tuple(platforms))
    name = f"gpuk8s-bundle-{meta['version']}-{target.tag}-{target.arch}"
    output = Path(output).absolute()
    dest = output / name
    shutil.rmtree(dest, ignore_errors=True)
    wheels = dest / "wheels"
    wheels.mkdir(parents=True)
    index = ["--no-index"] if no_index else []
    for folder in find_links:
        index += ["--find-links", str(Path(folder).absolute())]
    out.write(f"bundle: wheels of {len(meta['requirements'])} requirements and their "
              f"dependencies for {target.describe()} (pip download)\n")
    check_pip(runner(download_command(meta["requirements"], wheels, target, index)), target)
    src = dest / f"gpuk8s-{meta['version']}"
    files = sorted(source.files)
    for rel in files:
        content, executable = source.files[rel]
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(content)
        (src / rel).chmod(0o755 if executable else 0o644)
    (src / MANIFEST).write_text("".join(
        f"{hashlib.sha256(source.files[rel][0]).hexdigest()}  {rel}\n" for rel in files))
    out.write(f"bundle: the checkout ({len(files)} files) and a wheel of gpuk8s (pip wheel)\n")
    with tempfile.TemporaryDirectory() as tmp:  # pip builds in the tree: not in the bundle's
        build = Path(tmp) / "src"
        shutil.copytree(src, build, symlinks=True)
        check_pip(runner(wheel_command(build, wheels, index)), target)
    count = len(list(wheels.glob("*.whl")))
    text, script = install_text(meta["version"], target, name, count)
    (dest / "INSTALL.txt").write_text(text)
    (dest / "install.sh").write_text(script)
    (dest / "install.sh").chmod(0o755)
    size = sum(p.stat().st_size for p in wheels.glob("*.whl"))
    added = extra(dest) if extra is not None else []
    path = dest
    if tarball:
        path = output / f"{name}.tar.gz"
        with tarfile.open(path, "w:gz") as tar:
            tar.add(dest, arcname=name)
        shutil.rmtree(dest)
    total = path.stat().st_size if tarball else sum(
        p.stat().st_size for p in dest.rglob("*") if p.is_file())
    lines = [f"bundle: {path} ({total / 2**20:.1f} MiB)",
             f"  {count} wheels ({size / 2**20:.1f} MiB): gpuk8s {meta['version']} and its "
             f"dependencies, for {target.describe()}",
             f"  gpuk8s-{meta['version']}/: the checkout's files of {source.origin}, "
             f"{len(files)} files, listed in {MANIFEST}"]
    lines += left_out(source) + added
    lines += [f"install on the admin machine (python3 {target.version}, no index needed):",
              *([f"  tar xzf {path.name}"] if tarball else []),
              f"  cd {name}/gpuk8s-{meta['version']}", f"  {INSTALL}",
              "  (or ./install.sh; INSTALL.txt says it all)"]
    out.write("\n".join(lines) + "\n")
    return {"path": str(path), "wheels": count, "wheel_bytes": size, "bytes": total,
            "files": len(files), "origin": source.origin, "changed": source.changed,
            "untracked": source.untracked, "withheld": source.withheld,
            "target": target.describe(),
            "install": INSTALL}
