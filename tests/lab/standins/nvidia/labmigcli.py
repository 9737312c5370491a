# LAB STAND-IN: not the real nvidia-smi. Test infrastructure for gpuk8s; never shipped to users.
"""``nvidia-smi mig ...`` of the lab's nvidia-smi stand-in: the real subcommand's options and
output formats (tests/fixtures/nvidia/h200-mig/, NVIDIA's MIG user guide) over labmig's state.

Exit codes are NVML's return codes (as nvidia-smi's), except that listing or destroying what is
not there prints the real "...: Not Found" line and exits 0 (captured for -dci)."""

from __future__ import annotations

from typing import Any

import labgpu
from labmig import (
    CI_PROFILE,
    GI_ID,
    IN_USE,
    INVALID,
    NO_PERMISSION,
    NO_RESOURCES,
    NOT_FOUND,
    NOT_FOUND_TEXT,
    ORDER,
    STARTS,
    TOTAL,
    Profile,
    entry,
    free_count,
    free_starts,
    load,
    profile,
    profiles,
    resolve,
    root_ok,
    save,
)


def lgip(gs: list[labgpu.GPU], state: dict[str, Any]) -> str:
    line = "+" + "-" * 79 + "+"
    out = [line, f"| {'GPU instance profiles:':<78}|",
           "| GPU   Name               ID    Instances   Memory     P2P    SM    DEC   ENC  |",
           "|                                Free/Total   GiB              CE    JPEG  OFA  |",
           "|" + "=" * 79 + "|"]
    for n, g in enumerate(gs):
        e = entry(state, g)
        for i, p in enumerate(profiles(g)):
            sm, dec, enc, ce, jpeg, ofa = p.engines
            if n or i:
                out.append(line)
            out += [f"|{g.index:>4}  MIG {p.name:<16}{p.id:>2}     "
                    f"{free_count(e, p)}/{TOTAL[p.id]}        {p.mem_gib:<11.2f}No     "
                    f"{sm:<7}{dec:<6}{enc:<4}|", f"|{'':63}{ce:<6}{jpeg:<6}{ofa:<4}|"]
    return "\n".join([*out, line]) + "\n"


def lgipp(gs: list[labgpu.GPU]) -> str:
    out = []
    for g in gs:
        for p in profiles(g):
            starts = STARTS[p.id]
            word = "Placements:" if len(starts) > 1 else "Placement :"
            out.append(f"GPU {g.index:2d} Profile ID {p.id:2d} {word} "
                       f"{{{','.join(map(str, starts))}}}:{p.size}")
    return "\n".join(out) + "\n"


def _gis(g: labgpu.GPU, e: dict[str, Any], only: set[int] | None) -> list[dict[str, Any]]:
    """The GPU's instances in nvidia-smi's order (profile as -lgip lists them, then ID)."""
    return sorted((gi for gi in e["gis"] if only is None or gi["id"] in only),
                  key=lambda gi: (ORDER.index(gi["profile"]), gi["id"]))


def lgi(gs: list[labgpu.GPU], state: dict[str, Any], only: set[int] | None) -> str:
    line = "+" + "-" * 57 + "+"
    rows = []
    for g in gs:
        for gi in _gis(g, entry(state, g), only):
            p = profile(g, gi["profile"])
            rows += [f"|{g.index:>4}  MIG {p.name:<17}{p.id:>3}{gi['id']:>9}"
                     f"{'':10}{gi['start']}:{gi['size']}{'':5}|", line]
    if not rows:
        return NOT_FOUND_TEXT["gi"] + "\n"
    return "\n".join([line, f"| {'GPU instances:':<56}|",
                      "| GPU   Name               Profile  Instance   Placement  |",
                      "|                            ID       ID       Start:Size |",
                      "|" + "=" * 57 + "|", *rows]) + "\n"


def lci(gs: list[labgpu.GPU], state: dict[str, Any], only: set[int] | None) -> str:
    line = "+" + "-" * 68 + "+"
    rows = []
    for g in gs:
        for gi in _gis(g, entry(state, g), only):
            p = profile(g, gi["profile"])
            for ci in sorted(gi["cis"]):
                rows += [f"|{g.index:>4}{gi['id']:>7}       MIG {p.ci_name:<15}"
                         f"{CI_PROFILE[p.id]:>3}{ci:>10}{'':10}0:{gi['size']}{'':5}|", line]
    if not rows:
        return NOT_FOUND_TEXT["ci"] + "\n"
    return "\n".join([line, f"| {'Compute instances:':<67}|",
                      "| GPU     GPU       Name             Profile   Instance   Placement  |",
                      "|       Instance                       ID        ID       Start:Size |",
                      f"|         ID{'':57}|", "|" + "=" * 68 + "|", *rows]) + "\n"


