"""mig: a host's GPUs split into the MIG instances its ``gpu_sharing`` asks for, or whole again
when it asks for none; read from nvidia-smi, so a matching layout changes nothing. The playbook
runs this role one node at a time and drains a joined node before changing it (like a driver
change): MIG mode and instances cannot change under running CUDA work."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuk8s import mig
from gpuk8s.checks import Rule
from gpuk8s.facts import Fact
from gpuk8s.facts.nvidia import GpuMig, MigState
from gpuk8s.facts.system import Files, PciDevices, Services
from gpuk8s.gpusharing import sharing_of
from gpuk8s.ops import Op, change, files, noop
from gpuk8s.roles import HostContext

RULES: dict[str, Rule] = {}


BOOT_FILES = Files("+" + mig.BOOT_SCRIPT, "+" + mig.BOOT_UNIT_PATH)


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [PciDevices(), MigState(), BOOT_FILES, Services(mig.BOOT_UNIT)]


def plan(ctx: HostContext) -> list[Op]:
    gpus = [d for d in ctx.facts[PciDevices()] if d.is_gpu]
    if not gpus:
        return []
    sharing = sharing_of(ctx.var("gpu_sharing"))
    state = {g.index: g for g in ctx.facts[MigState()]}
    model = gpus[0].model
    if not state and sharing.mode != "mig":
        return [noop("mig | GPUs", "= no MIG asked for; nvidia-smi cannot read the GPUs yet "
                     "(no driver loaded); their MIG mode is read again once it is")]
    if sharing.mode == "mig":
        # preflight refused a layout that does not suit the model
        target = mig.wanted(sharing.layout_value, model, len(gpus))
    else:
        target = [() for _ in gpus]
    family = {p.name: p for p in mig.MODELS.get(model, ())}
    ops: list[Op] = []
    for index, want in enumerate(target):
        op_id = f"mig | GPU {index}"
        have = state.get(index, GpuMig(index, "Disabled" if family else "[N/A]",
                                           "Disabled" if family else "[N/A]"))
        if have.layout == tuple(want) and have.tidy and \
                (want or have.mode in ("Disabled", "[N/A]")):
            ops.append(noop(op_id, f"= GPU {index}: " + (
                f"MIG {' + '.join(want)}" if want else "whole (MIG off)")))
            continue
        before = " + ".join(have.layout) if have.layout else (
            "MIG on, no instances" if have.mode == "Enabled" else "whole")
        after = " + ".join(want) if want else "whole (MIG off)"
        ops.append(change(op_id, f"+ GPU {index}: {before} -> {after}",
                          mig.gpu_commands(have, want, family), timeout=300))
    if any(op.changes for op in ops):
        count = sum(len(w) for w in target)
        ops.append(change("mig | verify", f"+ nvidia-smi -L lists {count} MIG device(s)",
                          verify_command(count), timeout=60))
    return ops + boot_ops(ctx, target, family)


def boot_ops(ctx: HostContext, target: list[tuple[str, ...]],
             family: Mapping[str, mig.Profile]) -> list[Op]:
    """With a MIG layout: the boot-time script and unit that re-create it after a reboot;
    without one, neither."""
    files_ = ctx.facts[BOOT_FILES]
    unit = ctx.facts[Services(mig.BOOT_UNIT)][mig.BOOT_UNIT]
    if not any(target):
        ops = [files.absent(files_[mig.BOOT_UNIT_PATH], "mig | boot unit"),
               files.absent(files_[mig.BOOT_SCRIPT], "mig | boot script")]
        if unit.enabled == "enabled":
            ops.insert(0, change("mig | boot unit enabled", f"+ disable {mig.BOOT_UNIT}",
                                 f"systemctl disable -q {mig.BOOT_UNIT}"))
        if any(op.changes for op in ops):
            ops.append(change("mig | systemd", "+ systemctl daemon-reload",
                              "systemctl daemon-reload"))
        return ops
    ops = [files.content(files_[mig.BOOT_SCRIPT], "mig | boot script",
                         mig.boot_script(target, family), mode="0755"),
           files.content(files_[mig.BOOT_UNIT_PATH], "mig | boot unit", mig.BOOT_UNIT_TEXT)]
    if unit.enabled != "enabled" or ops[1].changes:
        ops.append(change("mig | boot unit enabled", f"+ enable {mig.BOOT_UNIT} (runs at the "
                          "next boot, before the kubelet)", "systemctl daemon-reload",
                          f"systemctl enable -q {mig.BOOT_UNIT}"))
    else:
        ops.append(noop("mig | boot unit enabled", f"= {mig.BOOT_UNIT} enabled"))
    return ops


def verify_command(count: int) -> str:
    return (f"n=$(nvidia-smi -L | grep -c '^  MIG ') || true; if [ \"$n\" -ne {count} ]; then "
            f"echo \"nvidia-smi -L lists $n MIG device(s), expected {count}:\" >&2; "
            "nvidia-smi -L >&2; exit 1; fi")
