"""gpuk8s benchmark on the lab (``invoke bench``; not part of the test suite).

For each lab size it boots the lab, bootstraps it once, then times, several times each, and
reports medians:

- floor: raw paramiko, one connection and one exec of the same fact probe gpuk8s sends, per
  host, all hosts in parallel (bench/floor.py, its own process);
- no-op ``invoke bootstrap --yes`` on the converged lab;
- no-op ``invoke plan``;

with each one's ratio to the floor, the SSH connections and exec channels per host per step
(from report.json) and the peak RSS (wait4). The 4-node size is the default lab; its first
bootstrap (package_cache on) gives the wall time per phase. Package cache: bytes the cache
host's apt-cacher-ng fetched from its upstream (the lab host's apt-cacher-ng) for a 1-node and
the 4-node lab, and, for comparison, what the 4 nodes fetch without the cache.

With ``--facts``, only this instead (4 nodes unless ``--sizes`` says otherwise): at each
size, after the first bootstrap, each fact's time on the node (and that of each read facts
share) in one no-op probe per host, sent as the floor sends it, its marker lines read with
``date`` to the nanosecond (gpuk8s.facts.probe.probe_times), slowest first.

Every process runs with wall times taken around the whole process (interpreter start-up
included), on this machine, against lab nodes over real SSH.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuk8s.facts import Fact  # noqa: E402
from gpuk8s.facts.probe import DATE, build_probe, probe_times  # noqa: E402
from gpuk8s.gather import fact_requests  # noqa: E402
from gpuk8s.inventory import load_inventory  # noqa: E402
from gpuk8s.session import role_vars  # noqa: E402
from tests.lab.lab import Lab  # noqa: E402
from tests.lab.paths import services_dir  # noqa: E402
from tests.lab.topology import Topology  # noqa: E402

INVOKE = str(ROOT / ".venv" / "bin" / "invoke")
PYTHON = str(ROOT / ".venv" / "bin" / "python")
ACNG_LOG = "/var/log/apt-cacher-ng/apt-cacher.log"
#: the light floor's probe: what any tool asks first of a box (its kernel and OS), one exec
LIGHT_PROBE = "uname -srm; cat /etc/os-release"
#: every bootstrapped lab of the bench runs with the package cache on
SETS = ("--set", "package_cache=true")


@dataclass
class Sample:
    wall: float
    rss_kb: int
    code: int
    output: str
    report: dict[str, Any] = field(default_factory=dict)


def run_process(argv: Sequence[str], runs_dir: Path | None = None) -> Sample:
    """Run one process; wall time around it and its peak RSS (wait4)."""
    env = dict(os.environ)
    if runs_dir is not None:
        env["GPUK8S_RUNS_DIR"] = str(runs_dir)
    with tempfile.TemporaryFile() as out:
        started = time.perf_counter()
        proc = subprocess.Popen(list(argv), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    report: dict[str, Any] = {}
    if runs_dir is not None:
        found = sorted(runs_dir.glob("*/report.json"), key=lambda p: p.stat().st_mtime)
        if found:
            report = json.loads(found[-1].read_text())
    return Sample(wall, usage.ru_maxrss, proc.returncode, text, report)


def gpuk8s(command: str, inventory: Path, work: Path, *extra: str) -> Sample:
    runs = Path(tempfile.mkdtemp(prefix=f"{command}-", dir=work))
    args = [INVOKE, command, "-i", str(inventory), *extra]
    if command == "bootstrap":
        args.append("--yes")
    sample = run_process(args, runs)
    if sample.code != 0:
        raise SystemExit(f"bench: invoke {command} failed (exit {sample.code}):\n"
                         + sample.output[-3000:])
    return sample


def floor_hosts(inventory: Path, outputs: Path | None = None
                ) -> tuple[list[dict[str, Any]], dict[str, tuple[list[Fact[Any]], str]]]:
    """Every host's connection settings and the probe gpuk8s would send it (its facts, as
    gather asks them), and each host's (requests, marker). With ``outputs`` (a folder), the
    probes read their marker times with ``date`` and floor.py keeps what each printed there,
    as <host>.out."""
    inv = load_inventory(inventory, overrides=[SETS[1]])
    hosts, probes = [], {}
    for h in inv.hosts.values():
        requests = fact_requests(role_vars(h))
        script, marker = build_probe(requests, **({"clock": DATE} if outputs else {}))
        probes[h.name] = (requests, marker)
        hosts.append({"name": h.name, "address": h.address, "port": h.port, "user": h.user,
                      "key_file": h.private_key_file, "known_hosts": h.known_hosts_files[0],
                      "script": script,
                      **({"output": str(outputs / f"{h.name}.out")} if outputs else {})})
    return hosts, probes


def floor(hosts_file: Path) -> Sample:
    sample = run_process([PYTHON, str(ROOT / "bench" / "floor.py"), str(hosts_file)])
    if sample.code != 0:
        raise SystemExit(f"bench: floor failed: {sample.output[-2000:]}")
    return sample


# -- report.json -------------------------------------------------------------------------------
def round_trips(report: dict[str, Any]) -> dict[str, Any]:
    """Connections per host over the whole run; max execs per host in each step."""
    steps = report.get("round_trips", [])
    connects: dict[str, int] = {}
    per_step: list[tuple[str, int]] = []
    for step in steps:
        hosts = step["hosts"]
        for h, c in hosts.items():
            connects[h] = connects.get(h, 0) + c["connects"]
        per_step.append((step["step"], max((c["execs"] for c in hosts.values()), default=0)))
    return {"connects_per_host_max": max(connects.values(), default=0),
            "execs_per_host_per_step_max": per_step}


def phase_times(report: dict[str, Any]) -> list[tuple[str, float]]:
    """Wall time of every step of the run (connect, facts, each phase with its facts)."""
    return [(s["step"], s["elapsed"]) for s in report.get("round_trips", [])]


# -- package cache -----------------------------------------------------------------------------
def acng_bytes(text: str, clients: set[str] | None = None) -> dict[str, int]:
    """Sum an apt-cacher-ng transfer log: I = fetched from upstream, O = served to clients."""
    out = {"I": 0, "O": 0}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) >= 5 and parts[1] in out and parts[2].isdigit() and (
                clients is None or parts[3] in clients):
            out[parts[1]] += int(parts[2])
    return out


def lab_host_log() -> Path:
    return services_dir() / "apt-cacher-ng" / "apt-cacher.log"


def served_by_lab_host(since: int, clients: set[str]) -> int:
    """Bytes the lab host's apt-cacher-ng (the cluster's upstream) served to ``clients``."""
    path = lab_host_log()
    if not path.exists():
        return 0
    text = path.read_text(errors="replace")
    tail = text[since:]
    return acng_bytes(tail, clients)["O"]


# -- lab ---------------------------------------------------------------------------------------
def boot(topology: Topology) -> tuple[Lab, Path]:
    lab = Lab()
    t0 = time.monotonic()
    lab.up(topology, reuse=False, timeout=120 + 3 * len(topology.nodes))
    print(f"bench: {len(topology.nodes)} nodes booted in {time.monotonic() - t0:.1f} s",
          flush=True)
    return lab, lab.inventory_path


def first_bootstrap(lab: Lab, inventory: Path, work: Path, cache: bool) -> dict[str, Any]:
    log = lab_host_log()
    since = log.stat().st_size if log.exists() else 0
    nodes = lab.nodes()
    extra = ["--set", f"package_cache={'true' if cache else 'false'}"]
    sample = gpuk8s("bootstrap", inventory, work, *extra)
    cp = next(n for n in nodes if n.role == "control_plane")
    result: dict[str, Any] = {"nodes": len(nodes), "package_cache": cache,
                              "wall": round(sample.wall, 2), "steps": phase_times(sample.report),
                              "round_trips": round_trips(sample.report),
                              "upstream_bytes_served_to_cluster": served_by_lab_host(
                                  since, {n.ip for n in nodes})}
    if cache:
        rc, text, err = lab.ssh(cp.name, f"cat {ACNG_LOG}")
        if rc != 0:
            raise SystemExit(f"bench: cannot read {ACNG_LOG} on {cp.name}: {err}")
        counted = acng_bytes(text)
        result["cache_fetched_from_upstream"] = counted["I"]
        result["cache_served_to_nodes"] = counted["O"]
    return result


def measure(inventory: Path, work: Path, repeat: int) -> dict[str, Any]:
    hosts_file = work / f"floor-hosts-{inventory.stem}.json"
    hosts = floor_hosts(inventory)[0]
    hosts_file.write_text(json.dumps(hosts))
    light_file = work / f"light-hosts-{inventory.stem}.json"
    light_file.write_text(json.dumps([{**h, "script": LIGHT_PROBE} for h in hosts]))
    floor(hosts_file)  # warm-up: page cache, ARP, sshd
    floor(light_file)
    warm = gpuk8s("plan", inventory, work, *SETS)
    if "plan: 0 change(s)" not in warm.output:
        raise SystemExit("bench: the lab is not converged (did someone else change it?):\n"
                         + warm.output[-3000:])
    samples: dict[str, list[Sample]] = {"light": [], "floor": [], "bootstrap": [], "plan": []}
    for _ in range(repeat):
        samples["light"].append(floor(light_file))
        samples["floor"].append(floor(hosts_file))
        noop = gpuk8s("bootstrap", inventory, work, *SETS)
        if "no changes" not in noop.output:
            raise SystemExit("bench: the re-run was not a no-op:\n" + noop.output[-3000:])
        samples["bootstrap"].append(noop)
        samples["plan"].append(gpuk8s("plan", inventory, work, *SETS))
    med = {k: statistics.median(s.wall for s in v) for k, v in samples.items()}
    inner = [json.loads(s.output.strip().splitlines()[-1])["elapsed"] for s in samples["floor"]]
    last = samples["bootstrap"][-1].report
    return {
        "light": round(med["light"], 3),
        "floor": round(med["floor"], 3), "floor_in_process": round(statistics.median(inner), 3),
        "bootstrap": round(med["bootstrap"], 3), "plan": round(med["plan"], 3),
        "bootstrap_in_process": round(statistics.median(
            s.report.get("wall_time", 0) for s in samples["bootstrap"]), 3),
        "ratio_bootstrap": round(med["bootstrap"] / med["floor"], 2),
        "ratio_plan": round(med["plan"] / med["floor"], 2),
        "light_ratio_bootstrap": round(med["bootstrap"] / med["light"], 2),
        "light_ratio_plan": round(med["plan"] / med["light"], 2),
        # each process's own peak RSS (wait4's figure also counts the forked bench's pages)
        "rss_kb": {
            "floor": max(json.loads(s.output.strip().splitlines()[-1]).get("peak_rss_kb", 0)
                         for s in samples["floor"]),
            "bootstrap": max(s.report.get("peak_rss_kb", 0) for s in samples["bootstrap"]),
            "plan": max(s.report.get("peak_rss_kb", 0) for s in samples["plan"])},
        "round_trips": round_trips(last),
        "plan_round_trips": round_trips(samples["plan"][-1].report),
        "runs": {k: [round(s.wall, 3) for s in v] for k, v in samples.items()},
    }


def fact_times(inventory: Path, work: Path) -> dict[str, dict[str, float]]:
    """Each host's node-side seconds per fact in one no-op probe (after a plan that finds the
    lab converged, and a first probe that warms the same paths up)."""
    check = gpuk8s("plan", inventory, work, *SETS)
    if "plan: 0 change(s)" not in check.output:
        raise SystemExit("bench: the lab is not converged:\n" + check.output[-3000:])
    outputs = Path(tempfile.mkdtemp(prefix="fact-times-", dir=work))
    hosts, probes = floor_hosts(inventory, outputs)
    hosts_file = outputs / "hosts.json"
    hosts_file.write_text(json.dumps(hosts))
    floor(hosts_file)  # warm-up
    floor(hosts_file)
    return {name: probe_times((outputs / f"{name}.out").read_text(errors="replace"), marker,
                              requests) for name, (requests, marker) in sorted(probes.items())}


def facts_text(times: dict[str, dict[str, float]]) -> str:
    """Per host, each fact's node-side time, slowest first, with the host's sum."""
    out = []
    for host, facts in times.items():
        ranked = sorted(facts.items(), key=lambda kv: (-kv[1], kv[0]))
        out.append(f"\n## {host}: {sum(facts.values()) * 1000:.0f} ms on the node, "
                   f"{len(facts)} sections")
        out.append("| ms | fact |")
        out.append("|---:|---|")
        out += [f"| {s * 1000:.1f} | {key} |" for key, s in ranked]
    return "\n".join(out)


# -- output ------------------------------------------------------------------------------------
def steps_text(rt: dict[str, Any]) -> str:
    return ", ".join(f"{s} {n}" for s, n in rt["execs_per_host_per_step_max"])


def print_results(results: dict[str, Any]) -> None:
    for n, times in results.get("fact_times", {}).items():
        print(f"\n# each fact's time on the node, one no-op probe, {n} nodes" + facts_text(times))
    if not results["sizes"]:
        return
    print("\n## no-op runs (median wall time of the whole process; ratios to the light floor, "
          "one connect and `uname; cat /etc/os-release` per host, and to the probe floor, one "
          "connect and gpuk8s's own probe sent raw)")
    print("| nodes | light floor | probe floor | no-op bootstrap | ratio light / probe | "
          "no-op plan | ratio light / probe | SSH conns/host | execs/host per step | "
          "peak RSS bootstrap |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n, r in results["sizes"].items():
        rt = r["round_trips"]
        print(f"| {n} | {r['light']:.2f} s | {r['floor']:.2f} s | {r['bootstrap']:.2f} s | "
              f"{r['light_ratio_bootstrap']:.2f}x / {r['ratio_bootstrap']:.2f}x | "
              f"{r['plan']:.2f} s | {r['light_ratio_plan']:.2f}x / {r['ratio_plan']:.2f}x | "
              f"{rt['connects_per_host_max']} | {steps_text(rt)} | "
              f"{r['rss_kb']['bootstrap'] / 1024:.0f} MiB |")
    for label, first in results.get("first_bootstrap", {}).items():
        print(f"\n## first bootstrap, {label}: {first['wall']:.1f} s")
        print("| step | wall | execs/host (max) |")
        print("|---|---|---|")
        execs = dict(first["round_trips"]["execs_per_host_per_step_max"])
        for step, elapsed in first["steps"]:
            print(f"| {step} | {elapsed:.1f} s | {execs.get(step, 0)} |")
    cache = results.get("package_cache", {})
    if cache:
        print("\n## package cache: bytes from upstream (the lab host's apt-cacher-ng)")
        print("| nodes | package_cache | fetched by the cache host | served by upstream to the "
              "cluster |")
        print("|---|---|---|---|")
        for r in cache.values():
            fetched = r.get("cache_fetched_from_upstream")
            print(f"| {r['nodes']} | {str(r['package_cache']).lower()} | "
                  f"{'-' if fetched is None else f'{fetched / 1e6:.2f} MB'} | "
                  f"{r['upstream_bytes_served_to_cluster'] / 1e6:.2f} MB |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=None,
                        help="lab sizes for the no-op runs (default 4,16,64; 4 with --facts)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs of each, per size")
    parser.add_argument("--no-cache-bytes", action="store_true",
                        help="skip the package cache measurement (1 and 4 nodes)")
    parser.add_argument("--keep", action="store_true", help="leave the last lab up")
    parser.add_argument("--facts", action="store_true",
                        help="only each fact's node-side time in one no-op probe per host, "
                             "at each size")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in (args.sizes or ("4" if args.facts else "4,16,64")).split(",")
             if s.strip()]
    from tests.lab.lock import acquire

    # waits for a test session to finish with the lab; then any lab left up is rebooted
    lock = acquire("bench")
    # byte-compile the checkout as a user's first run leaves it: with PYTHONDONTWRITEBYTECODE
    # set (this machine sets it), every timed run would otherwise compile gpuk8s from source,
    # a cost the floor (paramiko, compiled at pip install) never pays
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "gpuk8s"),
                    str(ROOT / "roles")], check=True, stdout=subprocess.DEVNULL)
    results_pyc = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    work = ROOT / "runs" / f"bench-{stamp}"
    work.mkdir(parents=True)
    results: dict[str, Any] = {"command": "invoke bench " + " ".join(sys.argv[1:] if argv is None
                                                                     else argv),
                               "started": stamp, "cpus": os.cpu_count(), "sizes": {},
                               "precompiled": True,
                               "pythondontwritebytecode": results_pyc,
                               "first_bootstrap": {}, "package_cache": {}}
    t_all = time.monotonic()
    if args.facts:
        results["fact_times"] = {}
    try:
        if not args.no_cache_bytes and not args.facts:
            lab, inv = boot(Topology.generic(1))
            results["package_cache"]["1"] = first_bootstrap(lab, inv, work, cache=True)
            lab, inv = boot(Topology.load("default"))
            results["package_cache"]["4 (no cache)"] = first_bootstrap(lab, inv, work,
                                                                       cache=False)
        for n in sizes:
            t0 = time.monotonic()
            topo = Topology.load("default") if n == 4 else Topology.generic(n)
            lab, inv = boot(topo)
            first = first_bootstrap(lab, inv, work, cache=True)
            results["first_bootstrap"][f"{n} nodes, package_cache: true"] = first
            if n == 4:
                results["package_cache"]["4"] = first
            print(f"bench: {n} nodes bootstrapped in {first['wall']:.1f} s", flush=True)
            if args.facts:
                results["fact_times"][str(n)] = times = fact_times(inv, work)
                print(f"\n# each fact's time on the node, one no-op probe, {n} nodes"
                      + facts_text(times), flush=True)
                (work / "results.json").write_text(json.dumps(results, indent=1))
                continue
            results["sizes"][str(n)] = measure(inv, work, args.repeat)
            print(f"bench: {n} nodes measured ({time.monotonic() - t0:.0f} s for this size)",
                  flush=True)
            (work / "results.json").write_text(json.dumps(results, indent=1))
    finally:
        if not args.keep:
            Lab().down()
    results["total_s"] = round(time.monotonic() - t_all, 1)
    (work / "results.json").write_text(json.dumps(results, indent=1))
    print_results(results)
    print(f"\nbench: {results['total_s']:.0f} s in all; results in {work / 'results.json'}")
    lock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
