"""Lab OCI images for the TensorFlow and JupyterHub workloads (LAB ONLY: test infrastructure,
never shipped).

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
  image layout (tests/lab/prometheus_image.py), a layer of its own;
- hub: the real JupyterHub 5.5.0, KubeSpawner 7.0.0 ... from PyPI (Zero to JupyterHub 4.4.0's
  hub pins) on the base, user jovyan (1000:1000) as z2jh's images/hub/Dockerfile has it;
- chp: Debian 12's nodejs (and the libraries it needs that the base lacks, from Debian's
  mirror) with the real configurable-http-proxy 5.2.0 from npm, on the base;
- notebook: jupyterhub 5.5.0 (``jupyterhub-singleuser``) on the jupyter layer, user jovyan
  (1000:100) and lab stand-ins of docker-stacks' start scripts.

A layer may add users (its etc/passwd and etc/group: the base's and the new lines), files of
its own and paths owned by a user (the rest of a layer's files are root's).
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

from . import base, prometheus_image, registry, repos
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
    # Zero to JupyterHub 4.4.0's images/hub/requirements.txt, its top-level pins (upstream's
    # file freezes the rest; here pip resolves them for Python 3.11)
    "hub": ("jupyterhub==5.5.0", "jupyterhub-kubespawner==7.0.0",
            "jupyterhub-idle-culler==1.4.0", "jupyterhub-nativeauthenticator==1.3.0",
            "kubernetes-asyncio==36.1.0"),
    # docker-stacks' base-notebook has jupyterhub-singleuser (conda-forge's, of jupyterhub);
    # 5.5.0 as the hub's
    "notebook": ("jupyterhub==5.5.0",),
}
#: the npm packages of a layer, installed as ``npm install --global`` into /usr/local
NPM: dict[str, tuple[str, ...]] = {"chp": ("configurable-http-proxy@5.2.0",)}
#: the Debian packages of a layer: with what they depend on that the base lacks (apt's
#: resolver against the base's dpkg status, no recommends), from Debian 12's mirror
DEBS: dict[str, tuple[str, ...]] = {"chp": ("nodejs",)}


@dataclass(frozen=True)
class User:
    """A user a layer adds (its group too, unless ``group`` is empty: then ``gid`` is a group
    the base has). Base entries of the same name or id go (the node rootfs's labadmin is 1000)."""

    name: str
    uid: int
    gid: int
    home: str  # made from the base's /etc/skel, owned by the user
    gecos: str = ""
    group: str = ""

    def passwd(self) -> str:
        return f"{self.name}:x:{self.uid}:{self.gid}:{self.gecos}:{self.home}:/bin/bash"


@dataclass(frozen=True)
class LayerSpec:
    name: str
    about: str  # one line in /etc/gpuk8s-lab-image
    parent: str | None = None  # None: the base layer
    dirs: tuple[str, ...] = ()  # empty directories the layer adds
    users: tuple[User, ...] = ()
    owned: tuple[tuple[str, int, int], ...] = ()  # (path, uid, gid): it and all under it
    files: tuple[tuple[str, str, int], ...] = ()  # (path, text, mode) the layer adds

    def inputs(self) -> dict[str, Any]:
        """What the layer adds beyond its pins, for its cache key (only what it has, so that
        the keys of the layers without any stay as they were)."""
        extra = {"users": [vars(u) for u in self.users], "owned": self.owned,
                 "files": self.files, "npm": NPM.get(self.name, ()),
                 "debs": DEBS.get(self.name, ())}
        return {k: v for k, v in extra.items() if v}


# docker-stacks' start.sh, start-notebook.py and start-singleuser.py, reduced to what the lab's
# pods use (upstream: images/docker-stacks-foundation/start.sh, images/base-notebook/start-*.py;
# no tini, no conda, no root-time refit of the user): the image's Entrypoint runs the hooks and
# execs its arguments, so KubeSpawner's args (``jupyterhub-singleuser ...``) run as they are
START_SH = """\
#!/bin/bash
# gpuk8s lab image (LAB ONLY), not docker-stacks' start.sh: run the hooks, exec the arguments
set -e
if [ $# -eq 0 ]; then
    set -- bash
fi
for hooks in /usr/local/bin/start-notebook.d /usr/local/bin/before-notebook.d; do
    for hook in "$hooks"/*.sh; do
        [ -f "$hook" ] && source "$hook"
    done
done
exec "$@"
"""
START_NOTEBOOK = """\
#!/usr/bin/python3
# gpuk8s lab image (LAB ONLY), not docker-stacks' start-notebook.py: in a JupyterHub (its API
# token set) start-singleuser.py, else `jupyter lab` (DOCKER_STACKS_JUPYTER_CMD) with
# NOTEBOOK_ARGS and the arguments
import os
import shlex
import sys

if "JUPYTERHUB_API_TOKEN" in os.environ:
    command = ["/usr/local/bin/start-singleuser.py"]
else:
    command = ["jupyter", os.environ.get("DOCKER_STACKS_JUPYTER_CMD", "lab")]
    command += shlex.split(os.environ.get("NOTEBOOK_ARGS", ""))
command += sys.argv[1:]
print("Executing: " + " ".join(command), flush=True)
os.execvp(command[0], command)
"""
START_SINGLEUSER = """\
#!/usr/bin/python3
# gpuk8s lab image (LAB ONLY), not docker-stacks' start-singleuser.py: jupyterhub-singleuser
# with NOTEBOOK_ARGS and the arguments
import os
import shlex
import sys

command = ["jupyterhub-singleuser", *shlex.split(os.environ.get("NOTEBOOK_ARGS", ""))]
command += sys.argv[1:]
print("Executing: " + " ".join(command), flush=True)
os.execvp(command[0], command)
"""
# docker-stacks' /etc/jupyter/jupyter_server_config.py, its first lines: all interfaces, no
# browser (the port: jupyter_server reads JUPYTER_PORT)
JUPYTER_SERVER_CONFIG = """\
# gpuk8s lab image (LAB ONLY): as docker-stacks' jupyter_server_config.py starts
c = get_config()  # noqa: F821
c.ServerApp.ip = ""
c.ServerApp.open_browser = False
c.FileContentsManager.delete_to_trash = False
"""
JOVYAN = "/home/jovyan"

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
    LayerSpec("hub", "JupyterHub from PyPI with Zero to JupyterHub 4.4.0's hub pins: "
              "jupyterhub 5.5.0, jupyterhub-kubespawner 7.0.0, jupyterhub-idle-culler 1.4.0, "
              "jupyterhub-nativeauthenticator 1.3.0, kubernetes-asyncio 36.1.0; user jovyan "
              "(1000:1000), /srv/jupyterhub its own", parent="base", dirs=("srv/jupyterhub",),
              users=(User("jovyan", 1000, 1000, JOVYAN, "Default user,,,", group="jovyan"),),
              owned=(("srv/jupyterhub", 1000, 1000),)),
    LayerSpec("chp", "Debian 12's nodejs (18.x) and the libraries it needs, from Debian's "
              "mirror; the real configurable-http-proxy 5.2.0 from npm in /usr/local",
              parent="base"),
    LayerSpec("notebook", "jupyterhub 5.5.0 from PyPI (jupyterhub-singleuser); user jovyan "
              "(1000:100); lab start.sh, start-notebook.py and start-singleuser.py",
              parent="jupyter", users=(User("jovyan", 1000, 100, JOVYAN),),
              files=(("usr/local/bin/start.sh", START_SH, 0o755),
                     ("usr/local/bin/start-notebook.py", START_NOTEBOOK, 0o755),
                     ("usr/local/bin/start-singleuser.py", START_SINGLEUSER, 0o755),
                     ("etc/jupyter/jupyter_server_config.py", JUPYTER_SERVER_CONFIG, 0o644))),
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
# z2jh 4.4.0's images/hub/Dockerfile (its base python:3.12-slim-bookworm sets LANG=C.UTF-8)
HUB_CMD = ("jupyterhub", "--config", "/usr/local/etc/jupyterhub/jupyterhub_config.py")
# docker-stacks' foundation and base-notebook images, and the CUDA variant's NVIDIA settings
# (docs/research/issue-35-upstream-facts.md section 1)
NOTEBOOK_ENV = (f"PATH={PATH}:/usr/local/nvidia/bin", "LANG=C.UTF-8", "SHELL=/bin/bash",
                "NB_USER=jovyan", "NB_UID=1000", "NB_GID=100", f"HOME={JOVYAN}",
                "JUPYTER_PORT=8888", "LD_LIBRARY_PATH=/usr/local/nvidia/lib64", *NVIDIA_ENV)


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
    Image("quay.io/jupyterhub/k8s-hub:4.4.0", "hub",
          "Debian 12 + the real JupyterHub 5.5.0, KubeSpawner 7.0.0, jupyterhub-idle-culler "
          "1.4.0, nativeauthenticator 1.3.0 from PyPI (z2jh 4.4.0's pins), Python 3.11",
          env=(*TF_ENV, f"HOME={JOVYAN}"), cmd=HUB_CMD, workdir="/srv/jupyterhub",
          ports=("8081/tcp",), user="1000:1000"),
    Image("quay.io/jupyterhub/configurable-http-proxy:5.2.0", "chp",
          "Debian 12 + its nodejs 18 + the real configurable-http-proxy 5.2.0 from npm (which "
          "asks for node >= 20; it runs on 18)",
          env=(f"PATH={PATH}",), entrypoint=("configurable-http-proxy",), cmd=(),
          ports=("8000/tcp", "8001/tcp"), user="65534"),
    Image("quay.io/jupyter/tensorflow-notebook:cuda-tensorflow-2.21.0", "notebook",
          f"{TF} + Jupyter + jupyterhub-singleuser 5.5.0 from PyPI; lab start scripts",
          env=NOTEBOOK_ENV, entrypoint=("/usr/local/bin/start.sh",),
          cmd=("start-notebook.py",), workdir=JOVYAN, ports=("8888/tcp",), user="1000:100"),
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
              prometheus_image.inputs_key() if name == "prometheus" else base.base_key(),
              **spec.inputs()}
    if name in DEBS:  # the .debs by name, which carry their versions
        inputs["deb_files"] = [deb.name for deb in layer_debs(name)]
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
            packages = _stage(spec, parent, work / "stage")
            _write_tar(work / "stage", work / "layer.tar", keep_owners=False,
                       owners=_owners(spec))
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
               files: dict[str, bytes] | None = None,
               owners: dict[str, tuple[int, int]] | None = None) -> None:
    """An uncompressed tar of ``root`` (paths relative to it) for a layer: sorted entries,
    owners uid/gid 0 unless ``keep_owners`` (numeric ids only) or ``owners`` names the path
    or a directory above it (path -> (uid, gid)), ``skip(rel, is_dir)`` left out, ``files``
    added or replacing what is there."""
    files = files or {}
    owners = owners or {}
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
                info.uid, info.gid = _owner(rel, owners)
            if info.isreg():
                with path.open("rb") as data:
                    tar.addfile(info, data)
            else:
                tar.addfile(info)


