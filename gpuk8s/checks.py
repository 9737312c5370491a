"""Value checks of inventory variables: each takes the variable's name and value and returns
a VarProblem (what is wrong and what to write instead) or None. Roles name the checks of their
variables in their RULES (roles/<role>/role.py), with their checks across a host's variables
(Rule.across); variables.check_value and check_combination apply them."""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuk8s.cafile import CaFileProblem, read_ca_file
from gpuk8s.sinks import APT_CONF_HOST, registry_host_problem

SUPPORTED_KUBERNETES = ("1.34", "1.35", "1.36", "1.37")


SUPPORTED_DRIVER_BRANCHES = ("535", "550", "570", "575", "580")

#: Branches gpuk8s refuses, with the reason. From 590 NVIDIA's CUDA repository names the Ubuntu
#: and Debian driver packages without the branch (`nvidia-open`, `cuda-drivers`; "cuda-drivers-580
#: ... will be removed") and locks a branch with a `nvidia-driver-pinning-<branch>` package
#: (NVIDIA Driver Installation Guide r590, "Recent updates: Ubuntu 590 and later packages");
#: Ubuntu's archive made nvidia-driver-590 a transitional package to 595. gpuk8s pins a branch
#: by package name and has not been checked against that scheme.
REFUSED_DRIVER_BRANCHES = {
    b: (f"NVIDIA driver branch {b} is not supported yet: from 590, NVIDIA's CUDA repository "
        "drops the branch from the driver package names and locks a branch with "
        f"nvidia-driver-pinning-{b}, which gpuk8s does not install")
    for b in ("590", "595")}


JINJA_MARK = re.compile(r"{{|{%")


def has_jinja(value: Any) -> bool:
    """A string with a Jinja placeholder ({{ or {%) in it."""
    return isinstance(value, str) and bool(JINJA_MARK.search(value))


JINJA_EXPR = re.compile(r"{{.*?}}|{%.*?%}", re.S)


@dataclass(frozen=True)
class VarProblem:
    """A value that is wrong: which variable, why, and what to write instead.

    ``subkey`` names an entry inside a mapping value (a feature gate) when the problem is there.
    """

    key: str
    message: str
    fix: str
    subkey: str | None = None
    others: tuple[str, ...] = ()  # other variables involved (combination checks)


#: a variable's check: (its name, its value) -> what is wrong, or None
Check = Callable[[str, Any], VarProblem | None]
#: a variable's check against the host's other variables: (the host's values) -> what is wrong
#: with it (the problem's key), or None
Across = Callable[[Mapping[str, Any]], VarProblem | None]


def show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_positive(name: str, value: int) -> VarProblem | None:
    if value <= 0:
        return VarProblem(name, f"{name} must be a positive number, got {value}",
                          f"write {name}: 600 (seconds/units, greater than 0)")
    return None


def check_count(name: str, value: int) -> VarProblem | None:
    """A number of things to keep (backups): at least 1."""
    if value < 1:
        return VarProblem(name, f"{name} must be at least 1, got {value}",
                          f"write {name}: 10 (how many to keep)")
    return None


def matching(pattern: str, must_be: str, fix: str, *, or_empty: bool = False) -> Check:
    """The check of a value that must match ``pattern`` as a whole (``or_empty``: or be ""):
    "<name> must be <must_be>, got <value>", fixed by "write <name>: <fix>"."""
    regex = re.compile(pattern)

    def check(name: str, value: str) -> VarProblem | None:
        if (or_empty and not value) or regex.fullmatch(value):
            return None
        return VarProblem(name, f"{name} must be {must_be}, got {value!r}",
                          f"write {name}: {fix}")

    return check


#: a DNS-1123 label (a namespace, a Kubernetes user of the lab)
DNS_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
check_package_version = matching(r"\d+\.\d+\.\d+-[0-9A-Za-z.+~]+",
                                 'an apt version like "1.36.2-1.1"',
                                 '"1.36.2-1.1" or "" for the newest patch', or_empty=True)
