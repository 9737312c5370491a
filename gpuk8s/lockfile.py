"""Where an inventory's lock lives and what bootstrap reads from it (`invoke lock` writes it:
gpuk8s/lock/). Bootstrap reads only the apt half here: per OS release, each pinned package's
exact version and the pinned packages it depends on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuk8s.errors import PlanError

#: uname -m -> dpkg's architecture name
DPKG_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64el", "s390x": "s390x"}


def lock_path(inventory: str | Path) -> Path:
    """Where an inventory's lock lives: beside it, ``<name>.gpuk8s.lock``."""
    path = Path(inventory)
    return path.with_name(f"{path.stem}.gpuk8s.lock")


def release_key(os_release: Mapping[str, str], arch: str) -> str:
    """``<os id>-<version id>-<dpkg arch>`` of a host, e.g. ``ubuntu-24.04-amd64``."""
    return "-".join((os_release.get("ID", "unknown"), os_release.get("VERSION_ID", "unknown"),
                     DPKG_ARCH.get(arch, arch or "unknown")))


@dataclass(frozen=True)
class AptPins:
    """One OS release's part of a lock: package -> (exact version, pinned dependencies)."""

    lock: str
    release: str
    packages: Mapping[str, tuple[str, tuple[str, ...]]]

    def closure(self, name: str) -> list[str]:
        """``name`` and every pinned package it needs, each once, ``name`` first."""
        out: list[str] = []
        todo = [name]
        while todo:
            item = todo.pop(0)
            if item in out or item not in self.packages:
                continue
            out.append(item)
            todo.extend(self.packages[item][1])
        return out


def read_apt_pins(path: Path) -> dict[str, AptPins]:
    """release -> its pins, from the lock at ``path``; a lock gpuk8s cannot read is an error
    with the fix (lock again)."""
    try:
        data: Any = yaml.safe_load(path.read_text())
        releases = data["apt"]["releases"]
        out = {}
        for release, body in releases.items():
            pkgs = {str(n): (str(p["version"]), tuple(str(r) for r in p.get("requires", ())))
                    for n, p in (body.get("packages") or {}).items()}
            out[str(release)] = AptPins(str(path), str(release), pkgs)
        return out
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise PlanError(f"{path}: not a lock gpuk8s can read ({type(exc).__name__}: {exc}); "
                        "write it again with `invoke lock`, or remove it") from None


def read_image_pins(path: Path) -> dict[str, str]:
    """image reference -> the digest the lock at ``path`` pins for it."""
    try:
        data: Any = yaml.safe_load(path.read_text())
        return {str(image): str(entry["digest"]) for image, entry in
                (data.get("images") or {}).items()}
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise PlanError(f"{path}: not a lock gpuk8s can read ({type(exc).__name__}: {exc}); "
                        "write it again with `invoke lock`, or remove it") from None


def pinned_image(image: str, pins: Mapping[str, str]) -> str:
    """``image`` pulled by the lock's digest (``name:tag@sha256:...``: containerd pulls by
    the digest, the tag stays for people), or as it is when the lock does not name it."""
    if "@" in image or image not in pins:
        return image
    return f"{image}@{pins[image]}"