def _owner(rel: str, owners: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """(uid, gid) of ``rel`` by the nearest of ``owners`` at or above it; else root's."""
    parts = rel.split("/")
    for n in range(len(parts), 0, -1):
        found = owners.get("/".join(parts[:n]))
        if found:
            return found
    return 0, 0


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


# ---------------------------------------------------------------- layers on the base
def note(top: str, packages: list[str], extra: Sequence[str] = ()) -> str:
    """/etc/gpuk8s-lab-image of an image whose top layer is ``top`` (``extra``: the top
    layer's Debian and npm packages)."""
    lines = [registry.LAB_NOTE, "",
             "Built by gpuk8s's tests/lab/images.py for the lab registry, under the upstream",
             "name the workloads pin. Layers:",
             *(f"- {name}: {LAYERS[name].about}" for name in chain(top)), ""]
    if packages:
        lines += [f"PyPI packages in /{SITE}:", *(f"  {p}" for p in packages)]
    else:
        lines.append("PyPI packages: none")
    return "\n".join([*lines, *extra]) + "\n"


def _stage(spec: LayerSpec, parent: Built, stage: Path) -> list[str]:
    """The layer's file tree under ``stage``: its PyPI, Debian and npm packages, directories,
    users and files; every PyPI package of an image it tops (the parent's and its own)."""
    stage.mkdir(parents=True)
    packages, extra = parent.packages, []
    if spec.name in REQUIREMENTS:
        packages = _pypi_stage(spec, parent, stage)
    if spec.name in DEBS:
        extra += _deb_stage(spec.name, stage)
    if spec.name in NPM:
        extra += _npm_stage(spec.name, stage)
    for d in spec.dirs:
        (stage / d).mkdir(parents=True)
    _accounts(spec, stage)
    for rel, text, mode in spec.files:
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        (stage / rel).write_text(text)
        (stage / rel).chmod(mode)
    (stage / NOTE).parent.mkdir(parents=True, exist_ok=True)
    (stage / NOTE).write_text(note(spec.name, packages, extra))
    if spec.name in REQUIREMENTS:
        _compile(stage)  # sets the mtimes
    else:
        _set_mtimes(stage)
    return packages


def _owners(spec: LayerSpec) -> dict[str, tuple[int, int]]:
    """The layer's paths not owned by root: its users' homes and ``owned``."""
    return {**{u.home.lstrip("/"): (u.uid, u.gid) for u in spec.users},
            **{path: (uid, gid) for path, uid, gid in spec.owned}}


def _accounts(spec: LayerSpec, stage: Path) -> None:
    """etc/passwd and etc/group of a layer adding users: the base's, less its entries of the
    same name or id (and their personal groups), plus the users of the layers up to this one;
    each of this layer's users gets a home from the base's /etc/skel."""
    if not spec.users:
        return
    root = base.ensure_base()
    passwd = (root / "etc/passwd").read_text().splitlines()
    group = (root / "etc/group").read_text().splitlines()
    users = [u for name in chain(spec.name) for u in LAYERS[name].users]
    gone: set[str] = set()
    for user in users:
        clash = [line for line in passwd
                 if line.split(":")[0] == user.name or line.split(":")[2] == str(user.uid)]
        gone |= {line.split(":")[0] for line in clash}
        passwd = [line for line in passwd if line not in clash] + [user.passwd()]
        if user.group:
            group = [line for line in group if line.split(":")[0] != user.group
                     and line.split(":")[2] != str(user.gid)] + [f"{user.group}:x:{user.gid}:"]
    gone -= {u.name for u in users}
    kept = []
    for line in group:
        name, pw, gid, members = line.split(":")
        if name not in gone:  # a removed user's own group goes with it
            listed = [m for m in members.split(",") if m and m not in gone]
            kept.append(":".join([name, pw, gid, ",".join(listed)]))
    (stage / "etc").mkdir(exist_ok=True)
    (stage / "etc/passwd").write_text("\n".join(passwd) + "\n")
    (stage / "etc/group").write_text("\n".join(kept) + "\n")
    for user in spec.users:
        shutil.copytree(root / "etc/skel", stage / user.home.lstrip("/"), symlinks=True)
        (stage / user.home.lstrip("/")).chmod(0o755)


# ---------------------------------------------------------------- Debian and npm packages
def layer_debs(name: str) -> list[Path]:
    """The .debs of layer ``name``: its DEBS and what they depend on that the base lacks (apt's
    resolver against the base's dpkg status, no recommends; Debian 12 and its security
    updates). Resolved and downloaded once for a base, then taken from the cache."""
    key = hashlib.sha256(json.dumps({"debs": DEBS[name], "base": base.base_key(),
                                     "sources": repos.BOOKWORM_LIST}).encode()).hexdigest()
    dest = cache_dir() / "downloads" / "images" / f"{name}-{key[:16]}"
    if not (dest / "debs.txt").is_file():
        status = base.ensure_base() / "var/lib/dpkg/status"
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="lab-apt-", dir=dest.parent) as t:
            tmp = Path(t)
            (tmp / "preferences.d").mkdir()
            opts = [*repos._apt_opts(tmp, repos.BOOKWORM_LIST),
                    "-o", f"Dir::State::status={status}",
                    "-o", f"Dir::State::extended_states={tmp}/extended_states",
                    "-o", f"Dir::Etc::preferences={tmp}/preferences",
                    "-o", f"Dir::Etc::preferencesparts={tmp}/preferences.d"]
            run(["apt-get", *opts, "update"])
            run(["apt-get", *opts, "install", "--download-only", "--no-install-recommends",
                 "-y", *DEBS[name]])
            got = sorted(p.name for p in (tmp / "archives").glob("*.deb"))
            if not got:
                raise LabError(f"apt-get downloaded no .deb for {' '.join(DEBS[name])}")
            (tmp / "archives").rename(tmp / "debs")
            (tmp / "debs/debs.txt").write_text("".join(f"{n}\n" for n in got))
            shutil.rmtree(tmp / "debs/partial", ignore_errors=True)
            if not (dest / "debs.txt").is_file():  # else a concurrent build was first
                shutil.rmtree(dest, ignore_errors=True)
                (tmp / "debs").rename(dest)
    return [dest / n for n in (dest / "debs.txt").read_text().split()]


