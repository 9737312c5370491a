"""Several control planes (issue 17): the endpoint each mode gives, the local load balancer's
plan on control planes and workers, and a control plane's join (certificate key, patches,
waiting for its API server), all from plans, contacting no host."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s.cluster_values import endpoint_of
from gpuk8s.facts import HostFacts
from gpuk8s.inventory import load_inventory
from gpuk8s.roles import HostContext, load_role
from gpuk8s.sinks import UnsafeValue, haproxy_server
from tests.unit.scenarios import default_vars, fresh_facts

CPS = [{"host": "cp-01", "address": "10.0.0.10"}, {"host": "cp-02", "address": "10.0.0.11"},
       {"host": "cp-03", "address": "10.0.0.12"}]
KEY = "ab" * 32


def cluster(mode: str = "local_lb") -> dict[str, Any]:
    return {"endpoint": "127.0.0.1:6443", "endpoint_mode": mode, "control_planes": CPS,
            "advertise_address": "10.0.0.10", "node_name": "cp-01",
            "nodes": {h: {"name": h, "address": a} for h, a in
                      [(c["host"], c["address"]) for c in CPS] + [("w1", "10.0.0.20")]},
            "join": {"endpoint": "127.0.0.1:6443", "token": "abcdef.0123456789abcdef",
                     "ca_hash": "sha256:" + "0" * 64},
            "certificate_key": KEY}


def plan(role: str, host: str, values: dict[str, Any] | None = None) -> list[Any]:
    v = default_vars()
    facts = fresh_facts("ubuntu2404", 0, host, v)
    ctx = HostContext(host, role, v, HostFacts(host, dict(facts.items())), values or cluster())
    return load_role(role).plan(ctx)


def written(op: Any, path: str) -> str:
    """The content an op's commands write to ``path`` (write_file's base64 here-document)."""
    for cmd in op.commands:
        if path in cmd:
            body = re.search(r"<<'GPUK8S_EOF'\n(.*?)GPUK8S_EOF", cmd, re.S)
            assert body, cmd
            return base64.b64decode(body.group(1)).decode()
    raise AssertionError(f"{op.id} writes no {path}")


def inventory(tmp_path: Path, cps: int, extra: str = "") -> Any:
    hosts = "\n".join(f"cp-0{i} ansible_host=10.0.0.1{i}" for i in range(1, cps + 1))
    path = tmp_path / "inventory.ini"
    path.write_text(f"[control_plane]\n{hosts}\n\n[workers]\nw1 ansible_host=10.0.0.20\n"
                    f"\n[all:vars]\n{extra}\n")
    return load_inventory(path)


@pytest.mark.parametrize(("cps", "extra", "want"), [
    (1, "", ("direct", "10.0.0.11:6443")),
    (3, "", ("local_lb", "127.0.0.1:6443")),
    (1, "control_plane_endpoint_mode=local_lb", ("local_lb", "127.0.0.1:6443")),
    (3, "control_plane_endpoint=lb.lab:6443", ("external", "lb.lab:6443")),
])
def test_the_endpoint_each_mode_gives(tmp_path: Path, cps: int, extra: str,
                                      want: tuple[str, str]) -> None:
    assert endpoint_of(inventory(tmp_path, cps, extra)) == want


def test_every_node_gets_haproxy_in_front_of_every_control_plane() -> None:
    ops = {op.id: op for op in plan("apiserver_lb", "w1")}
    assert "apiserver_lb | api server bind address" not in ops  # a worker serves no API
    assert "install haproxy" in ops["apiserver_lb | haproxy"].reason
    cfg = written(ops["apiserver_lb | haproxy.cfg"], "/etc/haproxy/haproxy.cfg")
    assert "bind 127.0.0.1:6443" in cfg
    assert re.findall(r"server (cp\d) (\S+)", cfg) == [
        ("cp1", "10.0.0.10:6443"), ("cp2", "10.0.0.11:6443"), ("cp3", "10.0.0.12:6443")]
    assert "option httpchk GET /readyz" in cfg
    assert ops["apiserver_lb | haproxy.cfg"].notify == ("reload haproxy",)


def test_a_control_planes_api_server_binds_its_own_address_only() -> None:
    ops = {op.id: op for op in plan("apiserver_lb", "cp-02")}
    patch = written(ops["apiserver_lb | api server bind address"],
                    "/etc/kubernetes/gpuk8s/patches/kube-apiserver0+json.json")
    assert yaml.safe_load(patch) == [{"op": "add", "path": "/spec/containers/0/command/-",
                                      "value": "--bind-address=10.0.0.11"}]


def test_no_load_balancer_without_local_lb() -> None:
    assert plan("apiserver_lb", "w1", cluster("direct")) == []
    assert plan("apiserver_lb", "w1", cluster("external")) == []


def test_a_hostile_address_never_reaches_haproxy_cfg() -> None:
    assert haproxy_server("fd00::5", 6443) == "ipv6@fd00::5:6443"
    for bad in ("10.0.0.1 backup", "a\nserver evil 1.2.3.4:1", "x;y"):
        with pytest.raises(UnsafeValue, match=r"cannot be a server in haproxy\.cfg"):
            haproxy_server(bad, 6443)


def test_a_control_plane_joins_with_the_certificate_key_and_waits_for_its_api_server() -> None:
    [op] = plan("join", "cp-02")
    assert op.reason == "+ kubeadm join --control-plane 127.0.0.1:6443"
    assert op.secret  # the token and the certificate key never reach a log
    config = yaml.safe_load(written(op, "/etc/kubernetes/gpuk8s/kubeadm-join.yaml"))
    assert config["controlPlane"] == {
        "localAPIEndpoint": {"advertiseAddress": "10.0.0.11", "bindPort": 6443},
        "certificateKey": KEY}
    assert config["patches"] == {"directory": "/etc/kubernetes/gpuk8s/patches"}
    script = "\n".join(op.commands)
    assert "--server https://10.0.0.11:6443" in script and "/readyz" in script


def test_a_worker_joins_as_a_node_without_the_key() -> None:
    [op] = plan("join", "w1")
    assert op.reason == "+ kubeadm join 127.0.0.1:6443"
    config = yaml.safe_load(written(op, "/etc/kubernetes/gpuk8s/kubeadm-join.yaml"))
    assert "controlPlane" not in config and KEY not in str(config)


def test_the_first_control_planes_certificates_name_every_control_plane() -> None:
    from roles.control_plane.role import cert_sans

    assert cert_sans(cluster()) == ["10.0.0.10", "cp-01", "127.0.0.1", "10.0.0.11",
                                    "10.0.0.12"]


# etcd 3.5's own answers (captured from the lab's real etcd-server), and the API server's
# /readyz?verbose lines
MEMBERS = ('{"header":{"cluster_id":"2637371641948146374"}, "members":[{"ID":"2192175851495927271",'
           ' "name":"gpu-02", "peerURLs":["https://10.88.0.13:2380"]}, {"ID":"7039377769585566550",'
           ' "name":"cp-01", "peerURLs":["https://10.88.0.11:2380"]}, {"ID":"9281363292963324186",'
           ' "name":"cpu-01", "peerURLs":["https://10.88.0.14:2380"]}]}')


def test_a_control_planes_health_is_read_from_etcd_and_readyz() -> None:
    from gpuk8s.facts.controlplane import ControlPlaneHealth

    fact = ControlPlaneHealth()
    good = fact.parse("## health\n{\"health\":\"true\",\"reason\":\"\"}\n## members\n"
                      f"{MEMBERS}\n## readyz\n[+]ping ok\n[+]etcd ok\nreadyz check passed\n", 0)
    assert (good.etcd_healthy, good.members, good.api_ready) == (
        True, ("cp-01", "cpu-01", "gpu-02"), True)
    assert good.words == "etcd ok, API ok"
    lost = fact.parse("## health\n{\"health\":\"false\",\"reason\":\"RAFT NO LEADER\"}\n"
                      "## members\n\n## readyz\n[+]ping ok\n[-]etcd failed: reason withheld\n"
                      "readyz check failed\n", 0)
    assert lost.words == ("etcd unhealthy: RAFT NO LEADER, API not ready: etcd failed: reason "
                          "withheld")
    silent = fact.parse("## health\n\n## members\n\n## readyz\nno answer\n", 0)
    assert silent.words == "etcd not answering, API not ready: no answer"
    assert not fact.parse("", 0).present  # not a control plane: nothing to say


def row(host: str, state: str = "Ready", healthy: bool | None = True) -> dict[str, Any]:
    r: dict[str, Any] = {"host": host, "role": "control-plane", "state": state}
    if state != "unreachable":
        r.update(etcd_healthy=healthy, etcd_members=["cp-01", "cp-02", "cp-03"])
    return r


def test_quorum_in_words() -> None:
    from gpuk8s.day2.status import quorum

    assert quorum([row("cp-01"), row("cp-02"), row("cp-03", "unreachable")]) == (
        "etcd: 2 of 3 members healthy (a majority is 2): the cluster accepts writes; "
        "not healthy: cp-03 (unreachable)")
    text = quorum([row("cp-01", healthy=False), row("cp-02", "unreachable"),
                   row("cp-03", "unreachable")])
    assert text.startswith("etcd has NO QUORUM: 1 of 3 members are up (cp-01) and etcd needs 2")
    assert "refuse writes until 1 more control plane(s) are back" in text
    assert quorum([{"host": "w1", "role": "worker", "state": "Ready"}]) == ""


def test_plan_refuses_two_control_planes_before_contacting_any_host(tmp_path: Path) -> None:
    from gpuk8s import api
    from gpuk8s.errors import InventoryError

    contacted: list[str] = []

    def opener(spec: Any, redact: Any) -> Any:
        contacted.append(spec.name)
        raise AssertionError("no host may be contacted")

    path = inventory(tmp_path, 2).path
    with pytest.raises(InventoryError, match=r"2 control planes \(cp-01, cp-02\)") as exc:
        api.plan(path, opener=opener)
    assert "use an odd number of control planes: 1 or 3" in str(exc.value)
    assert contacted == []


def test_a_joining_control_plane_checks_the_first_ones_ports_before_kubeadm_join() -> None:
    [op] = plan("join", "cp-02")
    check = next(i for i, c in enumerate(op.commands) if "/dev/tcp" in c)
    join = next(i for i, c in enumerate(op.commands) if "kubeadm join --config" in c)
    assert check < join
    assert "for p in 2379 2380 6443" in op.commands[check] and "10.0.0.10" in op.commands[check]


def test_an_external_endpoint_must_resolve_on_every_node() -> None:
    from gpuk8s.facts.controlplane import Reaches
    from roles.preflight.role import _endpoint_problems

    fact = Reaches("lb.lab:6443")
    assert "getent ahosts" in fact.command() and "'lb.lab'" not in fact.command()
    assert fact.parse("R unresolved\n", 0) == {"lb.lab:6443": "unresolved"}
    v = default_vars(control_plane_endpoint="lb.lab:6443")
    facts = dict(fresh_facts("ubuntu2404", 0, "w1", v).items())
    for state, errors, warnings in (("unresolved", 1, 0), ("no answer", 0, 1), ("ok", 0, 0)):
        facts[fact] = {"lb.lab:6443": state}
        ctx = HostContext("w1", "preflight", v, HostFacts("w1", facts), {"joined": {}})
        got = _endpoint_problems(ctx)
        assert (len(got[0]), len(got[1])) == (errors, warnings), (state, got)
    assert "'lb.lab' does not resolve on this node" in str(_endpoint_problems(HostContext(
        "w1", "preflight", v, HostFacts("w1", {**facts, fact: {"lb.lab:6443": "unresolved"}}),
        {}))[0])
    hostile = Reaches("a;rm -rf /:6443").command()
    assert "h='a;rm -rf /'" in hostile  # one shell word


def test_a_gpu_worker_add_node_joins_cordons_itself_for_accept() -> None:
    values = cluster()
    values["nodes"]["w1"]["gpus"] = 2
    [op] = plan("join", "w1", {**values, "join_cordoned": True})
    assert op.reason.endswith("then cordoned until accept --quick passes (accept_on_add)")
    script = "\n".join(op.commands)
    # its own kubelet credentials: a kubelet may cordon and annotate its Node, never taint it
    assert "kubectl --kubeconfig /etc/kubernetes/kubelet.conf cordon w1" in script
    assert "gpuk8s.io/accept-pending=true gpuk8s.io/cordoned-by=gpuk8s-accept" in script
    assert script.index("kubeadm join --config") < script.index("cordon w1")
    # bootstrap (no join_cordoned), a CPU worker, or accept_on_add: false join as before
    values_plain = cluster()
    values_plain["nodes"]["w1"]["gpus"] = 2
    for host, v in (("w1", values_plain), ("w1", {**cluster(), "join_cordoned": True})):
        assert "cordon" not in "\n".join(plan("join", host, v)[0].commands)
