"""Lab OCI images for the TensorFlow workloads (LAB ONLY: test infrastructure, never shipped).

Built here and pushed to the lab registry (tests/lab/registry.py) under the upstream names the
workloads pin (templates/workloads/values.yaml), so a node pulling them through gpuk8s's
registry_mirrors gets these. Each is a lab image, not the upstream one, and says so: an OCI
annotation and config label (``org.opencontainers.image.description``) and /etc/gpuk8s-lab-image.

Layers (uncompressed tars, uid/gid 0 where the files are ours, sorted entries, cached under
``<cache>/images/<layer>-<key>/``, the key a hash of everything that goes into the layer):
- base: the lab's Debian 12 node rootfs (tests/lab/base.py) trimmed for containers;
- tensorflow: the real ``tensorflow-cpu`` from PyPI, installed for Debian's /usr/bin/python3;
- jupyter: the Jupyter packages on top of tensorflow;
- tensorboard: ``tensorboard`` alone (no TensorFlow), on the base;
- prometheus: the REAL Prometheus of Debian 12's ``prometheus`` package on busybox, upstream's
  image layout (tests/lab/prometheus_image.py), a layer of its own.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import base, prometheus_image, registry
from .paths import LabError, cache_dir, run

# bump when the build itself changes (not its inputs): every layer's cache key includes it
BUILDER_VERSION = 1
# every file of the PyPI layers gets this mtime before the .pyc files are compiled (they record
# their source's mtime), so a rebuild from the same wheels gives the same tar
EPOCH = 1_700_000_000
PYTHON = "/usr/bin/python3"  # Debian 12's python3 3.11, the one in the base layer
SITE = "usr/local/lib/python3.11/dist-packages"  # where Debian's python3 finds pip installs
NOTE = "etc/gpuk8s-lab-image"
DESCRIPTION = "org.opencontainers.image.description"

# The top-level PyPI pins of each layer (their dependencies are resolved once, at the layer's
# cold build, packages below held at their versions; /etc/gpuk8s-lab-image lists the result).
#: the Prometheus image's tag: the upstream version Debian 12's prometheus package is built from
#: (the lab inventory's prometheus_version is this without the "v"; tests/lab/prometheus_image.py
#: refuses to build from a package of another version)
PROMETHEUS_LAB_TAG = "v2.42.0"
PROMETHEUS_LAB_VERSION = PROMETHEUS_LAB_TAG[1:]
# ipykernel and nbclient as in tests/tf/requirements.txt. `jupyter notebook` (the image's Cmd)
# is jupyter_core's `jupyter` running `jupyter-notebook`, which only the notebook package has.
REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "tensorflow": ("tensorflow-cpu==2.21.0",),
    "jupyter": ("notebook==7.6.5", "jupyterlab==4.6.6", "ipykernel==7.4.0", "nbclient==0.11.0"),
    # tensorboard 2.20 imports pkg_resources, which setuptools 82 dropped (it only asks >= 41)
    "tensorboard": ("tensorboard==2.20.0", "setuptools==80.9.0"),
}


@dataclass(frozen=True)
class LayerSpec:
    name: str
    about: str  # one line in /etc/gpuk8s-lab-image
    parent: str | None = None  # None: the base layer
    dirs: tuple[str, ...] = ()  # empty directories the layer adds


LAYERS = {spec.name: spec for spec in (
    LayerSpec("base", "Debian 12 (bookworm) from the lab's node rootfs, trimmed for containers: "
              "python3 (3.11), bash, coreutils, iproute2, procps, curl; no CUDA, no NVIDIA "
              "libraries"),
    LayerSpec("tensorflow", "the real tensorflow-cpu 2.21.0 from PyPI (the CPU build: no CUDA) "
              "for /usr/bin/python3", parent="base"),
    LayerSpec("jupyter", "Jupyter from PyPI: notebook (`jupyter notebook`), jupyterlab, "
              "ipykernel (the python3 kernel), nbclient (`jupyter execute`); /tf",
              parent="tensorflow", dirs=("tf",)),
    LayerSpec("tensorboard", "tensorboard 2.20.0 from PyPI only, no TensorFlow (TensorBoard "
              "runs with its reduced feature set)", parent="base"),
    LayerSpec("prometheus", "Debian 12's prometheus (the REAL Prometheus 2.42.0 server and "
              "promtool), glibc and busybox-static, in upstream's image layout"),
)}

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TF_ENV = (f"PATH={PATH}", "LANG=C.UTF-8")
# what the NVIDIA container runtime reads from an image (upstream's -gpu images have them)
NVIDIA_ENV = ("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility")
CUDA_ENV = (f"PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:{PATH}", "NVARCH=x86_64",
            "NVIDIA_REQUIRE_CUDA=cuda>=13.0", "CUDA_VERSION=13.0.1",
            "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64", *NVIDIA_ENV)
# upstream's jupyter images start like this (and the jupyter workload runs the same command)
JUPYTER_CMD = ("bash", "-c", "source /etc/bash.bashrc && jupyter notebook --notebook-dir=/tf "
               "--ip 0.0.0.0 --no-browser --allow-root")


@dataclass(frozen=True)
class Image:
    ref: str  # the upstream reference, fully qualified
    top: str  # its top layer: the image is that layer over its parents
    summary: str  # what it holds, after LAB_NOTE in its description
    env: tuple[str, ...] = TF_ENV
    cmd: tuple[str, ...] = ("/bin/bash",)
    workdir: str = ""
    ports: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()
    user: str = ""
    volumes: tuple[str, ...] = ()

    @property
    def description(self) -> str:
        return f"{registry.LAB_NOTE}: {self.summary}"

    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"Env": list(self.env), "Cmd": list(self.cmd),
                                  "Labels": {DESCRIPTION: self.description}}
        if self.workdir:
            config["WorkingDir"] = self.workdir
        if self.ports:
            config["ExposedPorts"] = {port: {} for port in self.ports}
        if self.entrypoint:
            config["Entrypoint"] = list(self.entrypoint)
        if self.user:
            config["User"] = self.user
        if self.volumes:
            config["Volumes"] = {v: {} for v in self.volumes}
        return config


TF = "Debian 12 + the real tensorflow-cpu 2.21.0 from PyPI (CPU only, no CUDA)"
IMAGES = (
    Image("docker.io/tensorflow/tensorflow:2.21.0", "tensorflow", TF),
    Image("docker.io/tensorflow/tensorflow:2.21.0-gpu", "tensorflow", TF,
          env=(*TF_ENV, *NVIDIA_ENV)),
    Image("docker.io/tensorflow/tensorflow:2.21.0-gpu-jupyter", "jupyter",
          f"{TF} + Jupyter (notebook, jupyterlab, ipykernel, nbclient)",
          env=(*TF_ENV, *NVIDIA_ENV), cmd=JUPYTER_CMD, workdir="/tf", ports=("8888/tcp",)),
    Image("docker.io/tensorflow/tensorflow:2.20.0", "tensorboard",
          "Debian 12 + tensorboard 2.20.0 from PyPI only, no TensorFlow"),
    Image("nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04", "base",
          "Debian 12 base only (not Ubuntu), no CUDA libraries; the upstream image's env",
          env=CUDA_ENV),
    Image(f"quay.io/prometheus/prometheus:{PROMETHEUS_LAB_TAG}", "prometheus",
          "the REAL Prometheus 2.42.0 (Debian 12's build) on busybox, upstream's layout",
          env=(f"PATH={PATH}",), entrypoint=("/bin/prometheus",), cmd=prometheus_image.CMD,
          workdir="/prometheus", ports=("9090/tcp",), user="nobody", volumes=("/prometheus",)),
)


# ---------------------------------------------------------------- names
def qualify(ref: str) -> str:
    """Docker's normalisation: ``tensorflow/tensorflow:2.21.0`` is on docker.io,
    ``busybox`` is ``docker.io/library/busybox``."""
    first, _, rest = ref.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return ref
    return f"docker.io/{ref if rest else 'library/' + ref}"


def registry_path(ref: str) -> tuple[str, str]:
    """(repository, tag) in the lab registry: what containerd asks a mirror of the image's
    registry for (``nvcr.io/nvidia/cuda:T`` -> ``/v2/nvidia/cuda/manifests/T``)."""
    path = qualify(ref).split("/", 1)[1]
    repo, _, tag = path.rpartition(":")
    return repo, tag


def select(names: Sequence[str] | None = None) -> list[Image]:
    if not names:
        return list(IMAGES)
    known = {image.ref: image for image in IMAGES}
    unknown = [n for n in names if qualify(n) not in known]
    if unknown:
        raise LabError(f"no lab image {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[qualify(n)] for n in names]


def _dist(pin: str) -> str:
    """The normalised distribution name of ``name==version`` (PEP 503)."""
    return re.sub(r"[-_.]+", "-", pin.split("==")[0]).lower()


# ---------------------------------------------------------------- layers
@dataclass(frozen=True)
class Built:
    """A layer in the cache: its tar (the blob, uncompressed), the tar's digest (blob digest
    and diff_id at once) and every PyPI package of an image it tops."""

    tar: Path
    digest: str
    packages: list[str]

    @property
    def size(self) -> int:
        return self.tar.stat().st_size


def images_dir() -> Path:
    return cache_dir() / "images"


def chain(top: str) -> list[str]:
    """The layers of an image whose top layer is ``top``, the base first."""
    parent = LAYERS[top].parent
    return [*(chain(parent) if parent else []), top]


def layer_key(name: str) -> str:
    spec = LAYERS[name]
    inputs = {"builder": BUILDER_VERSION, "note": registry.LAB_NOTE, "layer": name,
              "about": spec.about,
              "dirs": spec.dirs, "requirements": REQUIREMENTS.get(name, ()),
              "below": layer_key(spec.parent) if spec.parent else
              prometheus_image.inputs_key() if name == "prometheus" else base.base_key()}
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    return f"{name}-{digest[:16]}"


def _load(path: Path) -> Built:
    packages = (path / "packages.txt").read_text().split()
    return Built(path / "layer.tar", (path / "digest").read_text().strip(), packages)


def ensure_layer(name: str) -> Built:
    """The cached layer ``name`` (its parents first), built unless its key is in the cache."""
    spec = LAYERS[name]
    parent = ensure_layer(spec.parent) if spec.parent else None
    done = images_dir() / layer_key(name)
    if (done / "digest").is_file():
        return _load(done)
    images_dir().mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    print(f"lab: building image layer {done.name} ...", flush=True)
    work = Path(tempfile.mkdtemp(prefix=f".build-{done.name}-", dir=images_dir()))
    try:
        if name == "prometheus":
            packages: list[str] = []
            if prometheus_image.build(work) != PROMETHEUS_LAB_TAG:
                raise LabError(f"Debian's prometheus package is not {PROMETHEUS_LAB_TAG}: "
                               "update PROMETHEUS_LAB_TAG in tests/lab/images.py")
        elif parent is None:
            packages = []
            _base_tar(work / "layer.tar")
        else:
            packages = _pypi_stage(spec, parent, work / "stage")
            _write_tar(work / "stage", work / "layer.tar", keep_owners=False)
            shutil.rmtree(work / "stage")
        with (work / "layer.tar").open("rb") as tar:
            digest = "sha256:" + hashlib.file_digest(tar, "sha256").hexdigest()
        (work / "packages.txt").write_text("".join(f"{p}\n" for p in packages))
        (work / "digest").write_text(f"{digest}\n")  # written last: marks the layer complete
        if not (done / "digest").is_file():  # else a concurrent build finished first
            shutil.rmtree(done, ignore_errors=True)
            work.rename(done)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _prune(name, keep=done)
    print(f"lab: layer {done.name} built in {time.monotonic() - t0:.1f} s", flush=True)
    return _load(done)


def _prune(name: str, keep: Path) -> None:
    """Drop the layer's cached builds from other inputs (a TensorFlow layer is 1.5 GB)."""
    for old in images_dir().glob(f"{name}-*"):
        if old != keep and re.fullmatch(rf"{name}-[0-9a-f]{{16}}", old.name):
            shutil.rmtree(old)


