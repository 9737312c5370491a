"""MIG (Multi-Instance GPU) layouts: which GPU instance profiles each MIG-capable model has,
what a ``gpu_sharing: {mode: mig, layout: ...}`` asks of each GPU, whether it fits, and the
nvidia-smi commands that take a GPU from its current MIG state to the wanted one (the way
NVIDIA's mig-parted does it: destroy the compute and GPU instances, set MIG mode, create the GPU
instances largest first, each with its one full-size compute instance).

Profile IDs, sizes and placements are NVIDIA's (nvidia-smi ``mig -lgip`` / ``-lgipp`` on an
H200, tests/fixtures/nvidia/h200-mig/; the A100 and H100 names from NVIDIA's MIG user guide).
A GPU has 8 memory slices; a profile of size S may start at the listed slices only."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuk8s.facts.nvidia import GpuMig
from gpuk8s.sinks import shell


@dataclass(frozen=True)
class Profile:
    name: str            # "3g.40gb"
    gi_id: int           # the GPU instance profile ID nvidia-smi mig -cgi takes
    size: int            # memory slices it occupies
    starts: tuple[int, ...]


def _family(one: str, one_double: str, two: str, three: str, four: str, seven: str
            ) -> tuple[Profile, ...]:
    """One memory size's profiles; IDs and placements are the same on A100, H100 and H200."""
    return (Profile(one, 19, 1, (0, 1, 2, 3, 4, 5, 6)),
            Profile(one_double, 15, 2, (0, 2, 4, 6)),
            Profile(two, 14, 2, (0, 2, 4)),
            Profile(three, 9, 4, (0, 4)),
            Profile(four, 5, 4, (0,)),
            Profile(seven, 0, 8, (0,)))


