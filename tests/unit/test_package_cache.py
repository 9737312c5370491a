"""package_cache: the apt cache role, its phase before the node phase, and the base role's
proxy pointing at it."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

import gpuk8s.session as session_mod
from gpuk8s import runner
from gpuk8s.cluster_values import package_cache_url
from gpuk8s.errors import InventoryError
from gpuk8s.facts import HostFacts
from gpuk8s.facts.system import FileState, PackageState, Unit
from gpuk8s.inventory import load_inventory
from gpuk8s.ops import sha256
from gpuk8s.playbook import PHASES, package_cache_host
from gpuk8s.redact import Redactor
from gpuk8s.report import Reporter
from gpuk8s.roles import HostContext, load_role
from gpuk8s.transport import ConnectSpec, Counters
from roles.package_cache import role as package_cache
from tests.unit.scenarios import default_vars, fresh_facts

PROXY = "http://10.0.0.1:3142"
CONF = "/etc/apt-cacher-ng/zz-gpuk8s.conf"
INVENTORY = """\
all:
  vars:
    package_cache: true
{extra}
  children:
    control_plane:
      hosts:
        cp-01: {{ansible_host: 10.0.0.10}}
    workers:
      hosts:
        w-01: {{ansible_host: 10.0.0.11}}
        w-02: {{ansible_host: 10.0.0.12}}
