"""A node's verdict from what its accept script read: every check per GPU and per node, each
with its figure, the reference it was held to (and the reference's source) and its verdict.

A node is judged by its slowest GPU: it fails when any GPU fails a check. The reasons are short
codes a taint value can carry (``pcie``, ``ecc``, ``xid-79``, ``missing``, ``slow``, ...), most
serious first."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpuk8s.accept.node import NodeReading
from gpuk8s.accept.references import (
    CORRECTED_ECC_WARN,
    FAIL_BELOW,
    FATAL_XIDS,
    FAULT_CLOCK_REASONS,
    HOT_C,
    METRICS,
    WARN_BELOW,
    reference,
)

_RANK = {"pass": 0, "info": 0, "warn": 1, "fail": 2}
#: a failure's code, in the order a taint names the most serious one
CODES = ("missing", "driver", "xid", "ecc", "pcie", "throttle", "slow", "p2p", "nccl",
         "benchmark")


def _check(check: str, verdict: str, detail: str, code: str = "", **figures: Any
           ) -> dict[str, Any]:
    return {"check": check, "verdict": verdict, "detail": detail,
            **({"code": code} if code and verdict == "fail" else {}), **figures}


def _band(value: float, bar: float) -> str:
    ratio = value / bar if bar else 0.0
    return "fail" if ratio < FAIL_BELOW else "warn" if ratio < WARN_BELOW else "pass"


def _perf(metric: str, value: float, model: str, best: float, code: str,
          ref_key: str | None = None) -> dict[str, Any]:
    unit, label = METRICS[metric]
    ref = reference(model, ref_key or metric)
    if ref is not None:
        bar, against, source = ref.value, f"the {model} reference", ref.source
    else:
        bar, against, source = best, "the node's best GPU (no reference for this model)", \
            "this node"
    verdict = _band(value, bar)
    pct = round(100 * value / bar) if bar else 0
    return _check(metric, verdict, f"{label} {value:g} {unit}, {pct}% of {against} "
                  f"({bar:g})", code, value=value, unit=unit, reference=bar, source=source,
                  ratio=round(value / bar, 3) if bar else None)


def judge(reading: NodeReading, *, expected_gpus: int | None = None) -> dict[str, Any]:
    """The node's checks and verdict. ``expected_gpus``: the PCI GPUs the facts saw (the
    script's own count is used when None)."""
    pci = expected_gpus if expected_gpus is not None else reading.pci_gpus
    node: list[dict[str, Any]] = []
    per_gpu: dict[int, list[dict[str, Any]]] = {g["index"]: [] for g in reading.gpus}
    by_bus = {g["bus"]: g for g in reading.gpus}
    cuda_by_smi = {by_bus[d["bus"]]["index"]: i for i, d in reading.devices.items()
                   if d["bus"] in by_bus}
    model = reading.gpus[0]["name"] if reading.gpus else ""

    # -- presence: PCI, nvidia-smi and CUDA must all see every GPU ---------------------------
    if reading.smi_exit not in (0, None) or (pci and not reading.gpus):
        node.append(_check("driver", "fail", f"nvidia-smi failed (exit {reading.smi_exit}): "
                           + "; ".join(reading.errors[:2]), "driver"))
    elif len(reading.gpus) < pci:
        node.append(_check("missing", "fail", f"nvidia-smi sees {len(reading.gpus)} of the "
                           f"{pci} PCI GPUs: a GPU has fallen off the bus or its driver "
                           "failed", "missing"))
    if reading.cuda_devices is not None and reading.cuda_devices < len(reading.gpus):
        node.append(_check("missing", "fail", f"CUDA sees {reading.cuda_devices} of the "
                           f"{len(reading.gpus)} GPUs nvidia-smi lists (CUDA_VISIBLE_DEVICES "
                           "set for the node's processes, or a GPU CUDA cannot open)",
                           "missing"))
    versions = {g["driver_version"] for g in reading.gpus}
    if reading.module and versions and versions != {reading.module}:
        node.append(_check("driver", "fail", f"kernel module {reading.module}, user-space "
                           f"library {', '.join(sorted(versions))}: reboot to load the "
                           "installed driver", "driver"))

    # -- health per GPU ------------------------------------------------------------------------
    for g in reading.gpus:
        checks = per_gpu[g["index"]]
        s = reading.samples.get(g["index"], {})
        wmax, wnow = g["pcie.link.width.max"], max(g["pcie.link.width.current"] or 0,
                                                   s.get("link_width", 0))
        gmax, gnow = g["pcie.link.gen.max"], s.get("link_gen", 0)
        if wmax and wnow and wnow < wmax:
            checks.append(_check("pcie", "fail", f"PCIe link x{wnow} of x{wmax}", "pcie"))
        elif gmax and gnow and gnow < gmax:
            checks.append(_check("pcie", "fail", f"PCIe link Gen{gnow} under load, the link "
                                 f"can do Gen{gmax}", "pcie"))
        elif wmax:
            checks.append(_check("pcie", "pass", f"PCIe Gen{gnow or '?'} x{wnow} of Gen{gmax} "
                                 f"x{wmax}"))
        unc = g["ecc.errors.uncorrected.volatile.total"]
        cor = g["ecc.errors.corrected.volatile.total"]
        bad = [f"{unc} uncorrected ECC errors since the driver loaded"] if unc else []
        bad += [f"{k.replace('_', ' ').replace('.', ' ')}: Yes" for k in
                ("remapped_rows.pending", "remapped_rows.failure", "retired_pages.pending")
                if g[k] == "Yes"]
        if bad:
            checks.append(_check("ecc", "fail", "; ".join(bad), "ecc"))
        elif cor and cor > CORRECTED_ECC_WARN:
            checks.append(_check("ecc", "warn", f"{cor} corrected ECC errors since the "
                                 "driver loaded"))
        elif g["ecc.mode.current"] == "Disabled":
            checks.append(_check("ecc", "warn", "ECC is disabled"))
        else:
            checks.append(_check("ecc", "pass", "no uncorrected ECC errors, no rows pending"))
        reasons = s.get("reasons", 0)
        faults = [name for bit, name in FAULT_CLOCK_REASONS.items() if reasons & bit]
        if faults:
            checks.append(_check("throttle", "fail", "clocks held down under load by "
                                 + ", ".join(faults), "throttle"))
        temp = s.get("temperature") or g["temperature.gpu"] or 0
        if temp >= HOT_C:
            checks.append(_check("temperature", "warn", f"{temp} C under load"))
        limit, default = g["power.limit"], g["power.default_limit"]
        if limit and default and limit < default - 1:
            checks.append(_check("power", "warn", f"power limit {limit:g} W, below the "
                                 f"default {default:g} W: expect slower figures"))
        if g["persistence_mode"] == "Disabled":
            checks.append(_check("persistence", "warn", "persistence mode is off: the "
                                 "first CUDA call pays the driver's initialisation"))
    for x in reading.xids:
        owner = by_bus.get(x["bus"])
        where = per_gpu[owner["index"]] if owner else node
        fatal = x["xid"] in FATAL_XIDS
        where.append(_check("xid", "fail" if fatal else "warn",
                            f"Xid {x['xid']} at {x['uptime_s']:.0f} s after boot"
                            + (f" ({FATAL_XIDS[x['xid']]}: needs a GPU reset or a reboot)"
                               if fatal else f": {x['text']}"), f"xid-{x['xid']}"))

    # -- performance ---------------------------------------------------------------------------
    bench_ran = bool(reading.figures)
    if not bench_ran and pci:
        why = reading.build or "the benchmark printed no figure"
        node.append(_check("benchmark", "fail", f"no performance figures: {why}"
                           + (f"; {reading.errors[-1]}" if reading.errors else ""),
                           "benchmark"))
    # a GPU other processes use measures slow without a fault: its figures are reported, not
    # judged (accept belongs on an idle or new node; drain one first)
    busy = {g["index"]: reading.busy[g["bus"]] for g in reading.gpus if g["bus"] in reading.busy}
    if busy:
        node.append(_check("busy", "warn", "not judged on speed: other processes use GPU "
                           + ", ".join(f"{i} ({n})" for i, n in sorted(busy.items()))
                           + "; drain the node (kubectl drain) and run accept again"))
    for metric, values in reading.figures.items():
        best = max(values.values(), default=0.0)
        code = "pcie" if metric in ("h2d", "d2h") else "slow"
        for smi_index, cuda_index in cuda_by_smi.items():
            if cuda_index in values:
                c = _perf(metric, values[cuda_index], model, best, code)
                per_gpu[smi_index].append(_unjudged(c) if busy else c)
    smi_of = {c: s for s, c in cuda_by_smi.items()}
    if reading.p2p:
        best = max(p["value"] for p in reading.p2p)
        for p in reading.p2p:
            c = _perf("p2p", p["value"], model, best, "p2p")
            c["detail"] = f"GPU {smi_of.get(p['src'], p['src'])} -> " \
                          f"{smi_of.get(p['dst'], p['dst'])}: " + c["detail"]
            c["pair"] = [smi_of.get(p["src"], p["src"]), smi_of.get(p["dst"], p["dst"])]
            node.append(_unjudged(c) if busy else c)
    n = len(reading.devices)
    if n > 1:
        if "busbw" in reading.nccl:
            ref = reference(model, f"nccl_busbw:{n}")
            if ref is not None:
                c = _perf("nccl_busbw", reading.nccl["busbw"], model, 0.0, "nccl",
                          f"nccl_busbw:{n}")
                node.append(_unjudged(c) if busy else c)
            else:
                node.append(_check("nccl_busbw", "info", f"NCCL all-reduce bus bandwidth "
                                   f"{reading.nccl['busbw']:g} GB/s on {n} GPUs (no "
                                   f"reference for {n}x {model or 'this model'})",
                                   value=reading.nccl["busbw"], unit="GB/s"))
        else:
            node.append(_check("nccl_busbw", "warn", "no all-reduce figure: "
                               + str(reading.nccl.get("missing", "NCCL did not run"))
                               + " (NVIDIA's libnccl2 for the node's CUDA: cuda_nccl: "
                               "true, then bootstrap)"))
    for e in reading.errors:
        if e.startswith("nvidia-smi:"):
            continue
        node.append(_check("benchmark", "warn", e))

    gpus = []
    for g in reading.gpus:
        checks = per_gpu[g["index"]]
        gpus.append({"index": g["index"], "bus": g["bus"], "name": g["name"],
                     "cuda_index": cuda_by_smi.get(g["index"]),
                     "verdict": _worst(c["verdict"] for c in checks), "checks": checks})
    every = node + [c for g in gpus for c in g["checks"]]
    verdict = _worst(c["verdict"] for c in every)
    failed = [c for c in every if c["verdict"] == "fail"]
    codes = sorted({c["code"] for c in failed},
                   key=lambda c: (CODES.index(c.split("-")[0]) if c.split("-")[0] in CODES
                                  else len(CODES), c))
    return {"verdict": verdict, "model": model, "gpus": gpus, "node_checks": node,
            "reasons": codes, "reason_text": _reason_text(failed, gpus),
            "nccl": reading.nccl, "build": reading.build}


def _unjudged(c: dict[str, Any]) -> dict[str, Any]:
    """A figure measured beside other processes: kept, with its reference, but not a verdict."""
    return {**{k: v for k, v in c.items() if k != "code"}, "verdict": "info",
            "detail": c["detail"] + " (not judged: the GPUs were busy)"}


def _worst(verdicts: Iterable[str]) -> str:
    worst = "pass"
    for v in verdicts:
        if _RANK[v] > _RANK[worst]:
            worst = v
    return worst


def _reason_text(failed: list[dict[str, Any]], gpus: list[dict[str, Any]]) -> str:
    """One line for the node's annotation: each failed check, with its GPU."""
    where = {id(c): f"GPU {g['index']} ({g['bus']})" for g in gpus for c in g["checks"]}
    parts = [f"{where[id(c)]}: {c['detail']}" if id(c) in where else c["detail"]
             for c in failed]
    text = "; ".join(parts)
    return text if len(text) <= 1000 else text[:997] + "..."
