"""How many times one fact probe runs nvidia-smi, systemctl and kubectl on a host (issue #31:
a no-op re-run went from 2.13 s to 3.95 s on 8 lab nodes as the probe grew to 42 facts, each
running its own nvidia-smi and systemctl).

The probe gpuk8s builds for the lab inventory's hosts (inventories/lab.yaml, with their real
vars) runs here in sh, whole, with those three tools (and curl and timedatectl, which would
reach out) replaced by stand-ins that log every run and answer in the real formats. Each fact
must still parse, and each tool runs once per probe: one ``nvidia-smi --query-gpu``, one
``systemctl``, one round of kubectl reads side by side."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.facts import Fact
from gpuk8s.facts.probe import DATE, build_probe, parse_probe, probe_sources, probe_times
from gpuk8s.gather import fact_requests
from gpuk8s.inventory import load_inventory
from gpuk8s.sections import section_times
from gpuk8s.session import role_vars

ROOT = Path(__file__).resolve().parents[2]
NVIDIA = ROOT / "tests" / "fixtures" / "nvidia" / "2xh200-ubuntu2404"
REAL = ROOT / "tests" / "fixtures" / "real" / "h200-ubuntu2404" / "probe-2026-11-28"
#: seconds each stand-in kubectl read takes: reads side by side take about one of these
KUBECTL_SECONDS = 0.6
#: kubectl's stand-in, in sh (it starts faster than Python, so reads side by side overlap)
KUBECTL = """#!/bin/sh
echo "kubectl $*" >>"$TOOL_LOG"
sleep "$KUBECTL_SECONDS"
echo '{"apiVersion": "v1", "items": [], "kind": "List"}'
"""

#: the other stand-ins: one Python program, named as each tool; it logs "<tool> <args>" to
#: $TOOL_LOG and answers as the real tool does (formats of tests/fixtures/nvidia/ and of
#: systemd 252's systemctl show)
STANDIN = r'''
import os, sys
tool, args = os.path.basename(sys.argv[0]), sys.argv[1:]
if os.environ.get("SLOW_TOOL") == tool:  # a test's way to make one section take time
    import time
    time.sleep(float(os.environ["SLOW_SECONDS"]))
with open(os.environ["TOOL_LOG"], "a") as log:
    log.write(" ".join([tool, *args]) + "\n")
nvidia, real, mig = os.environ["NVIDIA"], os.environ["REAL"], os.environ.get("MIG", "Disabled")


def show(name):
    with open(os.path.join(nvidia, name)) as fh:
        sys.stdout.write(fh.read())


if tool == "nvidia-smi":
    gpus = [dict(index=str(i), name="NVIDIA H200", uuid=u, driver_version="580.159.04",
                 **{"memory.total": "143771", "pci.bus_id": f"00000000:00:0{6 + i}.0",
                    "compute_cap": "9.0", "persistence_mode": "Enabled",
                    "mig.mode.current": mig, "mig.mode.pending": mig})
            for i, u in enumerate(["GPU-0304cd1f-99ea-f0a1-cf6e-fe1c220f582c",
                                   "GPU-447eed84-ea9b-aab1-f374-462b1913f96d"])]
    query = [a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")]
    if query:
        fields = query[0].split(",")
        for f in fields:
            if f not in gpus[0]:
                print(f'Field "{f}" is not a valid field to query.\n')
                sys.exit(2)
        for g in gpus:
            print(", ".join(g[f] for f in fields))
    elif args == ["--version"]:
        print("NVIDIA-SMI version  : 580.159.04\nNVML version        : 580.159\n"
              "DRIVER version      : 580.159.04\nCUDA Version        : 13.0")
    elif args == ["-L"]:
        show("nvidia-smi-L.txt")
    elif args == ["nvlink", "-s"]:
        show("nvidia-smi-nvlink-s.txt")
    elif args == ["topo", "-m"]:
        show("nvidia-smi-topo-m.txt")
    elif args == ["mig", "-lgi"]:
        print("No MIG-enabled devices found." if mig != "Enabled" else
              "+---+\n| GPU instances: |\n+---+")
    elif args == []:
        show("nvidia-smi.txt")
    elif args == ["-q"]:
        with open(os.path.join(nvidia, "..", "h200-ubuntu2404", "nvidia-smi-q.txt")) as fh:
            sys.stdout.write(fh.read())
    else:
        sys.exit(2)
elif tool == "systemctl":
    if args[:1] == ["show"]:
        units = args[args.index("--") + 1:] if "--" in args else \
            [a for a in args[1:] if not a.startswith("-")]
        blocks = []
        for u in units:
            n = u if "." in u else u + ".service"
            blocks.append(f"Id={n}\nLoadState=loaded\nActiveState=active\n"
                          "UnitFileState=enabled\n")
        sys.stdout.write("\n".join(blocks))
    elif args[:1] == ["is-active"]:
        print("active")
    elif args[:1] == ["is-enabled"]:
        print("enabled")
    else:
        sys.exit(1)
elif tool == "curl":
    sys.stdout.write("200")
elif tool == "timedatectl":
    print("yes")
'''


def lab_requests(host: str, **extra: Any) -> list[Fact[Any]]:
    """What gather asks of ``host`` of the lab inventory, with ``extra`` vars on top."""
    inv = load_inventory(ROOT / "inventories" / "lab.yaml")
    return fact_requests({**role_vars(inv.hosts[host]), **extra})


def run_probe(tmp_path: Path, requests: list[Fact[Any]], *, gpus: bool, control_plane: bool,
              mig: str = "Disabled", spans: bool = False, slow: str = "") -> Any:
    """Run the probe of ``requests`` here; return how many times each tool ran (and
    ``nvidia-smi --query-gpu`` on its own) and probe_times. ``gpus``: nvidia-smi is
    installed; ``control_plane``: admin.conf is there for kubectl. ``spans``: also each
    section's (start, end, name) by its number. ``slow``: a tool whose every run takes
    KUBECTL_SECONDS."""
    tools = tmp_path / "bin"
    tools.mkdir()
    program = tmp_path / "standin.py"
    program.write_text(f"#!{sys.executable}\n{STANDIN}")
    program.chmod(0o755)
    for tool in ("systemctl", "curl", "timedatectl") + ("nvidia-smi",) * gpus:
        (tools / tool).symlink_to(program)
    (tools / "kubectl").write_text(KUBECTL)
    (tools / "kubectl").chmod(0o755)
    # this machine's real dpkg-query (Debian), each run logged
    (tools / "dpkg-query").write_text('#!/bin/sh\necho "dpkg-query $*" >>"$TOOL_LOG"\n'
                                      'exec /usr/bin/dpkg-query "$@"\n')
    (tools / "dpkg-query").chmod(0o755)
    admin = tmp_path / "admin.conf"
    if control_plane:
        admin.write_text("apiVersion: v1\n")
    log = tmp_path / "tools.log"
    log.write_text("")
    script, marker = build_probe(requests, clock=DATE)
    script = script.replace("export LC_ALL=C PATH=", f"export LC_ALL=C PATH={tools}:") \
        .replace("/etc/kubernetes/admin.conf", str(admin))
    env = {**os.environ, "TOOL_LOG": str(log), "NVIDIA": str(NVIDIA), "REAL": str(REAL),
           "MIG": mig, "KUBECTL_SECONDS": str(KUBECTL_SECONDS), "SLOW_TOOL": slow,
           "SLOW_SECONDS": str(KUBECTL_SECONDS)}
    out = subprocess.run(["/bin/sh", "-s"], input=script, capture_output=True, text=True,
                         env=env, timeout=120, check=False).stdout
    parse_probe("here", out, requests, marker)  # every fact parses what its command printed
    runs: collections.Counter[str] = collections.Counter()
    for line in log.read_text().splitlines():
        tool, _, args = line.partition(" ")
        runs[tool] += 1
        if tool == "nvidia-smi" and args.startswith("--query-gpu"):
            runs["nvidia-smi --query-gpu"] += 1
    if not spans:
        return runs, probe_times(out, marker, requests)
    names = {i: f.key for i, f in enumerate(requests)}
    names.update({-(i + 1): f"source {x.key}" for i, x in enumerate(probe_sources(requests))})
    return runs, probe_times(out, marker, requests), {
        i: (start, end, names[i]) for i, (start, end) in section_times(out, marker).items()
        if end is not None}


def test_the_lab_inventory_asks_every_host_the_same_facts() -> None:
    """The counts below hold for every lab host: the roles ask each the same facts (a
    control plane's and a GPU worker's probes differ by what is installed there)."""
    keys = {tuple(f.key for f in lab_requests(h)) for h in ("cp-01", "gpu-01", "cpu-01")}
    assert len(keys) == 1


@pytest.mark.parametrize("mig", ["Disabled", "Enabled"])
def test_a_gpu_workers_probe_runs_each_tool_once(tmp_path: Path, mig: str) -> None:
    """One --query-gpu (the Nvidia and MigState facts' GPU rows) and --version for the CUDA
    version; -L and mig -lgi only when a GPU is in MIG mode (otherwise there are no MIG
    devices to list). No nvlink -s or topo -m: the GPU topology is read only by `invoke
    facts`, which asks for it on top. One systemctl for every unit the Services facts ask
    about."""
    runs, _ = run_probe(tmp_path, lab_requests("gpu-01"), gpus=True, control_plane=False,
                        mig=mig)
    assert runs["nvidia-smi --query-gpu"] == 1
    assert runs["nvidia-smi"] == (4 if mig == "Enabled" else 2), runs
    assert runs["systemctl"] == 1
    # one for every Packages fact, one for DpkgHealth's reinstall flags
    assert runs["dpkg-query"] == 2, runs
    assert runs["kubectl"] == 0


@pytest.mark.parametrize("dra", [False, True])
def test_a_control_planes_probe_reads_the_cluster_in_one_round(tmp_path: Path,
                                                               dra: bool) -> None:
    """The Cluster fact's two reads, and the Dra fact's two when the inventory asks for DRA,
    run side by side in one round, started at the top of the probe: the section that
    collects them waits only for what is left of one kubectl's time after the other
    sections ran (without the head start it would wait a whole one)."""
    requests = lab_requests("cp-01", **({"gpu_allocation": "dra"} if dra else {}))
    # the one systemctl run (a section before the facts) takes one kubectl time: the reads,
    # started at the top, are done when the collecting section comes
    runs, times, spans = run_probe(tmp_path, requests, gpus=False, control_plane=True,
                                   spans=True, slow="systemctl")
    assert runs["kubectl"] == (4 if dra else 2)
    assert runs["systemctl"] == 1 and runs["nvidia-smi"] == 0
    (collect,) = [n for n, k in spans.items() if k[2].startswith("source KubeReads")]
    top = min(start for start, _, _ in spans.values())
    start, end, _ = spans[collect]
    assert start - top >= KUBECTL_SECONDS, spans
    assert end - start < KUBECTL_SECONDS / 2, spans  # without the head start: a whole one
    # the sections that read the cluster come last
    assert max(s for s, _, k in spans.values() if k in ("Cluster", "Dra")) >= start
    assert times["Cluster"] < KUBECTL_SECONDS / 2