# the top directories of Debian 12's merged /usr (symlinks in the base: a layer that had them
# as directories would replace the links)
MERGED = ("bin", "sbin", "lib", "lib64")


def _deb_stage(name: str, stage: Path) -> list[str]:
    """Extract the layer's .debs into ``stage`` (docs trimmed as in the base) and record them
    in its copy of the base's dpkg status; the note's lines about them. Their maintainer
    scripts do not run, nor does ldconfig: what nodejs's packages have are ldconfig triggers
    (the libraries are in the loader's default multiarch directory), nodejs's /usr/bin/js
    alternative and node-undici's helper for upgrades from older versions."""
    root = base.ensure_base()
    status = (root / "var/lib/dpkg/status").read_text().rstrip("\n") + "\n\n"
    info = stage / "var/lib/dpkg/info"
    info.mkdir(parents=True)
    lines = ["", "Debian 12 packages (from Debian's mirror; what the base lacks):"]
    tmp, meta = stage.parent / "deb", stage.parent / "deb-control"
    for deb in layer_debs(name):
        for d in (tmp, meta):
            shutil.rmtree(d, ignore_errors=True)
        run(["dpkg-deb", "-x", deb, tmp])
        run(["dpkg-deb", "-e", deb, meta])
        for rel in reversed(_tree(tmp)):  # what a directory holds before it
            path = tmp / rel
            is_dir = path.is_dir() and not path.is_symlink()
            if not _skip_base(rel, is_dir):
                continue
            if not is_dir:
                path.unlink()
            elif not any(path.iterdir()):
                path.rmdir()
        listed = ["/.", *(f"/{rel}" for rel in _tree(tmp))]
        for top in MERGED:
            if (root / top).is_symlink() and (tmp / top).is_dir() and \
                    not (tmp / top).is_symlink():
                shutil.copytree(tmp / top, tmp / "usr" / top, symlinks=True,
                                dirs_exist_ok=True)
                shutil.rmtree(tmp / top)
        shutil.copytree(tmp, stage, symlinks=True, dirs_exist_ok=True)
        control = (meta / "control").read_text().rstrip("\n").split("\n")
        fields = {key: value for key, _, value in
                  (line.partition(": ") for line in control if not line.startswith(" "))}
        package, version = fields["Package"], fields["Version"]
        arch_qualified = fields.get("Multi-Arch") == "same"
        list_name = f"{package}:{fields['Architecture']}" if arch_qualified else package
        (info / f"{list_name}.list").write_text("".join(f"{p}\n" for p in listed))
        if (meta / "md5sums").is_file():  # as dpkg keeps it (the docs' sums too)
            shutil.copyfile(meta / "md5sums", info / f"{list_name}.md5sums")
        status += "\n".join([control[0], "Status: install ok installed", *control[1:]]) + "\n\n"
        lines.append(f"  {package} {version}")
    for d in (tmp, meta):
        shutil.rmtree(d, ignore_errors=True)
    (stage / "var/lib/dpkg/status").write_text(status)
    return lines