# ---------------------------------------------------------------- tar files
def _tree(root: Path) -> list[str]:
    """Every path under ``root`` (relative, not following symlinks), sorted: a directory
    comes before what it holds."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        out += [os.path.normpath(os.path.join(rel, n)) for n in (*dirnames, *filenames)]
    return sorted(out)


def _write_tar(root: Path, out: Path, *, keep_owners: bool,
               skip: Callable[[str, bool], bool] = lambda rel, is_dir: False,
               files: dict[str, bytes] | None = None) -> None:
    """An uncompressed tar of ``root`` (paths relative to it) for a layer: sorted entries,
    owners uid/gid 0 unless ``keep_owners`` (numeric ids only), ``skip(rel, is_dir)`` left
    out, ``files`` added or replacing what is there."""
    files = files or {}
    with tarfile.TarFile(out, "w", format=tarfile.PAX_FORMAT, copybufsize=1 << 20) as tar:
        for rel in sorted({*_tree(root), *files}):
            path = root / rel
            if rel in files:
                info = tarfile.TarInfo(rel)
                info.size, info.mode, info.mtime = len(files[rel]), 0o644, EPOCH
                tar.addfile(info, io.BytesIO(files[rel]))
                continue
            if skip(rel, path.is_dir() and not path.is_symlink()):
                continue
            info = tar.gettarinfo(path, arcname=rel)
            if info is None:  # a socket: nothing a layer can hold
                continue
            info.uname = info.gname = ""
            info.mtime = int(info.mtime)
            if not keep_owners:
                info.uid = info.gid = 0
            if info.isreg():
                with path.open("rb") as data:
                    tar.addfile(info, data)
            else:
                tar.addfile(info)


# What a container does not need from the node rootfs: what the runtime mounts (/dev, /proc,
# /sys, /run, /tmp), apt's caches and lists, logs, man/info pages, translations and docs (the
# copyright files stay), ssh host keys (none in the base, made per node) and the node's boot
# wrapper. machine-id is emptied: not the node's, a container gets its own.
EMPTIED = ("dev/", "proc/", "sys/", "run/", "tmp/", "var/cache/apt/", "var/lib/apt/lists/",
           "usr/share/man/", "usr/share/info/", "usr/share/locale/")
DROPPED = ("usr/local/sbin/gpuk8s-lab-init", "var/lib/dbus/machine-id")


def _skip_base(rel: str, is_dir: bool) -> bool:
    if rel.startswith(EMPTIED) or rel in DROPPED:
        return True
    if rel.startswith("var/log/"):
        return not is_dir  # apt and dpkg expect their log directories
    if rel.startswith("etc/ssh/ssh_host_"):
        return True
    if rel.startswith("usr/share/doc/"):
        return rel.count("/") > 3 and not rel.endswith("/copyright")
    return False


def _base_tar(out: Path) -> None:
    """The base layer, straight from the cached rootfs (which the nodes use: not modified).
    Its owners stay (shadow, _apt, utmp ...): they are Debian's, not the builder's."""
    root = base.ensure_base()
    _write_tar(root, out, keep_owners=True, skip=_skip_base,
               files={"etc/machine-id": b"", NOTE: note("base", []).encode()})


# ---------------------------------------------------------------- PyPI layers
def note(top: str, packages: list[str]) -> str:
    """/etc/gpuk8s-lab-image of an image whose top layer is ``top``."""
    lines = [registry.LAB_NOTE, "",
             "Built by gpuk8s's tests/lab/images.py for the lab registry, under the upstream",
             "name the workloads pin. Layers:",
             *(f"- {name}: {LAYERS[name].about}" for name in chain(top)), ""]
    if packages:
        lines += [f"PyPI packages in /{SITE}:", *(f"  {p}" for p in packages)]
    else:
        lines.append("PyPI packages: none")
    return "\n".join(lines) + "\n"


def _pip(*args: str) -> None:
    # the venv's pip (and pip cache) for Debian's python3: both are CPython 3.11 on this
    # glibc, so pip picks the same wheels
    proc = run([sys.executable, "-m", "pip", *args], check=False)
    if proc.returncode != 0:
        raise LabError(f"pip {args[0]} failed ({proc.returncode}): pip {' '.join(args)}\n"
                       f"{proc.stderr[-3000:]}")


def _resolve(requirements: Sequence[str], below: list[str], work: Path) -> list[str]:
    """``name==version`` of what ``requirements`` need beyond the packages ``below`` (pip's
    resolver, with those held at their versions: the layers must agree)."""
    report, constraints = work / "resolved.json", work / "constraints.txt"
    constraints.write_text("".join(f"{p}\n" for p in below))
    _pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
         "--constraint", str(constraints), *requirements)
    have = {_dist(p) for p in below}
    pins = [f"{d['metadata']['name']}=={d['metadata']['version']}"
            for d in json.loads(report.read_text())["install"]]
    return [p for p in pins if _dist(p) not in have]


def _pypi_stage(spec: LayerSpec, parent: Built, stage: Path) -> list[str]:
    """Install the layer's packages under ``stage`` where Debian's python3 finds them; return
    every PyPI package of an image it tops (the parent's and its own)."""
    site, local = stage / SITE, stage / "usr/local"
    site.mkdir(parents=True)
    added = _resolve(REQUIREMENTS[spec.name], parent.packages, stage.parent)
    _pip("install", "--no-deps", "--no-compile", "--no-warn-script-location", "--quiet",
         "--target", str(site), *added)
    # --target leaves the console scripts and data files (share/jupyter, etc/jupyter ...) in
    # the target: move them where a /usr/local install puts them and jupyter looks
    for sub in ("bin", "share", "etc", "include"):
        if (site / sub).is_dir():
            (site / sub).rename(local / sub)
    (local / "bin").mkdir(exist_ok=True)
    _rewrite_shebangs(local / "bin")
    (local / "bin/python").symlink_to(PYTHON)  # as upstream's TensorFlow images have
    for d in spec.dirs:
        (stage / d).mkdir(parents=True)
    packages = sorted([*parent.packages, *added], key=str.lower)
    (stage / NOTE).parent.mkdir(parents=True, exist_ok=True)
    (stage / NOTE).write_text(note(spec.name, packages))
    _compile(stage)
    return packages


def _rewrite_shebangs(bindir: Path) -> None:
    """pip wrote the venv's python into its console scripts: use Debian's."""
    for script in bindir.iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        first, newline, rest = script.read_bytes().partition(b"\n")
        if first.startswith(b"#!") and b"python" in first:
            script.write_bytes(b"#!" + PYTHON.encode() + newline + rest)


def _set_mtimes(root: Path) -> None:
    for rel in _tree(root):
        os.utime(root / rel, (EPOCH, EPOCH), follow_symlinks=False)


def _compile(stage: Path) -> None:
    """.pyc files by Debian's python3 (else every new container compiles tensorflow's 4,400
    modules again at its first import), valid for the sources' mtimes in the tar."""
    _set_mtimes(stage)
    proc = run([PYTHON, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode",
                "timestamp", "-d", f"/{SITE}", stage / SITE], check=False)
    if proc.returncode != 0:
        raise LabError(f"compileall failed in {stage / SITE}:\n{proc.stdout[-3000:]}")
    _set_mtimes(stage)  # the new .pyc files too: the same tar from the same wheels


# ---------------------------------------------------------------- images
@dataclass(frozen=True)
class Pushed:
    ref: str
    digest: str  # the manifest's
    size: int  # the layers' bytes
    build_s: float  # building (or finding in the cache) its layers
    push_s: float


def push_image(image: Image, layers: list[Built]) -> str:
    """Push the image's layers (skipping blobs the registry has) and manifest; its digest."""
    repo, tag = registry_path(image.ref)
    for built in layers:
        registry.push_file(repo, built.tar, built.digest)
    return registry.push_manifest(
        repo, tag, [registry.Layer(b.digest, b.size, b.digest, registry.LAYER_TAR)
                    for b in layers], image.config(), image.description)


def build_and_push(names: Sequence[str] | None = None) -> list[Pushed]:
    """Build (or reuse) the images' layers and push what the registry lacks."""
    chosen = select(names)
    registry.start()
    out = []
    for image in chosen:
        t0 = time.monotonic()
        layers = [ensure_layer(name) for name in chain(image.top)]
        t1 = time.monotonic()
        digest = push_image(image, layers)
        out.append(Pushed(image.ref, digest, sum(b.size for b in layers), t1 - t0,
                          time.monotonic() - t1))
    return out


def push_prometheus() -> str:
    """Build (or reuse) and push only the Prometheus image; its manifest digest."""
    ref = f"quay.io/prometheus/prometheus:{PROMETHEUS_LAB_TAG}"
    return ensure_images([ref])[ref]


def ensure_images(names: list[str] | None = None) -> dict[str, str]:
    """Build the lab images if needed and push them if missing: image ref -> manifest digest
    (all of IMAGES, or ``names``, upstream references as the workloads write them)."""
    return {p.ref: p.digest for p in build_and_push(names)}
