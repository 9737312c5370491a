"""The lab's Prometheus image (LAB ONLY: test infrastructure, never shipped): the one layer of
``quay.io/prometheus/prometheus:<PROMETHEUS_LAB_TAG>`` in the lab registry (tests/lab/images.py
builds, caches and pushes it with the other lab images).

It holds the REAL Prometheus server and promtool of Debian 12's ``prometheus`` package
(2.42.0+ds, built by Debian from the upstream 2.42.0 sources; dynamically linked, so with
Debian's glibc beside it) on Debian's static busybox, laid out as upstream's image
(Dockerfile of v2.42.0, itself on quay.io/prometheus/busybox): /bin/prometheus, /bin/promtool,
/etc/prometheus/prometheus.yml (Debian's sample), the console directories under
/usr/share/prometheus linked from /etc/prometheus, /prometheus and /etc/prometheus owned by
nobody (65534); the image config as upstream's: Entrypoint /bin/prometheus with its default
Cmd, User nobody, WorkingDir /prometheus, port 9090, volume /prometheus. Debian serves the
classic web UI from /usr/share/prometheus/web (copied; its JavaScript libraries, Debian's
libjs-* packages, are not): the HTTP API is what gpuk8s uses.

The .debs come from Debian's mirror once (tests/lab/repos.py fetch_upstream_deb, cached in
``<cache>/downloads/bookworm``); nothing is installed on the lab host.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from . import debs, registry, repos
from .paths import LabError

SUITE = "bookworm"
#: Debian packages the layer is made of: the server, glibc for it, busybox for a shell
PACKAGES = ("prometheus", "libc6", "busybox-static")
LAYOUT = 1  # bump when the layer's layout changes (not its inputs)
EPOCH = 1_700_000_000
NOBODY = 65534
#: upstream's Cmd (Dockerfile of v2.42.0)
CMD = ("--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus",
       "--web.console.libraries=/usr/share/prometheus/console_libraries",
       "--web.console.templates=/usr/share/prometheus/consoles")
PASSWD = ("root:x:0:0:root:/root:/bin/sh\n"
          "nobody:x:65534:65534:nobody:/home:/bin/false\n")
GROUP = "root:x:0:\nnobody:x:65534:\n"
#: Go's resolver reads it; upstream's busybox image has none (Go then assumes dns,files)
NSSWITCH = "hosts: files dns\n"
#: what comes out of the packages (deb path -> image path); directories are copied whole
FROM_DEBS = {
    "prometheus": {"usr/bin/prometheus": "bin/prometheus", "usr/bin/promtool": "bin/promtool",
                   "etc/prometheus/prometheus.yml": "etc/prometheus/prometheus.yml",
                   "etc/prometheus/console_libraries": "usr/share/prometheus/console_libraries",
                   "etc/prometheus/consoles": "usr/share/prometheus/consoles",
                   "usr/share/prometheus/web": "usr/share/prometheus/web",
                   "usr/share/doc/prometheus/copyright": "usr/share/doc/prometheus/copyright"},
    "libc6": {"lib/x86_64-linux-gnu/libc.so.6": "lib/x86_64-linux-gnu/libc.so.6",
              "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2":
                  "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
              "lib64/ld-linux-x86-64.so.2": "lib64/ld-linux-x86-64.so.2",
              "usr/share/doc/libc6/copyright": "usr/share/doc/libc6/copyright"},
    "busybox-static": {"bin/busybox": "bin/busybox",
                       "usr/share/doc/busybox-static/copyright":
                           "usr/share/doc/busybox-static/copyright"},
}


def debs_used() -> dict[str, Path]:
    """The cached .deb of each package (downloaded from Debian's mirror the first time)."""
    return {p: repos.fetch_upstream_deb(p, SUITE) for p in PACKAGES}


def upstream_tag(deb_version: str) -> str:
    """Debian's version of the prometheus package -> the upstream image tag it was built from
    (``2.42.0+ds-5+deb12u1`` -> ``v2.42.0``)."""
    up = debs.upstream_version(deb_version)
    return "v" + up.split("+", 1)[0].split("~", 1)[0]


def inputs_key() -> str:
    """What the layer is made from (the .debs by name, which carry their versions)."""
    data = {"layout": LAYOUT, "debs": {p: d.name for p, d in debs_used().items()},
            "cmd": CMD, "note": registry.LAB_NOTE}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def note(versions: dict[str, str]) -> str:
    """/etc/gpuk8s-lab-image."""
    return "\n".join([
        registry.LAB_NOTE, "",
        "Built by gpuk8s's tests/lab/images.py for the lab registry, under the upstream",
        "name quay.io/prometheus/prometheus. One layer, upstream's layout:",
        *(f"- Debian 12 {p} {v}" for p, v in sorted(versions.items())),
        "- /bin/prometheus and /bin/promtool are Debian's build of Prometheus 2.42.0 (the REAL",
        "  server); busybox for a shell; glibc for the binaries; no web UI JavaScript", ""])


def _owner(rel: str) -> int:
    return NOBODY if rel == "prometheus" or rel.startswith(("prometheus/", "etc/prometheus")) \
        else 0


def stage(root: Path, versions: dict[str, str]) -> None:
    """The image's file tree under ``root`` (owners are applied when it is tarred)."""
    tmp = root.parent / "debs"
    for pkg, deb in debs_used().items():
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp)], check=True)
        versions[pkg] = debs.deb_field(deb, "Version")
        for src, dest in FROM_DEBS[pkg].items():
            target = root / dest
            target.parent.mkdir(parents=True, exist_ok=True)
            if (tmp / src).is_dir() and not (tmp / src).is_symlink():
                shutil.copytree(tmp / src, target, symlinks=True)
            elif (tmp / src).is_symlink() or (tmp / src).exists():
                os.replace(tmp / src, target)
            else:
                raise LabError(f"{deb.name} has no {src}: the lab's Prometheus image needs it")
    shutil.rmtree(tmp, ignore_errors=True)
    applets = subprocess.run([str(root / "bin/busybox"), "--list"], capture_output=True,
                             text=True, check=True).stdout.split()
    for applet in applets:  # as busybox images have them: sh, ls, cat, wget ...
        link = root / "bin" / applet
        if "/" not in applet and applet not in (".", "..") and not link.is_symlink() and \
                not link.exists():
            link.symlink_to("busybox")
    for name in ("console_libraries", "consoles"):
        (root / "etc/prometheus" / name).symlink_to(f"/usr/share/prometheus/{name}")
    for d in ("prometheus", "tmp", "root", "home"):
        (root / d).mkdir(exist_ok=True)
    (root / "tmp").chmod(0o1777)
    for rel, text in (("etc/passwd", PASSWD), ("etc/group", GROUP),
                      ("etc/nsswitch.conf", NSSWITCH), ("etc/gpuk8s-lab-image", note(versions))):
        (root / rel).write_text(text)


