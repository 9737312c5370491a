"""Security review 2: L1 (a registry mirror's host must be a DNS name or IP address, and no URL
holds shell characters), L7 (only the certificates of a mirror's ca_file reach the nodes; a
private key is refused) and old #15's residual (no credentials in apt repository and key URLs,
which curl would carry on every node's command line and apt in a world-readable .list file)."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.checks import check_registry_mirrors, check_url
from gpuk8s.errors import Gpuk8sError
from gpuk8s.facts import HostFacts
from gpuk8s.facts.kube import ManagedRegistryHosts
from gpuk8s.facts.system import FileState
from gpuk8s.ops import apt
from gpuk8s.ops import registry as reg
from gpuk8s.roles import HostContext, load_role
from gpuk8s.sinks import UnsafeValue
from gpuk8s.variables import check_value, load_variable_specs
from tests.unit.pki import certificate_pem, private_key_pem
from tests.unit.scenarios import default_vars, fresh_facts

# --------------------------------------------------------------------------- L1: validation


@pytest.mark.parametrize("url, said", [
    ("https://$(id$IFS-un)x.lab:5000", "'$', '(', ')'"),
    ("https://reg_lab:5000", "neither a DNS name nor an IP address"),
    ("https://re%24g.lab", "neither a DNS name nor an IP address"),
    ("https://a..b:5000", "neither a DNS name nor an IP address"),
    ("https://[fd00::zz]:5000", "characters a URL may not"),
    ("https://reg.lab:5x0", "must be an http(s) URL"),
])
def test_a_mirror_host_must_be_a_dns_name_or_ip_address(tmp_path: Path, url: str,
                                                        said: str) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(certificate_pem())
    for mirror in (url, {"url": url, "ca_file": str(ca)}):
        problem = check_registry_mirrors("registry_mirrors", {"docker.io": [mirror]})
        assert problem is not None and said in problem.message, (url, problem)
        assert problem.fix and url not in problem.fix


def test_good_mirror_hosts_pass_and_name_their_ca_file(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(certificate_pem())
    for url, file in (("https://reg.lab:5000", "reg.lab_5000.crt"),
                      ("https://10.0.0.5", "10.0.0.5.crt"),
                      ("https://[fd00::5]:5000/v2/hub", "[fd00__5]_5000.crt")):
        assert check_registry_mirrors("registry_mirrors", {"docker.io": [
            {"url": url, "ca_file": str(ca)}]}) is None, url
        mirror = reg.mirrors({"docker.io": [{"url": url, "ca_file": str(ca)}]})["docker.io"][0]
        assert reg.ca_path("docker.io", mirror) == f"/etc/containerd/certs.d/docker.io/{file}"


def test_the_ca_file_name_comes_only_from_a_checked_host() -> None:
    """Even a value that never passed the inventory check cannot name a file with a command."""
    from gpuk8s.sinks import registry_host

    hostile = reg.Mirror("https://$(id$IFS-un)x.lab:5000", ca_file="/x/ca.pem")
    with pytest.raises(UnsafeValue, match="neither a DNS name nor an IP address"):
        reg.ca_path("docker.io", hostile)
    with pytest.raises(UnsafeValue, match="port"):
        registry_host("reg.lab:99999")


@pytest.mark.parametrize("char", ["$", "(", ")", "!", "&", "*", "'", "`"])
def test_urls_refuse_shell_characters_and_say_how_to_encode_them(char: str) -> None:
    problem = check_url("kubernetes_repo_url", f"https://mirror.lan/k8s{char}/")
    assert problem is not None
    assert "characters a URL may not" in problem.message and repr(char) in problem.message
    assert f"%{ord(char):02X}" in problem.fix


def test_a_refused_url_never_shows_its_password() -> None:
    problem = check_url("apt_proxy", "http://bob:Pa$$w0rd@proxy:3128", allow_empty=True)
    assert problem is not None and "Pa$$w0rd" not in problem.message + problem.fix
    assert "bob:***@proxy:3128" in problem.message
    problem = check_registry_mirrors("registry_mirrors", {"docker.io": [
        "https://bob:s3cr3t@reg.lab:5000"]})
    assert problem is not None and "s3cr3t" not in problem.message + problem.fix
    assert "credentials belong in containerd's auth settings" in problem.message


# --------------------------------------------------------------------------- L7: ca_file


def _mirror_with(tmp_path: Path, data: bytes) -> dict[str, Any]:
    ca = tmp_path / "registry.pem"
    ca.write_bytes(data)
    return {"docker.io": [{"url": "https://reg.lab:5000", "ca_file": str(ca)}]}


def _ca_op(value: dict[str, Any]) -> Any:
    vars = default_vars(registry_mirrors=value)
    values = dict(fresh_facts("ubuntu2404", 0, "n", vars).items())
    values[ManagedRegistryHosts()] = ()
    ctx = HostContext("n", "container_runtime", vars, HostFacts("n", values), {}, ())
    ops = {op.id: op for op in load_role("container_runtime").plan(ctx)}
    return ops["container_runtime | CA of mirror reg.lab:5000"]


def _written(op: Any) -> bytes:
    """The bytes the op's write_file snippet puts on the node."""
    encoded = re.search(r"<<'GPUK8S_EOF'\n(.*?)GPUK8S_EOF", op.commands[0], re.S)
    assert encoded
    return base64.b64decode(encoded[1])


