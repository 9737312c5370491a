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

from gpuk8s.facts import HostFacts
from gpuk8s.facts.gather import endpoint_of
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
