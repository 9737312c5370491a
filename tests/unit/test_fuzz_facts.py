"""Fuzz every fact parser (every Fact subclass in gpuk8s/facts/*.py) with hypothesis: random
text and exit codes give a value or our own FactError (parse_probe turns ValueError-derived
parse errors into FactError); never another crash."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import os
import pkgutil
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpuk8s.facts
from gpuk8s.errors import FactError
from gpuk8s.facts import Fact
from gpuk8s.facts.probe import build_probe, parse_probe

#: arguments for facts that take some (paths, names); "+" asks Files for content
ARGS: dict[str, tuple[str, ...]] = {
    "Files": ("/etc/a", "+/etc/b c", "/x"),
    "KernelModules": ("overlay", "nouveau"),
    "Sysctls": ("net.ipv4.ip_forward",),
    "Services": ("containerd", "kubelet"),
    "Packages": ("kubeadm", "containerd.io"),
}
EXAMPLES = int(os.environ.get("GPUK8S_FUZZ_EXAMPLES", "300"))


def fact_classes() -> list[type[Fact[Any]]]:
    found: dict[str, type[Fact[Any]]] = {}
    for mod in pkgutil.iter_modules(gpuk8s.facts.__path__):
        module = importlib.import_module(f"gpuk8s.facts.{mod.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Fact) and cls is not Fact:
                found[cls.__name__] = cls
    return [found[k] for k in sorted(found)]


FACTS = [cls(*ARGS.get(cls.__name__, ())) for cls in fact_classes()]


def test_every_fact_class_is_fuzzed() -> None:
    names = {type(f).__name__ for f in FACTS}
    assert {"System", "DpkgHealth", "Nvidia", "Cluster", "Containerd", "Files",
            "GpuTopology"} <= names
    assert len(names) >= 14


#: lines shaped like what the parsers look for, with random values: they reach deeper
#: branches than plain random text does
_KEYS = ["kernel", "cpus", "mem_kb", "audit", "lock", "listen", "swap", "headers", "## query",
         "## rc", "## header", "## proc", "## absent", "## dump", "## managed", "## nvlink",
         "## topo", "F", "P", "N", "C", "GPU 0:", "GPU0\tGPU1", "containerd containerd.io v2.1.4",
         "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.1", "CUDA Version:",
         "ID", "kubeadm 1.36.1-1.1 ii", "\tLink 0: 26.5 GB/s", "cuda-13.0"]
_WORD = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_LINE = st.one_of(
    st.text(max_size=80),
    st.builds(lambda k, sep, v: f"{k}{sep}{v}", st.sampled_from(_KEYS),
              st.sampled_from(["=", " ", ",", "\t", ": ", ""]),
              st.lists(_WORD, max_size=9).map(lambda w: st_join(w))),
    st.builds(lambda *c: ",".join(c), *[_WORD] * 9),
    st.just('{"items": [{"metadata": {"name": "n"}, "status": {"allocatable": '
            '{"nvidia.com/gpu": "x"}}}]}'),
)


def st_join(words: list[str]) -> str:
    return " ".join(words)


_JSON_KEYS = ["items", "metadata", "name", "status", "spec", "allocatable", "nvidia.com/gpu",
              "conditions", "type", "taints", "key", "labels", "nodeInfo", "kind",
              "annotations", "namespace", "unschedulable", "Ready", "message"]
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.sampled_from(_JSON_KEYS),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(_JSON_KEYS), inner, max_size=5), max_leaves=25)
#: kubectl-shaped output: two JSON documents around the Cluster fact's separator
_KUBE = st.builds(lambda a, b: f"{json.dumps(a)}\n## managed\n{json.dumps(b)}", _JSON, _JSON)
_OUTPUT = st.one_of(st.text(max_size=400), st.lists(_LINE, max_size=25).map("\n".join), _KUBE)
_CODE = st.one_of(st.sampled_from([0, 1, 2, 3, 4, 9, 18, 100, 124, 127, 255, -1]),
                  st.integers(-(2**31), 2**31))
_FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("fact", FACTS, ids=lambda f: type(f).__name__)
@_FUZZ
@given(output=_OUTPUT, code=_CODE)
def test_parser_gives_a_value_or_our_error(fact: Fact[Any], output: str, code: int) -> None:
    # exactly what parse_probe does with one section: our errors pass, parse errors
    # (ValueError, KeyError, IndexError) become FactError; anything else is a crash
    _script, marker = build_probe([fact], marker="@@M")
    probe = f"@@M B 0\n{output}\n@@M E 0 {code}\n"
    with contextlib.suppress(FactError):
        parse_probe("h", probe, [fact], marker)


@_FUZZ
@given(st.text(max_size=600))
def test_probe_splitter_never_crashes(output: str) -> None:
    with contextlib.suppress(FactError):
        parse_probe("h", output, FACTS, "@@M")