check_driver_version = matching(r"\d{3}\.\d+(?:\.\d+)?(?:-[0-9A-Za-z.+~]+)?",
                                'a driver package version like "580.159.04-1"',
                                '"580.159.04-1" or "" for the newest of the branch',
                                or_empty=True)
check_major_minor = matching(r"\d+\.\d+", 'major.minor like "13.0"', '"13.0"')
check_registry = matching(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:\d+)?(/[a-z0-9._-]+)*",
                          "a registry host (and optional path) without a scheme", "quay.io")
check_containerd_version = matching(r"\d+\.\d+\.\d+(?:-[0-9A-Za-z.+~]+)?",
                                    '"" or a version like "2.1.4"', '"2.1.4" or "" for the newest',
                                    or_empty=True)
check_duration = matching(r"(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+|0",
                          'a duration like "15m0s" or "1h"', '"15m0s"')
#: the gpuk8s lab's repo signing key (tests/lab/keys/, whose private key is committed, so
#: anyone can sign for it) and the lab's subnet: preflight refuses a pin to that key elsewhere
LAB_KEY_FINGERPRINT = "4DB64E86A138065762E9BAA291D795CA270F06CD"
LAB_SUBNET = ipaddress.ip_network("10.88.0.0/24")
#: an image reference as containerd and Docker parse it: [registry[:port]/]path[:tag][@digest]
IMAGE_REF = (r"(?:[a-z0-9]([a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*(?::\d{1,5})?/)?"
             r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
             r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?")
check_image_ref = matching(IMAGE_REF, 'an image reference like "registry.k8s.io/pause:3.10"',
                           '"registry.k8s.io/pause:3.10" or "" for the one kubeadm expects',
                           or_empty=True)
check_dns_domain = matching(rf"{DNS_LABEL}(\.{DNS_LABEL})*", "a lower-case DNS domain",
                            "cluster.local")


def major_minor(value: Any) -> tuple[int, int] | None:
    """(major, minor) of a "major.minor" string such as kubernetes_version, else None."""
    if isinstance(value, str):
        m = re.fullmatch(r"(\d+)\.(\d+)", value.strip())
        if m:
            return int(m[1]), int(m[2])
    return None


def check_kubernetes_version(name: str, value: str) -> VarProblem | None:
    supported = ", ".join(SUPPORTED_KUBERNETES)
    v = value.strip()
    if v.lower().startswith("v"):
        return VarProblem(name, f"{name} is written without the v: {value!r}",
                          f'write {name}: "{v[1:]}"')
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:-.*)?", v)
    if m:
        minor = f"{m[1]}.{m[2]}"
        return VarProblem(
            name, f"{name} is a minor version (major.minor), not a full version {value!r}",
            f'use {name}: "{minor}" and kubernetes_package_version: "{m[1]}.{m[2]}.{m[3]}-1.1" '
            f"for an exact pin")
    if not re.fullmatch(r"\d+\.\d+", v):
        return VarProblem(name, f"{name} must be major.minor like \"1.36\", got {value!r}",
                          f'write {name}: "1.36" (supported: {supported})')
    if v not in SUPPORTED_KUBERNETES:
        return VarProblem(name, f"Kubernetes {v} is not supported (supported: {supported})",
                          f'write {name}: "{SUPPORTED_KUBERNETES[-2]}"')
    return None


def check_driver_branch(name: str, value: str) -> VarProblem | None:
    branches = ", ".join(SUPPORTED_DRIVER_BRANCHES)
    m = re.fullmatch(r"(\d{3})\.\d+(?:\.\d+)?(?:-.*)?", value)
    if m:
        return VarProblem(name, f"{name} is the branch (3 digits), not a driver version "
                          f"{value!r}", f'use {name}: "{m[1]}" and nvidia_driver_version: '
                          f'"{value}" for an exact pin')
    if not re.fullmatch(r"\d{3}", value):
        return VarProblem(name, f"{name} must be 3 digits like \"580\", got {value!r}",
                          f'write {name}: "580" (supported: {branches})')
    if value in REFUSED_DRIVER_BRANCHES:
        return VarProblem(name, REFUSED_DRIVER_BRANCHES[value],
                          f'write {name}: "580" (the newest branch gpuk8s installs; supported: '
                          f'{branches})')
    if value not in SUPPORTED_DRIVER_BRANCHES:
        return VarProblem(name, f"NVIDIA driver branch {value} is not supported "
                          f"(supported: {branches})", f'write {name}: "580"')
    return None


