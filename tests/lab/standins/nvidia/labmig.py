# LAB STAND-IN: not the real NVML MIG. Test infrastructure for gpuk8s; never shipped to users.
"""MIG (Multi-Instance GPU) of the lab's fake GPUs, for the nvidia-smi stand-in.

State: /var/lib/gpuk8s-lab/nvidia/mig.json (under $GPUK8S_LAB_ROOT), keyed by the GPU's PCI
sysfs name: {"0000:00:06.0": {"mode": "Enabled", "gis": [{"id": 2, "profile": 9, "start": 4,
"size": 4, "cis": [0]}], "pending": "Disabled", "boot_id": "..."}}. No file (or no entry): MIG
Disabled, no instances. "pending" is there only while it differs from "mode" (Ampere needs a
GPU reset); "boot_id" is the boot that wrote the entry: MIG mode survives a reboot (the real one
lives in the InfoROM), GPU and compute instances do not, and a pending mode takes effect.
A MIG mode change is refused ("In use by another client") while the lab's kubelet lists pods
holding the node's GPUs in /run/gpuk8s-lab/gpu-clients (its GPU DaemonSets, pods given GPUs),
as the driver refuses it while NVML clients have the GPU open.

Formats: the real captures in tests/fixtures/nvidia/h200-mig/ and NVIDIA's MIG user guide.
Profile tables: H200 from the capture; H100 80GB HBM3 and A100-SXM4-80GB from published
`nvidia-smi mig -lgip` outputs (the MIG user guide, NVIDIA/mig-parted issue 97)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

import labgpu

STATE_FILE = "/var/lib/gpuk8s-lab/nvidia/mig.json"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
#: GPU instance profile IDs in nvidia-smi's order (-lgip, and the sort key of -lgi/-lci)
ORDER = (19, 20, 15, 14, 9, 5, 0)
SIZE = {19: 1, 20: 1, 15: 2, 14: 2, 9: 4, 5: 4, 0: 8}
STARTS = {19: (0, 1, 2, 3, 4, 5, 6), 20: (0, 1, 2, 3, 4, 5, 6), 15: (0, 2, 4, 6),
          14: (0, 2, 4), 9: (0, 4), 5: (0,), 0: (0,)}
TOTAL = {19: 7, 20: 1, 15: 4, 14: 3, 9: 2, 5: 1, 0: 1}
#: where the driver puts a GPU instance when no placement is given, best first: the real
#: driver's picks in the MIG user guide's A100 examples (1g at 6, then 4; 2g at 4, 0, 2; the
#: first 3g at 4, as on the captured H200). The 1g order after 6,4 and the 1g.20gb order are
#: not documented (guessed: upper half first, then the lowest start).
PREFERENCE = {1: (6, 4, 5, 0, 1, 2, 3), 2: (6, 4, 0, 2), 4: (4, 0), 8: (0,)}
#: the full-size compute instance's profile ID per GPU instance profile (1g.20gb-like
#: profiles use 1_SLICE_REV1 = 7, as a real H100 printed for 1g.20gb)
CI_PROFILE = {19: 0, 20: 0, 15: 7, 14: 1, 9: 2, 5: 3, 0: 4}
#: engines per profile: SM, DEC, ENC, CE, JPEG, OFA (as -lgip prints them)
Engines = dict[int, tuple[int, ...]]
_HOPPER: Engines = {19: (16, 1, 0, 1, 1, 0), 20: (16, 1, 0, 1, 1, 1), 15: (26, 1, 0, 1, 1, 0),
                    14: (32, 2, 0, 2, 2, 0), 9: (60, 3, 0, 3, 3, 0), 5: (64, 4, 0, 4, 4, 0),
                    0: (132, 7, 0, 8, 7, 1)}
_AMPERE: Engines = {19: (14, 0, 0, 1, 0, 0), 20: (14, 1, 0, 1, 1, 1), 15: (14, 1, 0, 1, 0, 0),
                    14: (28, 1, 0, 2, 0, 0), 9: (42, 2, 0, 3, 0, 0), 5: (56, 2, 0, 4, 0, 0),
                    0: (98, 5, 0, 7, 1, 1)}
_80GB = ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
#: device id -> (profile names in ORDER, memory GiB in ORDER, engines)
MODELS: dict[int, tuple[tuple[str, ...], tuple[float, ...], Engines]] = {
    0x2335: (("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
             (16.00, 16.00, 32.50, 32.50, 69.75, 69.75, 140.00), _HOPPER),
    0x2330: (_80GB, (9.75, 9.75, 19.62, 19.62, 39.50, 39.50, 79.25), _HOPPER),
    0x20B2: (_80GB, (9.50, 9.50, 19.50, 19.50, 39.25, 39.25, 79.00), _AMPERE),
}
#: GPU instance IDs by (size, start): the lab's rule, consistent with the capture (3g at 4:4
#: got ID 2) and the user guide's A100 examples; real Hopper drivers number more freely
GI_ID = {(8, 0): 0, (4, 0): 1, (4, 4): 2, (2, 0): 3, (2, 2): 4, (2, 4): 5, (2, 6): 6,
         **{(1, s): 7 + s for s in range(7)}}
#: NVML return codes, which nvidia-smi exits with
INVALID, NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND, IN_USE, NO_RESOURCES = 2, 3, 4, 6, 19, 23
NOT_FOUND_TEXT = {"gi": "No GPU instances found: Not Found",
                  "ci": "No compute instances found: Not Found"}


@dataclass(frozen=True)
class Profile:
    id: int
    name: str
    mem_gib: float
    engines: tuple[int, ...]   # SM, DEC, ENC, CE, JPEG, OFA

    @property
    def size(self) -> int:
        return SIZE[self.id]

    @property
    def ci_name(self) -> str:
        """The compute instance profile's name: a "+me" GI's CI prints without "+me"."""
        return self.name.split("+")[0]


def profiles(g: labgpu.GPU) -> list[Profile]:
    model = MODELS.get(g.device_id) if g.mig_capable else None
    if model is None:
        return []
    names, mems, engines = model
    return [Profile(p, n, m, engines[p]) for p, n, m in zip(ORDER, names, mems, strict=True)]


def profile(g: labgpu.GPU, pid: int) -> Profile:
    return next(p for p in profiles(g) if p.id == pid)


def resolve(g: labgpu.GPU, token: str) -> Profile | None:
    """A -cgi profile token: an ID or a short name (3g.71gb)."""
    for p in profiles(g):
        if token == p.name or (token.isdigit() and int(token) == p.id):
            return p
    return None


# ------------------------------------------------------------------ state
def boot_id() -> str:
    return labgpu.read(BOOT_ID) or ""


def load() -> dict[str, Any]:
    try:
        with open(labgpu.path(STATE_FILE)) as fh:
            state = json.load(fh)
    except (OSError, ValueError):
        return {}
    boot = boot_id()
    for e in state.values():
        if boot and e.get("boot_id") and e["boot_id"] != boot:
            e["gis"] = []   # a reboot: instances are gone, a pending mode applies
            e["mode"] = e.pop("pending", e.get("mode", "Disabled"))
            e["boot_id"] = boot
    return state


def save(state: dict[str, Any]) -> None:
    full = labgpu.path(STATE_FILE)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    boot = boot_id()
    for name, e in list(state.items()):
        if e.get("pending") == e.get("mode"):
            e.pop("pending", None)
        if e.get("mode") != "Enabled" and not e.get("gis") and "pending" not in e:
            del state[name]   # nothing to remember: the default
        elif boot:
            e["boot_id"] = boot
    tmp = f"{full}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(state, fh, indent=1, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, full)


def entry(state: dict[str, Any], g: labgpu.GPU) -> dict[str, Any]:
    """The GPU's state (created empty in ``state``); in a container given MIG devices, the
    visible ones only (the state file is not there: they are decoded from their UUIDs)."""
    mine = visible_instances(g)
    if mine is not None:
        return {"mode": "Enabled", "gis": mine}
    return state.setdefault(g.sysfs_name, {"mode": "Disabled", "gis": []})


def modes(g: labgpu.GPU, state: dict[str, Any] | None = None) -> tuple[str, str]:
    """(current, pending) MIG mode; [N/A] on a GPU without MIG."""
    if not g.mig_capable:
        return "[N/A]", "[N/A]"
    e = entry(load() if state is None else state, g)
    return e["mode"], e.get("pending", e["mode"])


# ------------------------------------------------------------------ MIG devices
def mig_uuid(gpu_uuid: str, gi: int, ci: int, pid: int) -> str:
    h = hashlib.sha256(f"gpuk8s-lab-mig:{gpu_uuid}:{gi}:{ci}:{pid}".encode()).hexdigest()
    return (f"MIG-{h[0:8]}-{h[8:12]}-5{h[13:16]}-{'89ab'[int(h[16], 16) % 4]}{h[17:20]}-"
            f"{h[20:32]}")


def visible_instances(g: labgpu.GPU) -> list[dict[str, Any]] | None:
    """In a container whose visible devices name MIG devices (labgpu.VISIBLE_ENV): this
    GPU's visible GPU instances, each with its one compute instance, found by their UUIDs
    (None outside such a container)."""
    wanted = {u for u in os.environ.get(labgpu.VISIBLE_ENV, "").split(",") if u}
    if not any(u.startswith("MIG-") for u in wanted):
        return None
    out = []
    for (size, start), gi in GI_ID.items():
        for p in profiles(g):
            if p.size == size and start in STARTS[p.id] and \
                    mig_uuid(g.uuid, gi, 0, p.id) in wanted:
                out.append({"id": gi, "profile": p.id, "start": start, "size": size,
                            "cis": [0]})
    return out


def owns(g: labgpu.GPU) -> bool:
    """Whether the container's visible devices name one of this GPU's MIG devices."""
    return bool(visible_instances(g))


@dataclass(frozen=True)
class Device:
    gpu: labgpu.GPU
    gi: int
    ci: int
    profile: Profile
    index: int   # the MIG device's number on its GPU (-L "Device N", the table's MIG Dev)

    @property
    def uuid(self) -> str:
        return mig_uuid(self.gpu.uuid, self.gi, self.ci, self.profile.id)


def devices(g: labgpu.GPU, state: dict[str, Any] | None = None) -> list[Device]:
    """MIG devices (a GPU instance with a compute instance), by GPU instance then CI ID."""
    e = entry(load() if state is None else state, g)
    if not g.mig_capable or e["mode"] != "Enabled":
        return []
    pairs = sorted((gi["id"], ci, gi["profile"]) for gi in e["gis"] for ci in gi["cis"])
    return [Device(g, gi, ci, profile(g, pid), n) for n, (gi, ci, pid) in enumerate(pairs)]


def list_lines(g: labgpu.GPU) -> list[str]:
    return [f"  MIG {d.profile.name:<11} Device {d.index:2d}: (UUID: {d.uuid})"
            for d in devices(g)]


def used_mib(p: Profile) -> int:
    return {1: 15, 2: 29, 4: 44, 8: 87}[p.size]


def device_table(gs: list[labgpu.GPU]) -> list[str]:
    """nvidia-smi's "MIG devices:" table (580 layout) when a GPU has MIG on, else []. Used
    memory and BAR1 sizes are the lab's (an idle instance, BAR1 = 61 % of its memory)."""
    state = load()
    on = [g for g in gs if modes(g, state)[0] == "Enabled"]
    if not on:
        return []
    sep = "+------------------+----------------------------------+-----------+" + "-" * 23 + "+"
    out = ["", "+" + "-" * 89 + "+", f"| {'MIG devices:':<88}|", sep,
           "| GPU  GI  CI  MIG |              Shared Memory-Usage |        Vol|        Shared"
           "         |",
           "|      ID  ID  Dev |                Shared BAR1-Usage | SM     Unc| CE ENC  DEC  OFA"
           "  JPG |",
           "|                  |                                  |        ECC|" + " " * 23 + "|",
           "|==================+==================================+===========+" + "=" * 23 + "|"]
    devs = [d for g in on for d in devices(g, state)]
    if not devs:
        return [*out, f"|  {'No MIG devices found':<87}|", "+" + "-" * 89 + "+"]
    for d in devs:
        p = d.profile
        mem = round(p.mem_gib * 1024)
        sm, dec, enc, ce, jpeg, ofa = p.engines
        out += [f"|{d.gpu.index:>3}{d.gi:>5}{d.ci:>4}{d.index:>4}  |"
                f"{str(used_mib(p)) + 'MiB':>19} / {str(mem) + 'MiB':>8}    | {sm:<3}{0:>6} |"
                f"{ce:>3}{enc:>4}{dec:>5}{ofa:>5}{jpeg:>5} |",
                f"|{'':18}|{'0MiB':>19} / {str(round(mem * 0.61)) + 'MiB':>8}    |{'':11}|"
                f"{'':23}|", sep]
    return out