def _ci_line(g: labgpu.GPU, gi: dict[str, Any], p: Profile) -> str:
    return (f"Successfully created compute instance ID  0 on GPU {g.index:2d} GPU instance ID "
            f"{gi['id']:2d} using profile MIG {p.ci_name} (ID {CI_PROFILE[p.id]:2d})")


def cgi(gs: list[labgpu.GPU], state: dict[str, Any], tokens: list[str],
        with_ci: bool) -> tuple[list[str], str, int]:
    """-cgi: (lines, failure, exit code), creating on every selected GPU in turn."""
    out: list[str] = []
    for g in gs:
        e = entry(state, g)
        for tok in tokens:
            name, _, at = tok.partition(":")
            p = resolve(g, name)
            free = free_starts(e, p) if p else []
            if p is None or (at and not (at.isdigit() and int(at) in STARTS[p.id])):
                why, code = "Invalid Argument", INVALID
            elif not free or (at and int(at) not in free):
                why, code = "Insufficient Resources", NO_RESOURCES
            else:
                start = int(at) if at else free[0]
                gi = {"id": GI_ID[(p.size, start)], "profile": p.id, "start": start,
                      "size": p.size, "cis": [0] if with_ci else []}
                e["gis"].append(gi)
                out.append(f"Successfully created GPU instance ID {gi['id']:2d} on GPU "
                           f"{g.index:2d} using profile MIG {p.name} (ID {p.id:2d})")
                out += [_ci_line(g, gi, p)] if with_ci else []
                continue
            out.append(f"Unable to create a GPU instance on GPU {g.index:2d} using profile "
                       f"{tok}: {why}")
            return out, f"Failed to create GPU instances: {why}", code
    return out, "", 0


def cci(gs: list[labgpu.GPU], state: dict[str, Any], only: set[int] | None,
        tokens: list[str]) -> tuple[list[str], str, int]:
    """-cci: the full-size compute instance on each (selected) GPU instance lacking one."""
    out: list[str] = []
    seen = False
    for g in gs:
        for gi in _gis(g, entry(state, g), only):
            seen = True
            p = profile(g, gi["profile"])
            bad = [t for t in tokens if t not in (str(CI_PROFILE[p.id]), p.ci_name)]
            if bad or (gi["cis"] and only is not None):
                why, code = ("Invalid Argument", INVALID) if bad else \
                    ("Insufficient Resources", NO_RESOURCES)
                out.append(f"Unable to create a compute instance on GPU {g.index:2d} GPU "
                           f"instance ID {gi['id']:2d} using profile "
                           f"{(bad or [str(CI_PROFILE[p.id])])[0]}: {why}")
                return out, f"Failed to create compute instances: {why}", code
            if not gi["cis"]:
                gi["cis"] = [0]
                out.append(_ci_line(g, gi, p))
    if not seen:
        return out, NOT_FOUND_TEXT["gi"], NOT_FOUND
    return out, "", 0


def dci(gs: list[labgpu.GPU], state: dict[str, Any], only: set[int] | None,
        cis: set[int] | None) -> tuple[list[str], str, int]:
    out = []
    for g in gs:
        for gi in sorted(_gis(g, entry(state, g), only), key=lambda x: x["id"]):
            for ci in [c for c in sorted(gi["cis"]) if cis is None or c in cis]:
                gi["cis"].remove(ci)
                out.append(f"Successfully destroyed compute instance ID {ci:2d} from GPU "
                           f"{g.index:2d} GPU instance ID {gi['id']:2d}")
    return (out, "", 0) if out else (out, NOT_FOUND_TEXT["ci"], 0)


def dgi(gs: list[labgpu.GPU], state: dict[str, Any],
        only: set[int] | None) -> tuple[list[str], str, int]:
    out = []
    for g in gs:
        e = entry(state, g)
        for gi in sorted(_gis(g, e, only), key=lambda x: x["id"]):
            if gi["cis"]:   # its compute instances hold it
                out.append(f"Unable to destroy GPU instance ID {gi['id']:2d} from GPU "
                           f"{g.index:2d}: In use by another client")
                return out, "Failed to destroy GPU instances: In use by another client", IN_USE
            e["gis"].remove(gi)
            out.append(f"Successfully destroyed GPU instance ID {gi['id']:2d} from GPU "
                       f"{g.index:2d}")
    return (out, "", 0) if out else (out, NOT_FOUND_TEXT["gi"], 0)


