"""``invoke bench --facts`` without the lab: the probes it sends read their marker times with
date, floor.py keeps what they print, and each host's facts are listed slowest first."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from bench.run import facts_text, floor_hosts
from gpuk8s.facts.probe import DATE, probe_times

ROOT = Path(__file__).resolve().parents[2]


def test_the_probes_read_the_clock_with_date_and_name_an_output(tmp_path: Path) -> None:
    hosts, probes = floor_hosts(ROOT / "inventories" / "lab.yaml", tmp_path)
    assert [h["name"] for h in hosts] == ["cp-01", "gpu-01", "gpu-02", "cpu-01"]
    for h in hosts:
        requests, marker = probes[h["name"]]
        assert h["output"] == str(tmp_path / f"{h['name']}.out")
        assert f'{DATE}; echo "{marker} B 0 $_gk_t"' in h["script"]
        assert len(requests) > 40
    plain, _ = floor_hosts(ROOT / "inventories" / "lab.yaml")
    assert "output" not in plain[0] and DATE not in plain[0]["script"]
    json.dumps(hosts)  # floor.py reads them as JSON


def test_a_probes_times_slowest_first(tmp_path: Path) -> None:
    hosts, probes = floor_hosts(ROOT / "inventories" / "lab.yaml", tmp_path)
    requests, marker = probes["cp-01"]
    curl = tmp_path / "bin" / "curl"  # the lab's registry is not asked from here
    curl.parent.mkdir()
    curl.write_text("#!/bin/sh\nprintf 200\n")
    curl.chmod(0o755)
    script = hosts[0]["script"].replace("export LC_ALL=C PATH=",
                                        f"export LC_ALL=C PATH={curl.parent}:")
    out = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True,
                         timeout=120, check=False).stdout
    times = probe_times(out, marker, requests)
    assert {f.key for f in requests} <= set(times)
    text = facts_text({"cp-01": times, "gpu-01": {"Nvidia": 0.1205, "System": 0.25}})
    assert text.splitlines()[-4:] == ["| ms | fact |", "|---:|---|", "| 250.0 | System |",
                                      "| 120.5 | Nvidia |"]
    assert "## gpu-01: 370 ms on the node, 2 sections" in text
    ranked = [float(line.split("|")[1]) for line in text.split("## gpu-01")[0].splitlines()
              if line.startswith("| ") and line[2].isdigit()]
    assert ranked == sorted(ranked, reverse=True) and len(ranked) == len(times)