# ------------------------------------------------------------------ mode and reset
def root_ok() -> bool:
    return os.geteuid() == 0 or labgpu.root() != "/"


def gpu_clients() -> list[str]:
    """The pods the lab's kubelet says hold this node's GPUs (its GPU_CLIENTS file)."""
    try:
        with open(labgpu.path("/run/gpuk8s-lab/gpu-clients")) as f:
            return f.read().split()
    except OSError:
        return []


def set_mode(gs: list[labgpu.GPU], value: str) -> tuple[str, int]:
    """nvidia-smi [-i N] -mig 0|1: (output, exit code)."""
    if value.upper() not in ("0", "1", "ENABLED", "DISABLED"):
        return f'Invalid value "{value}" for MIG mode. Please run \'nvidia-smi -h\' for help.\n', 2
    on = value.upper() in ("1", "ENABLED")
    verb, word = ("enable", "Enabled") if on else ("disable", "Disabled")
    state = load()
    out: list[str] = []
    for n, g in enumerate(gs):
        fail = ""
        e = entry(state, g)
        if not g.mig_capable:
            fail = "Not Supported"
        elif not root_ok():
            fail = "Insufficient Permissions"
        elif not on and e["gis"]:
            fail = "In use by another client"
        elif g.architecture != "Ampere" and e["mode"] != word and gpu_clients():
            fail = "In use by another client"   # Ampere's reset is only left pending: below
        if fail:
            out += [f"Unable to {verb} MIG Mode for GPU {g.bus_id}: {fail}",
                    "Terminating early due to previous errors."]
            if n:
                save(state)   # what the GPUs before this one got
            code = {"Not Supported": NOT_SUPPORTED, "In use by another client": IN_USE}
            return "\n".join(out) + "\n", code.get(fail, NO_PERMISSION)
        if g.architecture == "Ampere" and e["mode"] != word:
            # the driver's GPU reset fails while a client (nvidia-persistenced) holds the GPU
            e["pending"] = word
            out += [f"Warning: MIG mode is in pending {verb} state for GPU {g.bus_id}:In use by "
                    "another client",
                    f"{g.bus_id} is currently being used by one or more other processes (e.g. "
                    "CUDA application or a monitoring application such as another instance of "
                    "nvidia-smi). Please first kill all processes using the device and retry "
                    "the command or reboot the system to make MIG mode effective."]
            continue
        e["mode"] = word
        e.pop("pending", None)
        out.append(f"{word} MIG Mode for GPU {g.bus_id}")
        if labgpu.persistence_mode() != "Enabled":
            out += ["", f"Warning: persistence mode is disabled on device {g.bus_id}. See the "
                    "Known Issues section of the nvidia-smi(1) man page for more information. "
                    "Run with [--help | -h] switch to get more information on how to enable "
                    "persistence mode."]
    save(state)
    return "\n".join([*out, "All done."]) + "\n", 0