def check_xyz(name: str, value: str) -> VarProblem | None:
    if re.fullmatch(r"v\d+\.\d+\.\d+", value):
        return VarProblem(name, f"{name} is written without the v: {value!r}",
                          f'write {name}: "{value[1:]}"')
    if not re.fullmatch(r"\d+\.\d+\.\d+", value):
        return VarProblem(name, f"{name} must be a version x.y.z like \"1.20.0\", got {value!r}",
                          f'write {name}: "1.2.3" (three numbers)')
    return None


def check_calico_block_size(name: str, value: int) -> VarProblem | None:
    if not 20 <= value <= 32:
        return VarProblem(name, f"{name} must be a prefix length from 20 to 32, got {value}",
                          f"write {name}: 26 (Calico's default: 64 addresses a block)")
    return None


def check_mtu(name: str, value: int) -> VarProblem | None:
    if value != 0 and not 1280 <= value <= 9000:
        return VarProblem(name, f"{name} must be 0 (detect) or from 1280 to 9000, got {value}",
                          f"write {name}: 0 to let Calico detect it")
    return None


def parse_network(value: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(value, strict=True)
    except ValueError:
        return None


def check_cidr(name: str, value: str) -> VarProblem | None:
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        try:
            loose = ipaddress.ip_network(value, strict=False)
        except ValueError:
            example = "10.96.0.0/12" if name == "service_cidr" else "10.244.0.0/16"
            return VarProblem(name, f"{name} is not a network in CIDR form: {value!r} ({exc})",
                              f'write {name}: "{example}"')
        return VarProblem(name, f"{name} {value!r} has host bits set",
                          f'write {name}: "{loose}"')
    if name == "service_cidr" and net.max_prefixlen - net.prefixlen > 20:
        most = net.max_prefixlen - 20
        return VarProblem(name, f"{name} {value} is too large: the API server allows at most "
                          f"/{most} for services", f'write {name}: "10.96.0.0/12"')
    if name == "pod_cidr" and net.version == 4 and net.prefixlen > 24:
        return VarProblem(name, f"{name} {value} is too small: every node gets a /24 of it",
                          f'write {name}: "10.244.0.0/16"')
    return None


def check_feature_gates(name: str, value: dict[Any, Any]) -> VarProblem | None:
    for gate, on in value.items():
        if gate == "Accelerators":
            return VarProblem(
                name, "feature gate Accelerators was removed in Kubernetes 1.11 (kubelet refuses "
                "to start with it); GPUs are now exposed by the NVIDIA device plugin as "
                "nvidia.com/gpu, enabled by default with gpuk8s",
                "remove Accelerators from feature_gates; request GPUs with "
                "resources.limits: {nvidia.com/gpu: 1}", subkey="Accelerators")
        if gate == "DevicePlugins":
            return VarProblem(
                name, "feature gate DevicePlugins went GA in Kubernetes 1.26 and the gate was "
                "removed; device plugins (the NVIDIA one serves nvidia.com/gpu) are always on",
                "remove DevicePlugins from feature_gates", subkey="DevicePlugins")
        if not isinstance(gate, str) or not re.fullmatch(r"[A-Z][A-Za-z0-9]*", gate):
            return VarProblem(name, f"feature gate name {show(gate)} is not CamelCase",
                              f"write {name}: {{DynamicResourceAllocation: true}}",
                              subkey=gate if isinstance(gate, str) else None)
        if not isinstance(on, bool):
            return VarProblem(name, f"feature gate {gate} must be true or false, got {show(on)}",
                              f"write {gate}: true", subkey=gate)
    return None


def check_endpoint(name: str, value: str) -> VarProblem | None:
    if value == "":
        return None
    m = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?):(\d{1,5})",
                     value)
    if not m or not 1 <= int(m[3]) <= 65535:
        return VarProblem(name, f"{name} must be \"host:port\" (or \"\"), got {value!r}",
                          f'write {name}: "k8s-api.example.lan:6443"')
    return None