def _npm_stage(name: str, stage: Path) -> list[str]:
    """``npm install --global`` the layer's npm packages into ``stage``'s /usr/local (their
    commands in /usr/local/bin); the note's lines about them."""
    npm = shutil.which("npm")
    if npm is None:
        raise LabError("npm is not installed: run scripts/setup (it installs Debian's npm)")
    prefix = stage / "usr/local"
    proc = run([npm, "install", "--global", "--prefix", prefix, "--omit=dev",
                "--ignore-scripts", "--no-audit", "--no-fund", "--no-update-notifier",
                "--engine-strict=false", "--loglevel=error", *NPM[name]], check=False)
    if proc.returncode != 0:
        raise LabError(f"npm install {' '.join(NPM[name])} failed ({proc.returncode}):\n"
                       f"{proc.stderr[-3000:]}")
    modules = prefix / "lib/node_modules"
    found, engines = set(), []
    for manifest in modules.rglob("package.json"):
        above = manifest.parent.parent
        if above.name == "node_modules" or (above.name.startswith("@") and
                                            above.parent.name == "node_modules"):
            data = json.loads(manifest.read_text())
            found.add(f"{data['name']}@{data['version']}")
            if above == modules:
                engines.append(f"  {data['name']}@{data['version']} asks for node "
                               f"{data.get('engines', {}).get('node', '(any)')} (installed "
                               "without npm's engine check; it runs on the nodejs above)")
    return ["", "npm packages in /usr/local/lib/node_modules (npm install --global):",
            *(f"  {p}" for p in sorted(found)), *sorted(engines)]


# ---------------------------------------------------------------- PyPI layers
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
    return sorted([*parent.packages, *added], key=str.lower)


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