@pytest.mark.parametrize("key_label", ["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY",
                                       "ENCRYPTED PRIVATE KEY"])
def test_a_ca_file_holding_a_private_key_is_refused(tmp_path: Path, key_label: str) -> None:
    key = private_key_pem().replace(b"PRIVATE KEY", key_label.encode())
    value = _mirror_with(tmp_path, certificate_pem() + key)
    problem = check_registry_mirrors("registry_mirrors", value)
    assert problem is not None
    assert f"ca_file {tmp_path / 'registry.pem'} holds a private key ({key_label})" \
        in problem.message
    assert "openssl x509" in problem.fix and "only the registry's CA certificate" in problem.fix
    with pytest.raises(Gpuk8sError, match="holds a private key"):
        _ca_op(value)  # nothing reaches a node, nor plan --diff


def test_only_the_certificates_of_a_ca_file_reach_the_nodes(tmp_path: Path) -> None:
    one, two = certificate_pem("root"), certificate_pem("intermediate")
    crl = b"-----BEGIN X509 CRL-----\nTUlJQg==\n-----END X509 CRL-----\n"
    value = _mirror_with(tmp_path, b"Bag Attributes\n    friendlyName: reg\n" + one + crl
                         + b"subject=CN = intermediate\n" + two)
    assert check_registry_mirrors("registry_mirrors", value) is None
    op = _ca_op(value)
    assert _written(op) == one + two
    assert "Bag Attributes" not in (op.diff or "") and "X509 CRL" not in (op.diff or "")
    assert "chmod 0644" in op.commands[0]
    plain = _mirror_with(tmp_path, one)
    assert _written(_ca_op(plain)) == one  # a file of one certificate is copied as it is


def test_a_ca_file_block_that_is_no_certificate_is_refused(tmp_path: Path) -> None:
    value = _mirror_with(tmp_path, certificate_pem() + b"-----BEGIN CERTIFICATE-----\nMIIB\n"
                         b"-----END CERTIFICATE-----\n")
    problem = check_registry_mirrors("registry_mirrors", value)
    assert problem is not None and "certificate 2 of 2 is not a valid X.509" in problem.message
    assert problem.fix


# --------------------------------------------------------------------------- #15: repo URLs

SPECS = load_variable_specs()


@pytest.mark.parametrize("name", ["kubernetes_repo_url", "kubernetes_repo_key_url",
                                  "docker_repo_url", "nvidia_cuda_repo_key_url",
                                  "nvidia_container_toolkit_repo_url"])
@pytest.mark.parametrize("url", ["https://u:t0k3n@mirror.lan/k8s/",
                                 "https://t0k3nAsUser@mirror.lan/k8s/"])
def test_credentials_in_a_repo_url_are_refused_without_showing_them(name: str,
                                                                    url: str) -> None:
    _, problem = check_value(SPECS[name], url)
    assert problem is not None and "holds a user name or password" in problem.message
    assert "t0k3n" not in problem.message.replace("t0k3nAsUser", "") + problem.fix
    assert "'https://mirror.lan/k8s/'" in problem.fix and "auth.conf.d" in problem.fix
    assert check_value(SPECS[name], "https://mirror.lan/k8s/")[1] is None


def test_the_apt_source_op_never_puts_credentials_on_curls_command_line() -> None:
    lst = FileState("/etc/apt/sources.list.d/k.list", False)
    key = FileState("/etc/apt/keyrings/k.gpg", False)
    for url, key_url in (("https://u:t0k3n@mirror.lan/k8s/", "https://mirror.lan/k8s/R.key"),
                         ("https://mirror.lan/k8s/", "https://u:t0k3n@mirror.lan/k8s/R.key")):
        with pytest.raises(UnsafeValue, match="holds a user name or password"):
            apt.repo(lst, key, "k", name="kubernetes", url=url, suite="/", components="",
                     key_url=key_url)
    op = apt.repo(lst, key, "k", name="kubernetes", url="https://mirror.lan/k8s/", suite="/",
                  components="", key_url="https://mirror.lan/k8s/R.key")
    assert "@" not in "\n".join(op.commands)
