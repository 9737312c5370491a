"""registry_mirrors: checked in the inventory, written as containerd's hosts.toml (one per
registry, no restart), removed when dropped, and Docker's daemon.json keys merged."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.checks import check_registry_mirrors
from gpuk8s.facts import HostFacts
from gpuk8s.facts.kube import ManagedRegistryHosts
from gpuk8s.facts.system import FileState
from gpuk8s.ops import registry as reg
from gpuk8s.roles import HostContext, load_role
from roles.preflight import role as preflight_role
from tests.unit.pki import certificate_pem
from tests.unit.scenarios import default_vars, fresh_facts

CA = certificate_pem()


@pytest.mark.parametrize("value, said", [
    ({"Docker.io": ["http://m:5000"]}, "'Docker.io' is not a registry name"),
    ({"docker.io": "http://m:5000"}, "needs a list of one or more mirrors"),
    ({"docker.io": []}, "needs a list of one or more mirrors"),
    ({"docker.io": ["ftp://m"]}, "must be an http(s) URL"),
    ({"docker.io": ["http://m:5000/x y"]}, "characters a URL may not"),
    ({"docker.io": ["https://user:pw@m"]}, "credentials belong in containerd's auth"),
    ({"docker.io": [{"url": "https://m", "tls": 1}]}, "unknown keys tls"),
    ({"docker.io": [{"insecure": True}]}, "needs a url"),
    ({"docker.io": [{"url": "http://m", "insecure": True}]}, "plain http already"),
    ({"docker.io": [{"url": "https://m", "insecure": "yes"}]}, "must be true or false"),
    ({"docker.io": [{"url": "https://m", "ca_file": "ca.pem"}]}, "must be an absolute path"),
    ({"docker.io": [{"url": "http://m", "ca_file": "/etc/hostname"}]}, "is plain http"),
    ({"docker.io": [{"url": "https://m", "ca_file": "/nonexistent/ca.pem"}]},
     "cannot read ca_file"),
    ({"docker.io": [{"url": "https://m", "ca_file": "/etc/hostname"}]}, "holds no PEM"),
])
def test_bad_mirrors_are_refused_with_the_registry_named(value: Any, said: str) -> None:
    problem = check_registry_mirrors("registry_mirrors", value)
    assert problem is not None and said in problem.message, problem
    assert problem.fix


def test_good_mirrors_pass(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(CA)
    assert check_registry_mirrors("registry_mirrors", {
        "docker.io": ["http://10.0.0.5:5000", {"url": "https://reg.lab", "ca_file": str(ca)}],
        "10.0.0.5:5000": [{"url": "https://m2.lab:443/v2/proxy", "insecure": True}],
        "_default": ["http://10.0.0.5:5000"]}) is None


def test_hosts_toml_is_containerds_format() -> None:
    wanted = reg.mirrors({"docker.io": ["http://10.0.0.5:5000/", {
        "url": "https://reg.lab:8443", "ca_file": "/x/ca.pem"}, {
        "url": "https://harbor.lab/v2/hub", "insecure": True}]})
    text = reg.hosts_toml("docker.io", wanted["docker.io"]).decode()
    assert text.splitlines()[0] == reg.MARKER
    data = tomllib.loads(text)
    assert data["server"] == "https://registry-1.docker.io"
    assert list(data["host"]) == ["http://10.0.0.5:5000", "https://reg.lab:8443",
                                  "https://harbor.lab/v2/hub"]   # the order they are tried in
    plain, with_ca, harbor = data["host"].values()
    assert plain == {"capabilities": ["pull", "resolve"]}  # no TLS keys: pure http
    assert with_ca["ca"] == "/etc/containerd/certs.d/docker.io/reg.lab_8443.crt"
    assert harbor == {"capabilities": ["pull", "resolve"], "override_path": True,
                      "skip_verify": True}
    assert tomllib.loads(reg.hosts_toml("nvcr.io", wanted["docker.io"][:1]).decode())[
        "server"] == "https://nvcr.io"
    assert "server" not in tomllib.loads(reg.hosts_toml("_default", wanted["docker.io"]).decode())


def test_docker_gets_hub_mirrors_and_insecure_registries_merged_into_its_own_file() -> None:
    wanted = reg.mirrors({"docker.io": ["http://10.0.0.5:5000"],
                          "nvcr.io": [{"url": "https://n.lab", "insecure": True}]})
    settings = reg.docker_settings(wanted)
    assert settings == {"registry-mirrors": ["http://10.0.0.5:5000"],
                        "insecure-registries": ["10.0.0.5:5000", "n.lab"]}
    merged = reg.merged_daemon_json(b'{"log-driver": "journald"}', settings)
    assert json.loads(merged or b"") == {"log-driver": "journald", **settings}
    assert reg.merged_daemon_json(b"[1]", settings) is None
    assert reg.merged_daemon_json(b"not json", settings) is None
    emptied = reg.merged_daemon_json(merged, reg.docker_settings({}))
    assert json.loads(emptied or b"") == {"log-driver": "journald"}


def plan(mirrors: dict[str, Any], managed: tuple[str, ...] = (), runtime: str = "containerd",
         daemon: bytes | None = None) -> dict[str, Any]:
    vars = default_vars(registry_mirrors=mirrors, container_runtime=runtime)
    values = dict(fresh_facts("ubuntu2404", 0, "n", vars).items())
    values[ManagedRegistryHosts()] = managed
    if daemon is not None:
        files = next(f for f in values if f.name == "Files" and "+" + reg.DAEMON_JSON in f.args)
        values[files] = {**values[files], reg.DAEMON_JSON: FileState(
            reg.DAEMON_JSON, True, "644", "root", "x", daemon)}
    ctx = HostContext("n", "container_runtime", vars, HostFacts("n", values), {}, ())
    return {op.id: op for op in load_role("container_runtime").plan(ctx)}


def test_plan_writes_one_hosts_toml_per_registry_without_a_restart() -> None:
    ops = plan({"docker.io": ["http://10.0.0.5:5000"], "nvcr.io": ["http://10.0.0.5:5000"]})
    for registry in ("docker.io", "nvcr.io"):
        op = ops[f"container_runtime | mirrors of {registry}"]
        assert op.changes and op.notify == ()
        assert f"/etc/containerd/certs.d/{registry}/hosts.toml" in op.reason
    assert 'config_path = "/etc/containerd/certs.d"' in (
        ops["container_runtime | config.toml"].diff or "")


def test_mirrors_dropped_from_the_inventory_are_removed_and_only_gpuk8s_ones() -> None:
    ops = plan({"docker.io": ["http://10.0.0.5:5000"]}, managed=("docker.io", "quay.io"))
    gone = ops["container_runtime | mirrors of quay.io"]
    assert gone.reason.startswith("- remove the mirrors of quay.io")
    assert "rm -f /etc/containerd/certs.d/quay.io/hosts.toml" in gone.commands[0]
    assert not any("ghcr.io" in k for k in ops)


def test_docker_daemon_json_is_merged_and_reloaded_not_overwritten() -> None:
    ops = plan({"docker.io": ["http://10.0.0.5:5000"]}, runtime="docker",
               daemon=b'{"data-root": "/srv/docker"}')
    op = ops["container_runtime | docker daemon.json"]
    assert op.notify == ("reload docker",)
    assert '"data-root": "/srv/docker"' in (op.diff or "")
    ops = plan({"docker.io": ["http://10.0.0.5:5000"]}, runtime="docker", daemon=b"{oops")
    assert ops["container_runtime | docker daemon.json"].warning


def preflight(answers: dict[str, tuple[int, str]]) -> tuple[list[Any], list[Any]]:
    from gpuk8s.facts.kube import RegistryAnswers

    vars = default_vars(registry_mirrors={"docker.io": ["http://10.0.0.5:5000"],
                                          "nvcr.io": ["http://10.0.0.5:5000", "https://n.lab"]})
    values = dict(fresh_facts("ubuntu2404", 0, "gpu-01", vars).items())
    values[RegistryAnswers("http://10.0.0.5:5000", "https://n.lab")] = answers
    ctx = HostContext("gpu-01", "preflight", vars, HostFacts("gpu-01", values), {}, ())
    errors, warnings = preflight_role.check(ctx)
    return ([p for p in errors if p[0] == "registry_mirror"],
            [p for p in warnings if p[0] == "registry_mirror"])


def test_preflight_names_each_mirror_that_does_not_answer() -> None:
    errors, _ = preflight({"http://10.0.0.5:5000": (200, ""), "https://n.lab": (401, "")})
    assert errors == []
    errors, _ = preflight({"http://10.0.0.5:5000": (0, "connection refused or no route"),
                           "https://n.lab": (404, "")})
    assert [e[1] for e in errors] == [
        "mirror http://10.0.0.5:5000 (of docker.io, nvcr.io) does not answer from this node: "
        "connection refused or no route",
        "mirror https://n.lab (of nvcr.io) does not answer from this node: HTTP 404 for https://n.lab/v2/"]
    assert "curl -sk http://10.0.0.5:5000/v2/" in errors[0][2]
    errors, warnings = preflight({u: (0, "no curl") for u in ("http://10.0.0.5:5000",
                                                              "https://n.lab")})
    assert errors == [] and len(warnings) == 2


def test_the_reachability_probe_runs_curl_against_v2(tmp_path: Path) -> None:
    import subprocess

    from gpuk8s.facts.kube import RegistryAnswers

    fact = RegistryAnswers("http://127.0.0.1:9/", "http://a b")
    assert RegistryAnswers().command() == "true"
    out = subprocess.run(["sh", "-c", fact.command()], capture_output=True, text=True).stdout
    got = fact.parse(out, 0)
    assert got["http://127.0.0.1:9/"] == (0, "connection refused or no route")
    assert "'http://a b/v2/'" in fact.command()  # a URL is one quoted word, never shell


def test_a_mirror_with_a_path_is_checked_at_its_server_s_own_api_root() -> None:
    """A mirror URL with a path is the API root itself (override_path: a Harbor project,
    serve-bundle's /v2/<registry>): the version check asks the server's /v2/, which the
    distribution spec defines, not <url>/v2/, which no registry serves."""
    from gpuk8s.facts.kube import api_check_url

    assert api_check_url("https://h:5443/v2/registry.k8s.io") == "https://h:5443/v2/"
    assert api_check_url("http://10.0.0.5:5000/") == "http://10.0.0.5:5000/v2/"