ACTIONS = {"-lgip": "lgip", "--list-gpu-instance-profiles": "lgip",
           "-lgipp": "lgipp", "--list-gpu-instance-possible-placements": "lgipp",
           "-lgi": "lgi", "--list-gpu-instances": "lgi", "-cgi": "cgi",
           "--create-gpu-instance": "cgi", "-dgi": "dgi", "--destroy-gpu-instance": "dgi",
           "-lci": "lci", "--list-compute-instances": "lci", "-cci": "cci",
           "--create-compute-instance": "cci", "-dci": "dci",
           "--destroy-compute-instance": "dci"}
VALUED = {"-i": "i", "--id": "i", "-gi": "gi", "--gpu-instance-id": "gi", "-ci": "ci",
          "--compute-instance-id": "ci", "-cgi": "cgi", "--create-gpu-instance": "cgi"}
MIG_USAGE = """    mig -- Multi Instance GPU management (gpuk8s LAB STAND-IN).

    Usage: nvidia-smi mig [options]

    -h,    --help                         Print usage information and exit.
    -i,    --id=                          GPU indexes, PCI bus IDs or UUIDs (comma-separated).
    -gi,   --gpu-instance-id=             GPU instance IDs (comma-separated).
    -ci,   --compute-instance-id=         Compute instance IDs (comma-separated).
    -lgip, --list-gpu-instance-profiles   List supported GPU instance profiles.
    -lgipp,--list-gpu-instance-possible-placements  List their possible placements.
    -cgi,  --create-gpu-instance=         Create GPU instances: profile IDs or names, each
                                          optionally with :<placement start>.
    -C,    --default-compute-instance     With -cgi: also create the default compute instance.
    -lgi,  --list-gpu-instances           List GPU instances.
    -dgi,  --destroy-gpu-instance         Destroy GPU instances.
    -cci,  --create-compute-instance      Create the default (full-size) compute instance.
    -lci,  --list-compute-instances       List compute instances.
    -dci,  --destroy-compute-instance     Destroy compute instances.
"""


def _ids(value: str | None) -> set[int] | None:
    return None if value is None else {int(v) for v in value.split(",") if v.strip().isdigit()}


def cli(argv: list[str], gs: list[labgpu.GPU]) -> tuple[str, int]:
    """``nvidia-smi mig ARGS`` on the node's GPUs: (stdout, exit code)."""
    opts: dict[str, str] = {}
    action, with_ci, tokens = "", False, []
    i = 0
    while i < len(argv):
        a, _, inline = argv[i].partition("=")
        if a in ("-h", "--help"):
            return MIG_USAGE, 0
        if a in ("-C", "--default-compute-instance"):
            with_ci = True
        elif a in ACTIONS or a in VALUED:
            if a in VALUED:
                if not inline and i + 1 >= len(argv):
                    return "Option \"" + a + "\" is missing a value.\n", INVALID
                value = inline or argv[i + 1]
                i += 0 if inline else 1
                opts[VALUED[a]] = value
            if a in ACTIONS:
                action = ACTIONS[a]
                if action == "cci" and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                    i += 1
                    tokens = argv[i].split(",")
        else:
            return ("Invalid combination of input arguments. Please run 'nvidia-smi mig -h' "
                    "for help.\n"), INVALID
        i += 1
    if not action:
        return MIG_USAGE, 0
    sel = labgpu.select(gs, opts.get("i"))
    if sel is None:
        return "No devices were found\n", NOT_FOUND
    state = load()
    capable = [g for g in sel if profiles(g)]
    if action in ("lgip", "lgipp") and capable:
        return lgip(capable, state) if action == "lgip" else lgipp(capable), 0
    enabled = [g for g in capable if entry(state, g)["mode"] == "Enabled"]
    if not enabled:
        return "No MIG-enabled devices found.\n", NOT_FOUND if action in ("cgi", "cci") else 0
    only, cis = _ids(opts.get("gi")), _ids(opts.get("ci"))
    if action == "lgi":
        return lgi(enabled, state, only), 0
    if action == "lci":
        return lci(enabled, state, only), 0
    if not root_ok():
        what = {"cgi": "create GPU instances", "cci": "create compute instances",
                "dgi": "destroy GPU instances", "dci": "destroy compute instances"}[action]
        return f"Failed to {what}: Insufficient Permissions\n", NO_PERMISSION
    if action == "cgi":
        lines, fail, code = cgi(enabled, state, opts["cgi"].split(","), with_ci)
    elif action == "cci":
        lines, fail, code = cci(enabled, state, only, tokens)
    elif action == "dci":
        lines, fail, code = dci(enabled, state, only, cis)
    else:
        lines, fail, code = dgi(enabled, state, only)
    save(state)
    return "".join(f"{ln}\n" for ln in [*lines, fail] if ln), code