def reset(gs: list[labgpu.GPU]) -> tuple[str, int]:
    """nvidia-smi [-i N] -r: a pending MIG mode takes effect; MIG instances are gone."""
    if not root_ok():
        return "".join(f"Unable to reset GPU {g.bus_id}: Insufficient Permissions\n"
                       for g in gs), NO_PERMISSION
    state = load()
    for g in gs:
        e = entry(state, g)
        e["mode"] = e.pop("pending", e["mode"])
        e["gis"] = []
    save(state)
    return "".join(f"GPU {g.bus_id} was successfully reset.\n" for g in gs) + "All done.\n", 0


# ------------------------------------------------------------------ placement
def free_starts(e: dict[str, Any], p: Profile) -> list[int]:
    """Free valid starts of ``p``, the driver's pick first."""
    used = {s for gi in e["gis"] for s in range(gi["start"], gi["start"] + gi["size"])}
    if sum(gi["profile"] == p.id for gi in e["gis"]) >= TOTAL[p.id]:
        return []
    return [s for s in PREFERENCE[p.size] if s in STARTS[p.id]
            and not used & set(range(s, s + p.size))]


def free_count(e: dict[str, Any], p: Profile) -> int:
    probe = {"gis": list(e["gis"])}
    n = 0
    while starts := free_starts(probe, p):
        probe["gis"].append({"profile": p.id, "start": starts[0], "size": p.size})
        n += 1
    return n