def write_layer(root: Path, out: Path) -> None:
    """An uncompressed, reproducible tar of ``root``: sorted entries, one mtime, numeric
    owners root or nobody (/prometheus and /etc/prometheus, as upstream's chown)."""
    from .images import _tree

    with tarfile.TarFile(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for rel in _tree(root):
            path = root / rel
            info = tar.gettarinfo(path, arcname=rel)
            if info is None:
                continue
            info.uid = info.gid = _owner(rel)
            info.uname = info.gname = ""
            info.mtime = EPOCH
            if info.isreg():
                with path.open("rb") as data:
                    tar.addfile(info, data)
            else:
                tar.addfile(info)


def build(work: Path) -> str:
    """Make ``work/layer.tar``; the tag the Debian package corresponds to."""
    versions: dict[str, str] = {}
    root = work / "stage"
    root.mkdir(parents=True)
    stage(root, versions)
    write_layer(root, work / "layer.tar")
    shutil.rmtree(root)
    return upstream_tag(versions["prometheus"])


def prometheus_version_output(layer_tar: Path) -> str:
    """``prometheus --version`` of the binary in a built layer, run on this host with the
    layer's own glibc (a check of the image; no server is started)."""
    tmp = layer_tar.parent / ".version-check"
    with tarfile.open(layer_tar) as tar:
        shutil.rmtree(tmp, ignore_errors=True)
        members = [m for m in tar.getmembers() if m.name in (
            "bin/prometheus", "lib/x86_64-linux-gnu/libc.so.6",
            "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")]
        tar.extractall(tmp, members=members, filter="data")
    try:
        lib = tmp / "lib/x86_64-linux-gnu"
        p = subprocess.run([str(lib / "ld-linux-x86-64.so.2"), "--library-path", str(lib),
                            str(tmp / "bin/prometheus"), "--version"], capture_output=True,
                           text=True, timeout=60)
        return p.stdout + p.stderr
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