#: what a URL may hold besides letters and digits: no quote, backslash, semicolon, brace,
#: space or control character, so it cannot end an apt.conf string or a sources.list field; and
#: none of ``$ ( ) ! & * ' ` ``, which mean something to a shell and which no repository, key,
#: proxy or registry URL needs (percent-encoded they stay what they were)
_URL_CHARS = re.compile(r"[A-Za-z0-9._~:/?#@+,=%-]+")


_URL_IPV6_HOST = re.compile(r"^[a-z]+://([^/@]*@)?\[[0-9A-Fa-f:.]+\]")

#: variables whose URL apt writes to a world-readable sources.list file and curl takes on
#: its command line on every node: no user name or password there
_NO_USERINFO = ("_repo_url", "_repo_key_url")


def masked_url(url: str) -> str:
    """``url`` with the password of its userinfo (``user:pass@``) shown as ``***``."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    userinfo, at, host = netloc.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.partition(':')[0]}:***@{host}{slash}{path}"


def check_url(name: str, value: str, *, allow_empty: bool = False,
               rendered: bool = False) -> VarProblem | None:
    if allow_empty and value == "":
        return None
    example = "http://10.0.0.1:3142" if allow_empty else "https://mirror.example.lan/path/"
    fix = f'write {name}: "{example}"' + (' or ""' if allow_empty else "")
    plain = value if rendered else JINJA_EXPR.sub("x", value)
    if value.lstrip().startswith(("{{", "{%")) and not rendered:
        return None  # scheme and host come from a placeholder: checked once rendered
    shown_value = masked_url(value)
    bare = _URL_IPV6_HOST.sub(lambda m: m[0].replace("[", "").replace("]", ""), plain)
    if not _URL_CHARS.fullmatch(bare):
        bad = sorted({c for c in bare if not _URL_CHARS.fullmatch(c)})
        shown = ", ".join(repr(c) for c in bad) or "nothing"
        encoded = ", ".join(f"{c!r} as %{ord(c):02X}" for c in bad if ord(c) < 128)
        return VarProblem(name, f"{name} holds characters a URL may not ({shown}): "
                          f"{shown_value!r}", fix + "; percent-encode such characters ("
                          + (encoded or "%20 for a space") + ")")
    parts = urllib.parse.urlsplit(plain)
    try:
        bad_port = parts.port == 0
    except ValueError:  # not a number, or out of 0-65535
        bad_port = True
    if parts.scheme not in ("http", "https") or not parts.hostname or bad_port:
        return VarProblem(name, f"{name} must be an http(s) URL, got {shown_value!r}", fix)
    if name.endswith(_NO_USERINFO) and "@" in parts.netloc:
        return VarProblem(
            name, f"{name} holds a user name or password ({shown_value!r}): curl would carry "
            "it on every node's command line (visible in ps) and apt in a world-readable file "
            "under /etc/apt/sources.list.d",
            f"remove it from the URL ({_without_userinfo(value)!r}); "
            "for a repository behind a login, give apt the login in a root-only file on the "
            "nodes, /etc/apt/auth.conf.d/<name>.conf (\"machine HOST/PATH login USER password "
            "SECRET\", mode 0600; man apt_auth.conf), and serve the signing key without one")
    return None


def _without_userinfo(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    return f"{scheme}{sep}{netloc.rpartition('@')[2]}{slash}{path}"


def check_fingerprint(name: str, value: str) -> VarProblem | None:
    text = value.replace(" ", "")
    text = text[2:] if text.lower().startswith("0x") else text
    if value and not re.fullmatch(r"[0-9A-Fa-f]{40}|[0-9A-Fa-f]{64}", text):
        return VarProblem(name, f"{name} must be a full OpenPGP key fingerprint (40 hex digits, "
                          f"or 64 for a v6 key) or \"\", got {value!r}",
                          f"write {name}: the fingerprint `gpg --show-keys KEYFILE` prints "
                          "(a short key id is not enough)")
    return None


def pinned_key(url_var: str, pin_var: str) -> Across:
    """The check of a repo key's fingerprint ``pin_var`` against its key URL ``url_var``: a key
    fetched over plain http needs the pin."""
    def across(values: Mapping[str, Any]) -> VarProblem | None:
        url, pin = values.get(url_var), values.get(pin_var)
        if isinstance(url, str) and url.startswith("http://") and pin == "":
            return VarProblem(
                pin_var, f"{url_var} is plain http and {pin_var} is empty: anyone on the path "
                "could hand the nodes their own signing key",
                f"write {pin_var}: the key's fingerprint, or use an https:// key URL",
                others=(url_var,))
        return None

    return across


def check_str_list(name: str, value: list[Any]) -> VarProblem | None:
    for item in value:
        if not isinstance(item, str):
            return VarProblem(name, f"{name} must be a list of strings, got {show(item)} in it",
                              f'write {name}: ["time_sync"]')
    return None


def check_host_list(name: str, value: list[Any]) -> VarProblem | None:
    """Host names or IPv4 addresses (as apt.conf keys take them)."""
    for item in value:
        if not isinstance(item, str) or not APT_CONF_HOST.fullmatch(item):
            return VarProblem(name, f"{name}: {show(item)} is not a host name or IPv4 address "
                              "(apt matches whole host names: no domains, networks or ports)",
                              f'write {name}: ["mirror.lab.example", "10.0.0.5"]')
    return None


def check_sysctls(name: str, value: dict[Any, Any]) -> VarProblem | None:
    for key, val in value.items():
        if not isinstance(key, str) or not re.fullmatch(r"[a-z0-9_][a-z0-9_./-]*", key):
            return VarProblem(name, f"{name}: {show(key)} is not a sysctl name",
                              f'write {name}: {{"net.ipv4.ip_forward": 1}}')
        if isinstance(val, (dict, list)) or val is None:
            return VarProblem(name, f"{name}: {key} must be a number or string, got {show(val)}",
                              f"write {key}: 1", subkey=key)
        if not isinstance(val, bool) and not re.fullmatch(r"[0-9A-Za-z_.:/ -]+", str(val)):
            return VarProblem(name, f"{name}: {key} value {show(val)} holds characters no "
                              "sysctl value needs", f'write {key}: "4096 87380 6291456" (numbers, '
                              "words, spaces, '.', ':', '/', '-')", subkey=key)
    return None


@dataclass(frozen=True)
class Rule:
    """What a role declares about one of its variables, beside its default: the check of its
    value, the values allowed (choices), whether it must be the same on every host of a
    cluster (cluster_wide), and its check against the host's other variables (across)."""

    check: Check | None = None
    choices: tuple[Any, ...] | None = None
    cluster_wide: bool = False
    across: Across | None = None


