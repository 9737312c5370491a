# LAB STAND-IN: not the real Kubernetes. Test infrastructure for gpuk8s; never shipped to users.
"""Helpers shared by all k8s stand-ins: root prefix, time, durations, quantities, YAML, commands."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import secrets
import string
import subprocess
import sys
from fractions import Fraction
from typing import Any

# Lab-only hook: every absolute path the stand-ins touch goes through ROOT, so unit tests can run
# the programs on the lab host against a temp directory. Nodes leave it unset ("/").
ROOT_ENV = "GPUK8S_LAB_ROOT"
DEFAULT_VERSION = "1.36.2-1.1"


#: lab-only hook for host unit tests: the kubelet starts static pods and pod runners as child
#: processes, not systemd units
NO_SYSTEMD_ENV = "GPUK8S_LAB_NO_SYSTEMD"


def klog(level: str, msg: str, src: str = "kubelet.go:1600") -> None:
    """A klog line on stderr (the kubelet's log, and that of the daemons it emulates)."""
    now = _dt.datetime.now()
    sys.stderr.write(f"{level}{now:%m%d %H:%M:%S.%f} {os.getpid():>7} {src}] {msg}\n")
    sys.stderr.flush()


def root() -> str:
    return os.environ.get(ROOT_ENV) or "/"


def P(path: str) -> str:
    """Map an absolute node path to the (possibly prefixed) host path."""
    r = root()
    if r == "/":
        return path
    return os.path.join(r, path.lstrip("/"))


def package_version(raw: str, env: str = "GPUK8S_LAB_K8S_VERSION") -> str:
    """Debian version of the installed package ("1.36.2-1.1"); @VERSION@ is substituted by the
    lab package builder. Unsubstituted (running from the repo): the env var or a default."""
    if raw and "@" not in raw:
        return raw
    return os.environ.get(env) or DEFAULT_VERSION


def git_version(debver: str) -> str:
    """'1.36.2-1.1' -> 'v1.36.2'."""
    return "v" + debver.split("-")[0].split("~")[0]


def now() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0)


def ts(t: _dt.datetime | None = None) -> str:
    return (t or now()).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_ts(s: str) -> _dt.datetime:
    return _dt.datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=_dt.UTC)


def age(s: str | None) -> str:
    """kubectl's human duration (translateTimestampSince / duration.HumanDuration)."""
    if not s:
        return "<unknown>"
    secs = int((now() - parse_ts(s)).total_seconds())
    return human_duration(max(secs, 0))


def human_duration(secs: int) -> str:
    if secs < 120:
        return f"{secs}s"
    mins = secs // 60
    if mins < 10:
        s = secs % 60
        return f"{mins}m{s}s" if s else f"{mins}m"
    if mins < 180:
        return f"{mins}m"
    hours = secs // 3600
    if hours < 8:
        m = mins % 60
        return f"{hours}h{m}m" if m else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        h = hours % 24
        return f"{days}d{h}h" if h else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    return f"{days // 365}y"


_DUR = re.compile(r"(\d+(?:\.\d+)?)(ns|us|ms|h|m|s)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}


def parse_duration(s: str) -> float:
    """Go time.ParseDuration subset -> seconds. Raises ValueError like Go ('invalid duration')."""
    s = str(s).strip()
    if s == "0":
        return 0.0
    pos, total = 0, 0.0
    for m in _DUR.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise ValueError(f'time: invalid duration "{s}"')
    return total


def format_duration(secs: float) -> str:
    """Go Duration.String() for whole seconds: 900 -> '15m0s', 86400 -> '24h0m0s'."""
    secs = int(secs)
    if secs == 0:
        return "0s"
    h, rem = divmod(secs, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}h{m}m{s}s"
    if m:
        return f"{m}m{s}s"
    return f"{s}s"


_SUFFIX = {
    "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "Pi": 1024**5, "Ei": 1024**6,
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}
_QTY = re.compile(r"^([+-]?[0-9.]+)(?:[eE]([+-]?\d+))?(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


def parse_quantity(q: Any) -> Fraction:
    """resource.Quantity -> exact value in base units ('100m' -> 1/10, '1Gi' -> 1073741824)."""
    m = _QTY.match(str(q).strip())
    if not m:
        raise ValueError(f"quantities must match the regular expression "
                         f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {q}")
    val = Fraction(m.group(1))
    if m.group(2):
        val *= Fraction(10) ** int(m.group(2))
    return val * _SUFFIX[m.group(3) or ""]


def rand_suffix(n: int = 5) -> str:
    """Like k8s utilrand.String: consonants and digits without vowels/ambiguous characters."""
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    return "".join(secrets.choice(alphabet) for _ in range(n))


#: the ServiceAccount admission plugin's token volume (its name prefix) and where every
#: container mounts it (plugin/pkg/admission/serviceaccount/admission.go:
#: ServiceAccountVolumeName, DefaultAPITokenMountPath)
API_ACCESS_PREFIX = "kube-api-access-"
TOKEN_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
#: the annotation that marks a static pod's mirror pod (kubelet types ConfigMirrorAnnotationKey)
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def api_access_volume(pod_uid: str) -> str:
    """The name of a pod's ServiceAccount token volume, ``kube-api-access-<5 characters>``.
    Upstream the admission plugin takes names.SimpleNameGenerator's 5 random characters
    (utilrand.String's alphabet, as rand_suffix); the lab derives them from the pod's uid, so
    that the API server (which adds the volume) and the kubelet's emulated DRA plugin (which
    writes its token there, dra_node.token_dir) name the same folder without asking."""
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    digest = hashlib.sha256(pod_uid.encode()).digest()
    return API_ACCESS_PREFIX + "".join(alphabet[b % len(alphabet)] for b in digest[:5])


def rand_token_part(n: int) -> str:
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(n))


TOKEN_RE = re.compile(r"\A([a-z0-9]{6})\.([a-z0-9]{16})\Z")


def yaml_load_all(text: str) -> list[Any]:
    try:
        import yaml
    except ImportError:  # pragma: no cover - nodes depend on python3-yaml
        docs = [json.loads(text)]
        return docs
    # libyaml's parser where the node has it (Debian's python3-yaml does): the same
    # SafeConstructor, a parse about ten times faster than the pure-Python one
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [d for d in yaml.load_all(text, Loader=loader) if d is not None]


def yaml_dump(obj: Any) -> str:
    import yaml

    return yaml.safe_dump(obj, default_flow_style=False, sort_keys=False)


def run(argv: list[str], timeout: float = 30, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run a node command; a missing binary reads like a failed command (rc 127)."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    except FileNotFoundError as e:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: {e.strerror}\n")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]}: timed out\n")


def read(path: str, default: str | None = None) -> str | None:
    try:
        with open(P(path)) as f:
            return f.read()
    except OSError:
        return default


def write(path: str, data: str | bytes, mode: int = 0o644) -> None:
    real = P(path)
    os.makedirs(os.path.dirname(real), exist_ok=True)
    tmp = real + ".tmp"
    with open(tmp, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, real)


def die(msg: str, code: int = 1) -> None:
    sys.stderr.write(msg if msg.endswith("\n") else msg + "\n")
    sys.exit(code)


def service_selects(selector: dict[str, str], pod: dict[str, Any]) -> bool:
    """A Service's selector picks the pod (an empty selector picks none: no endpoints)."""
    labels = pod["metadata"].get("labels") or {}
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def pod_ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions") or [])