"""


def inventory(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(INVENTORY.format(extra=extra))
    return path


def cache_plan(facts: HostFacts, vars: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    role = load_role("package_cache")
    ctx = HostContext("cp-01", "package_cache", vars, facts, {}, ("control_plane",))
    return role.plan(ctx), {k: fn(ctx) for k, fn in role.handlers().items()}


def test_off_by_default_plans_and_probes_nothing() -> None:
    vars = default_vars()
    assert vars["package_cache"] is False and vars["package_cache_host"] == ""
    assert load_role("package_cache").facts(vars) == []
    ops, _ = cache_plan(fresh_facts("debian12", 0, "cp-01", vars), vars)
    assert ops == []


def test_fresh_cache_host_installs_through_apt_proxy_then_configures_and_starts() -> None:
    vars = default_vars(package_cache=True, apt_proxy=PROXY)
    ops, handlers = cache_plan(fresh_facts("debian12", 0, "cp-01", vars), vars)
    assert [op.id for op in ops] == ["package_cache | apt-cacher-ng", "package_cache | config",
                                     "package_cache | service"]
    install = " ".join(ops[0].commands)
    assert " install " in install and install.rstrip("; }\n)").removesuffix(
        " || exit $?\nfi").endswith("apt-cacher-ng")
    # the install ignores whatever proxy apt.conf.d names (it may be this very cache)
    # through a 0600 scratch config (apt-get -c), never on argv where ps shows it
    assert all(f"'Acquire::http::Proxy \"{PROXY}\";' > \"$c\"" in c and '-c "$c"' in c
               and PROXY not in c.split("\n", 1)[1] for c in ops[0].commands if "apt-get" in c)
    assert ops[1].notify == ("restart apt-cacher-ng",)
    assert f"Proxy: {PROXY}\n" in (ops[1].diff or "") and "Port: 3142" in (ops[1].diff or "")
    assert "systemctl enable --now apt-cacher-ng" in ops[2].commands
    restart = handlers["restart apt-cacher-ng"]
    assert restart.commands[0] == "systemctl restart apt-cacher-ng"
    # it waits for the cache to answer, polling; no fixed sleep
    assert "curl" in restart.commands[1] and "sleep 0.1" in restart.commands[1]


@pytest.mark.parametrize(("url", "bind"), [
    ("http://10.0.0.10:3142", "BindAddress: 127.0.0.1 10.0.0.10\n"),
    ("http://[fd00::10]:3142", "BindAddress: 127.0.0.1 [fd00::10]:3142\n"),
    ("http://cache.lab:3142", "BindAddress: 127.0.0.1 cache.lab\n")])
def test_the_cache_listens_on_loopback_and_its_cluster_address_only(url: str,
                                                                     bind: str) -> None:
    """Not on every interface (security review 2, L4): loopback and the address the nodes'
    apt proxy files name."""
    vars = default_vars(package_cache=True)
    role = load_role("package_cache")
    ctx = HostContext("cp-01", "package_cache", vars, fresh_facts("debian12", 0, "cp-01", vars),
                      {"package_cache_url": url}, ("control_plane",))
    ops = role.plan(ctx)
    assert bind in (ops[1].diff or "")
    assert package_cache.config(vars, url).decode().count("BindAddress:") == 1


def test_without_apt_proxy_the_cache_fetches_directly() -> None:
    vars = default_vars(package_cache=True)
    ops, _ = cache_plan(fresh_facts("debian12", 0, "cp-01", vars), vars)
    assert all("'Acquire::http::Proxy \"DIRECT\";'" in c for c in ops[0].commands
               if "apt-get" in c)
    assert "Proxy:" not in (ops[1].diff or "")


def test_converged_cache_host_is_a_noop() -> None:
    vars = default_vars(package_cache=True, apt_proxy=PROXY)
    role = load_role("package_cache")
    conf = package_cache.config(vars)
    values = {f: v for f, v in fresh_facts("debian12", 0, "cp-01", vars).items()}
    for fact in role.facts(vars):
        kind = type(fact).__name__
        if kind == "Packages":
            values[fact] = {"apt-cacher-ng": PackageState("3.7.4-1", False, "ii")}
        elif kind == "Files":
            values[fact] = {CONF: FileState(CONF, True, "644", "root", sha256(conf), conf)}
        elif kind == "Services":
            values[fact] = {"apt-cacher-ng": Unit("active", "enabled")}
    ops, _ = cache_plan(HostFacts("cp-01", values), vars)
    assert not any(op.changes for op in ops), [op.reason for op in ops]


def test_base_points_apt_at_the_cache_when_on() -> None:
    vars = default_vars(package_cache=True, apt_proxy=PROXY)
    facts = fresh_facts("debian12", 0, "w-01", vars)
    base = load_role("base")
    url = "http://10.0.0.10:3142"
    on = base.plan(HostContext("w-01", "base", vars, facts, {"package_cache_url": url}))
    proxy = next(op for op in on if op.id == "base | apt proxy")
    assert f'Acquire::http::Proxy "{url}";' in (proxy.diff or "")
    off = base.plan(HostContext("w-01", "base", vars, facts, {"package_cache_url": ""}))
    proxy = next(op for op in off if op.id == "base | apt proxy")
    assert f'Acquire::http::Proxy "{PROXY}";' in (proxy.diff or "")


def test_cache_phase_comes_before_the_node_phase() -> None:
    names = [p.name for p in PHASES]
    assert names.index("package-cache") < names.index("node")
    assert PHASES[names.index("package-cache")].hosts == "package_cache"


def test_cache_host_defaults_to_the_first_control_plane(tmp_path: Path) -> None:
    inv = load_inventory(inventory(tmp_path))
    assert package_cache_host(inv) == "cp-01"
    assert package_cache_url(inv) == "http://10.0.0.10:3142"
    off = load_inventory(inventory(tmp_path), overrides=["package_cache=false"])
    assert package_cache_host(off) is None and package_cache_url(off) == ""


def test_named_cache_host_and_unknown_one(tmp_path: Path) -> None:
    inv = load_inventory(inventory(tmp_path, '    package_cache_host: "w-02"'))
    assert package_cache_host(inv) == "w-02"
    assert package_cache_url(inv) == "http://10.0.0.12:3142"
    bad = load_inventory(inventory(tmp_path, '    package_cache_host: "nope"'))
    with pytest.raises(InventoryError, match="package_cache_host 'nope'"):
        package_cache_host(bad)


class _Quiet:
    def __init__(self, spec: ConnectSpec) -> None:
        self.name = spec.name
        self.counters = Counters(connects=1)

    def close(self) -> None:
        pass


def test_cache_host_is_contacted_and_its_phase_runs_there_whatever_the_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUK8S_RUNS_DIR", str(tmp_path / "runs"))
    contacted: list[str] = []

    def opener(spec: ConnectSpec, redact: Redactor) -> _Quiet:
        contacted.append(spec.name)
        return _Quiet(spec)

    path = inventory(tmp_path, '    package_cache_host: "w-02"')
    session = session_mod.open_session(path, limit="w-01", sets=[], command="plan",
                               reporter=Reporter(io.StringIO()), opener=opener)
    assert sorted(contacted) == ["cp-01", "w-01", "w-02"]
    assert session.scope == ["w-01"]
    phase = next(p for p in PHASES if p.name == "package-cache")
    assert runner.phase_hosts(session, phase) == ["w-02"]
    off = session_mod.open_session(path, limit="w-01", sets=["package_cache=false"], command="plan",
                           reporter=Reporter(io.StringIO()), opener=opener)
    assert runner.phase_hosts(off, phase) == []
