"""roles/gpu_health: the Xid watch service (gpu_health_watch) planned on GPU nodes only, with
the node's own kubelet credentials; its kernel-log matching run by sh on real Xid lines."""

from __future__ import annotations

import re
import subprocess
from typing import Any

from gpuk8s.facts import HostFacts
from gpuk8s.facts.xid import FATAL_XIDS
from gpuk8s.roles import HostContext, load_role
from roles.gpu_health.role import SCRIPT, UNIT, watch_script
from tests.unit.scenarios import default_vars, fresh_facts


def plan(gpus: int, **overrides: Any) -> list[Any]:
    v = default_vars(**overrides)
    facts = fresh_facts("ubuntu2404", gpus, "gpu-01", v)
    ctx = HostContext("gpu-01", "gpu_health", v, HostFacts("gpu-01", dict(facts.items())),
                      {"nodes": {"gpu-01": {"name": "gpu-01", "address": "10.0.0.2"}}})
    return load_role("gpu_health").plan(ctx)


def test_off_by_default_and_nothing_on_a_cpu_node() -> None:
    [op] = plan(2)
    assert not op.changes and "gpu_health_watch is false" in op.reason
    assert plan(0, gpu_health_watch=True) == []


def test_on_a_gpu_node_the_script_the_node_name_and_the_unit_then_started() -> None:
    ops = plan(2, gpu_health_watch=True)
    assert [op.id for op in ops] == ["gpu_health | watch script", "gpu_health | node name",
                                     "gpu_health | unit", "gpu_health | watch"]
    start = "\n".join(ops[-1].commands)
    assert f"systemctl enable -q {UNIT}" in start and f"systemctl restart {UNIT}" in start
    unit = "\n".join(ops[2].commands)
    assert SCRIPT in str(ops[0].commands) and "base64" in unit


def test_the_watch_uses_the_kubelet_credentials_and_never_taints() -> None:
    text = watch_script().decode()
    assert "--kubeconfig /etc/kubernetes/kubelet.conf" in text
    assert " taint " not in text  # NodeRestriction: a node may not modify its taints
    assert all(f" {x} " in text for x in FATAL_XIDS)
    subprocess.run(["sh", "-n"], input=text, text=True, check=True)


def _code(line: str) -> str:
    """The watch's own extraction of the Xid number, run by sh."""
    extract = next(x for x in watch_script().decode().splitlines() if x.strip().startswith(
        "code="))
    out = subprocess.run(["sh", "-c", f'line=$1\n{extract}\necho "$code"', "sh", line],
                         capture_output=True, text=True, check=True).stdout
    return out.strip()


def test_the_watch_reads_the_xid_of_real_driver_lines() -> None:
    # lines as drivers 535-595 print them (docs: NVSentinel#155, open-gpu-kernel-modules#1151,
    # akash-network/support#244), one with a MIG instance in the device part
    assert _code("[ 1843.308145] NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the "
                 "bus.") == "79"
    assert _code("[Fri Aug  9 13:32:56 2024] NVRM: Xid (PCI:0000:00:08): 94, pid='<unknown>'"
                 ", name=<unknown>, Contained: SM (0x1). RST: No, D-RST: No") == "94"
    assert _code("[  12.5] NVRM: Xid (PCI:0000:01:00 GPU-I:05): 48, pid=7, name=x, An "
                 "uncorrectable double bit error") == "48"
    assert _code("[  1.6] NVRM: gpuClearFbhubPoisonIntrForBug2924523_GA100: FBHUB Interrupt "
                 "detected. Clearing it.") == ""
    assert re.search(r"grep -qxF -- \"\$line\"", watch_script().decode())