_80GB = _family("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
_141GB = _family("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb")
_40GB = _family("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")

#: MIG-capable models (nvidia-smi's name, which is also gpuk8s' PCI model name) -> profiles
MODELS: dict[str, tuple[Profile, ...]] = {
    "NVIDIA H100 80GB HBM3": _80GB,
    "NVIDIA H100 PCIe": _80GB,
    "NVIDIA A100-SXM4-80GB": _80GB,
    "NVIDIA A100 80GB PCIe": _80GB,
    "NVIDIA H200": _141GB,
    "NVIDIA H200 NVL": _141GB,
    "NVIDIA A100-SXM4-40GB": _40GB,
}
#: all-balanced, per profile family (mig-parted's layout): one 3g, one 2g and two 1g
BALANCED = {id(f): (f[3].name, f[2].name, f[0].name, f[0].name) for f in (_80GB, _141GB, _40GB)}
KNOWN_PROFILES = sorted({p.name for f in (_80GB, _141GB, _40GB) for p in f})
CAPABLE = "A100, H100 and H200"
_PROFILE_RE = re.compile(r"\d+g\.\d+gb")


def check_layout(name: str, layout: Any) -> str | None:
    """What is wrong with a layout before any host is seen (None: nothing): ``all-balanced``,
    ``all-<profile>``, or a list with one entry per GPU, each a list of profiles or a mapping
    profile -> count."""
    if isinstance(layout, str):
        if layout == "all-balanced":
            return None
        if layout.startswith("all-") and layout[4:] in KNOWN_PROFILES:
            return None
        return (f"{name}: layout {layout!r} is not all-balanced or all-<profile> with a MIG "
                f"profile of {CAPABLE} ({', '.join(KNOWN_PROFILES)})")
    if not isinstance(layout, list) or not layout:
        return (f"{name}: layout must be all-balanced, all-<profile> (e.g. all-3g.40gb) or a "
                "list with one entry per GPU")
    for i, entry in enumerate(layout):
        try:
            profiles = _entry_profiles(entry)
        except ValueError as exc:
            return f"{name}: layout entry {i} (GPU {i}): {exc}"
        unknown = sorted({p for p in profiles if p not in KNOWN_PROFILES})
        if unknown:
            return (f"{name}: layout entry {i} (GPU {i}) names unknown MIG profile(s) "
                    f"{', '.join(unknown)}; known: {', '.join(KNOWN_PROFILES)}")
    return None


def _entry_profiles(entry: Any) -> list[str]:
    """One GPU's entry (a list of profile names, or {name: count}) as profile names; an
    empty entry is refused (mode none leaves GPUs whole)."""
    if isinstance(entry, list):
        if not all(isinstance(p, str) and _PROFILE_RE.fullmatch(p) for p in entry):
            raise ValueError("write a list of MIG profiles like [3g.40gb, 2g.20gb]")
        names = list(entry)
    elif isinstance(entry, dict):
        names = []
        for p, n in entry.items():
            if not isinstance(p, str) or not _PROFILE_RE.fullmatch(p) or isinstance(n, bool) \
                    or not isinstance(n, int) or not 1 <= n <= 7:
                raise ValueError("write {profile: count} like {1g.10gb: 2, 3g.40gb: 1} "
                                 "(counts 1 to 7)")
            names += [p] * n
    else:
        raise ValueError("write a list of MIG profiles like [3g.40gb, 3g.40gb] or "
                         "{1g.10gb: 7}")
    if not names:
        raise ValueError("no MIG profile given; use mode none to leave a GPU whole")
    return names


def place(profiles: Sequence[Profile]) -> list[tuple[Profile, int]] | None:
    """Slices for each profile (largest first, the highest free start first, backtracking),
    or None when they cannot all fit on one GPU."""
    order = sorted(profiles, key=lambda p: (-p.size, p.gi_id))
    used: set[int] = set()
    out: list[tuple[Profile, int]] = []

    def fit(i: int) -> bool:
        if i == len(order):
            return True
        p = order[i]
        for start in sorted(p.starts, reverse=True):
            span = set(range(start, start + p.size))
            if span & used:
                continue
            used.update(span)
            out.append((p, start))
            if fit(i + 1):
                return True
            out.pop()
            used.difference_update(span)
        return False

    return out if fit(0) else None


def wanted(layout: Any, model: str, gpus: int) -> list[tuple[str, ...]]:
    """Profile names per GPU index for a checked layout on ``gpus`` GPUs of ``model``,
    largest first. ValueError (a message naming the model) when the model has no MIG, a
    profile is not one of its own, the entry count is not the GPU count, or it does not fit."""
    family = MODELS.get(model)
    if family is None:
        raise ValueError(f"{model} does not support MIG (MIG runs on {CAPABLE})")
    by_name = {p.name: p for p in family}
    if isinstance(layout, str):
        if layout == "all-balanced":
            per_gpu = [list(BALANCED[id(family)])] * gpus
        else:
            name = layout[4:]
            if name not in by_name:
                raise ValueError(f"{model} has no MIG profile {name} (its profiles: "
                                 f"{', '.join(by_name)})")
            p = by_name[name]
            count = next(n for n in range(8, 0, -1) if place([p] * n) is not None)
            per_gpu = [[name] * count] * gpus
    else:
        if len(layout) != gpus:
            raise ValueError(f"the layout lists {len(layout)} GPU(s) but the host has {gpus} "
                             f"{model}; give one entry per GPU")
        per_gpu = [_entry_profiles(e) for e in layout]
    out: list[tuple[str, ...]] = []
    for index, names in enumerate(per_gpu):
        missing = sorted({n for n in names if n not in by_name})
        if missing:
            raise ValueError(f"GPU {index} ({model}) has no MIG profile {', '.join(missing)} "
                             f"(its profiles: {', '.join(by_name)})")
        placed = place([by_name[n] for n in names])
        if placed is None:
            raise ValueError(f"GPU {index} ({model}): {', '.join(names)} do not fit on one "
                             "GPU (8 memory slices: 1g takes 1, 2g 2, 3g and 4g 4, 7g 8)")
        out.append(tuple(p.name for p, _ in placed))
    return out


def resources(layout: Sequence[Sequence[str]]) -> dict[str, int]:
    """The extended resources a node offers with the device plugin's mixed strategy:
    ``nvidia.com/mig-<profile>`` -> count."""
    out: dict[str, int] = {}
    for names in layout:
        for n in names:
            key = f"nvidia.com/mig-{n}"
            out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def gpu_commands(gpu: GpuMig, target: Sequence[str], family: Mapping[str, Profile]) -> str:
    """A shell snippet taking one GPU from ``gpu`` to ``target`` (profile names; () = MIG off).
    Instances go first (a GPU with instances cannot leave MIG mode); MIG mode is set and must
    read back as current (Hopper applies it at once; Ampere needs a GPU reset, tried here);
    then the GPU instances, largest first, each with its compute instance (-C)."""
    i = str(gpu.index)
    steps = []
    if gpu.instances:
        if gpu.devices:
            steps.append(f"nvidia-smi mig -i {i} -dci")
        steps.append(f"nvidia-smi mig -i {i} -dgi")
    current = (f"nvidia-smi -i {i} --query-gpu=mig.mode.current --format=csv,noheader")
    if not target:
        if gpu.mode == "Enabled" or gpu.pending == "Enabled":
            steps.append(f"nvidia-smi -i {i} -mig 0")
            # Ampere keeps the old mode pending until a GPU reset
            steps.append(f"{{ [ \"$({current})\" = Disabled ] || nvidia-smi -i {i} -r; }}")
        return " && ".join(steps) or "true"
    if gpu.mode != "Enabled":
        steps.append(f"nvidia-smi -i {i} -mig 1")
        steps.append(f"{{ [ \"$({current})\" = Enabled ] || nvidia-smi -i {i} -r; }}")
        stuck = shell(f"GPU {i}: MIG mode is still pending after a GPU reset; stop what uses "
                      "the GPU (DCGM, nvidia-persistenced) or reboot the node, then run again")
        steps.append(f"{{ [ \"$({current})\" = Enabled ] || {{ echo {stuck} >&2; exit 1; }}; }}")
    ids = ",".join(str(family[n].gi_id) for n in target)
    steps.append(f"nvidia-smi mig -i {i} -cgi {ids} -C")
    return " && ".join(steps)


BOOT_SCRIPT = "/etc/gpuk8s/mig-apply.sh"
BOOT_UNIT = "gpuk8s-mig.service"
BOOT_UNIT_PATH = f"/etc/systemd/system/{BOOT_UNIT}"


def boot_script(target: Sequence[Sequence[str]], family: Mapping[str, Profile]) -> bytes:
    """A script that puts the layout back at boot: MIG instances do not survive a reboot
    (MIG mode does), so each GPU whose MIG device count differs is rebuilt, like mig-parted's
    boot-time service. It waits for the driver, and fails loudly when it cannot."""
    lines = ["#!/bin/sh",
             "# Written by gpuk8s (role mig): this node's MIG layout, re-created at boot",
             "# by gpuk8s-mig.service before the kubelet starts. Edit the inventory, not this.",
             "set -eu",
             "tries=0",
             "until nvidia-smi -L >/dev/null 2>&1; do",
             "  tries=$((tries + 1))",
             "  if [ \"$tries\" -ge 120 ]; then echo 'nvidia-smi does not answer' >&2; "
             "exit 1; fi",
             "  sleep 1",
             "done",
             "devices() {",
             "  nvidia-smi -L | awk -v want=\"GPU $1:\" "
             "'/^GPU /{on = ($1 \" \" $2 == want)} on && /^  MIG /{n++} END{print n + 0}'",
             "}"]
    for index, names in enumerate(target):
        ids = ",".join(str(family[n].gi_id) for n in names)
        lines += [f"if [ \"$(devices {index})\" -ne {len(names)} ]; then",
                  f"  nvidia-smi mig -i {index} -dci",
                  f"  nvidia-smi mig -i {index} -dgi",
                  f"  nvidia-smi -i {index} -mig 1",
                  f"  nvidia-smi mig -i {index} -cgi {ids} -C",
                  "fi"]
    return ("\n".join(lines) + "\n").encode()


BOOT_UNIT_TEXT = f"""\
[Unit]
Description=gpuk8s: re-create this node's MIG layout (instances do not survive a reboot)
After=systemd-modules-load.service nvidia-persistenced.service
Before=kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={BOOT_SCRIPT}

[Install]
WantedBy=multi-user.target
""".encode()