#: a registry as images name it: a DNS name or address, maybe a port (docker.io, nvcr.io,
#: registry.k8s.io, 10.0.0.5:5000), or containerd's "_default" (every registry without its own)
_REGISTRY = re.compile(r"_default|[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*"
                       r"(:[0-9]{1,5})?")
MIRROR_KEYS = ("url", "ca_file", "insecure")


def check_registry_mirrors(name: str, value: dict[Any, Any]) -> VarProblem | None:
    """{registry: [mirror, ...]}; a mirror is a URL or {url, ca_file, insecure}."""
    example = (f'write {name}: {{docker.io: ["http://10.0.0.5:5000"]}} or, for a registry '
               'with its own CA, {url: "https://reg.lab:5000", ca_file: /etc/ssl/lab-ca.pem}')
    for registry, mirrors in value.items():
        if not isinstance(registry, str) or not _REGISTRY.fullmatch(registry):
            return VarProblem(name, f"{name}: {show(registry)} is not a registry name (a host "
                              "like docker.io, nvcr.io or 10.0.0.5:5000, lower case)", example,
                              subkey=str(registry))
        if not isinstance(mirrors, list) or not mirrors:
            return VarProblem(name, f"{name}: {registry} needs a list of one or more mirrors, got "
                              f"{show(mirrors)}", example, subkey=registry)
        for mirror in mirrors:
            entry = mirror if isinstance(mirror, dict) else {"url": mirror}
            unknown = sorted(str(k) for k in entry if k not in MIRROR_KEYS)
            if unknown:
                return VarProblem(name, f"{name}: a mirror of {registry} has unknown keys "
                                  f"{', '.join(unknown)} (known: {', '.join(MIRROR_KEYS)})",
                                  example, subkey=registry)
            url = entry.get("url")
            if not isinstance(url, str):
                return VarProblem(name, f"{name}: a mirror of {registry} needs a url, got "
                                  f"{show(mirror)}", example, subkey=registry)
            problem = check_url(f"{name}[{registry}]", url, rendered=True)
            if problem:
                return VarProblem(name, problem.message, problem.fix, subkey=registry)
            parts = urllib.parse.urlsplit(url)
            if parts.username or parts.password or parts.query or parts.fragment:
                return VarProblem(name, f"{name}: mirror {masked_url(url)!r} of {registry} may "
                                  "hold only scheme, host, port and path (credentials belong in "
                                  "containerd's auth settings, never in the inventory)",
                                  example, subkey=registry)
            host_problem = registry_host_problem(parts.netloc)
            if host_problem:  # the host names the mirror's CA file on every node
                return VarProblem(name, f"{name}: mirror {url!r} of {registry}: "
                                  f"{host_problem}", example, subkey=registry)
            insecure = entry.get("insecure", False)
            if not isinstance(insecure, bool):
                return VarProblem(name, f"{name}: insecure of mirror {url} must be true or false,"
                                  f" got {show(insecure)}", example, subkey=registry)
            if insecure and not url.startswith("https://"):
                return VarProblem(name, f"{name}: insecure is for https mirrors whose "
                                  f"certificate is not checked; {url} is plain http already",
                                  f"drop insecure from {url}", subkey=registry)
            ca_file = entry.get("ca_file")
            if ca_file is not None:
                problem = _check_ca_file(name, registry, url, ca_file, insecure)
                if problem:
                    return problem
    return None


def _check_ca_file(name: str, registry: str, url: str, ca_file: Any,
                   insecure: bool) -> VarProblem | None:
    import os

    fix = ("give the absolute path of the registry's CA certificate (PEM) on this machine; "
           "gpuk8s copies it to every node")
    if not isinstance(ca_file, str) or not os.path.isabs(os.path.expanduser(ca_file)):
        return VarProblem(name, f"{name}: ca_file of mirror {url} must be an absolute path, got "
                          f"{show(ca_file)}", fix, subkey=registry)
    if insecure:
        return VarProblem(name, f"{name}: mirror {url} has both ca_file and insecure: true",
                          "keep ca_file (the certificate is checked against it) and drop "
                          "insecure", subkey=registry)
    if not url.startswith("https://"):
        return VarProblem(name, f"{name}: ca_file is for https mirrors; {url} is plain http",
                          "drop ca_file, or use the registry's https URL", subkey=registry)
    try:  # the same reading as the copy to the nodes: certificates only, no key
        read_ca_file(ca_file)
    except CaFileProblem as exc:
        return VarProblem(name, f"{name}: mirror {url}: {exc.problem}", exc.fix,
                          subkey=registry)
    return None
