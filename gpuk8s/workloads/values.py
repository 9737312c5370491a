"""Workload values: Helm-style defaults, --values files and --set, typed against the
defaults, with the text and naming rules every value must pass."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpuk8s.errors import Gpuk8sError
from gpuk8s.paths import project_root
from gpuk8s.sinks import DNS1123_SUBDOMAIN
from gpuk8s.variables import parse_set_value

WORKLOADS = ("storage", "jupyter", "jupyterhub", "tensorflow-job", "distributed-tf", "tensorboard",
             "eval")


_SET_KEY = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


#: control characters, and the characters YAML 1.1 also reads as line breaks (NEL, LS, PS)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
#: an NFS export path: absolute, made of plain path characters only (no whitespace, quotes,
#: $, `, ;, |, &, parentheses, globs...), so it means the same in a shell, in /etc/exports and
#: in exportfs -v ("/" only for an existing server's NFSv4 root; gpuk8s never exports it)
_NFS_PATH = re.compile(r"/|(/[A-Za-z0-9._+-]+)+")


#: one /etc/exports client: *, an IPv4 address (/prefix or /netmask), an IPv6 address
#: (/prefix), an @netgroup, or a host name with * and ? wildcards
_EXPORT_CLIENT = re.compile(
    r"\*"
    r"|[0-9]{1,3}(\.[0-9]{1,3}){3}(/[0-9]{1,2}|/[0-9]{1,3}(\.[0-9]{1,3}){3})?"
    r"|[0-9A-Fa-f]{0,4}(:[0-9A-Fa-f]{0,4}){2,7}(/[0-9]{1,3})?"
    r"|@[A-Za-z0-9_][A-Za-z0-9_.-]*"
    r"|[A-Za-z0-9*?]([A-Za-z0-9*?.-]*[A-Za-z0-9*?])?")


#: one export option: a word, optionally =value (anonuid=1000, sec=krb5p:sys, fsid=1)
_EXPORT_OPTION = re.compile(r"[a-z][a-z_]*(=[A-Za-z0-9_.:/@+-]+)?")


#: the uid/gid nfsd maps squashed requests to when the options do not say (nobody/nogroup)
NFS_ANON_ID = 65534


class WorkloadError(Gpuk8sError):
    """A workload cannot be rendered, deployed, or did not become ready."""


def workloads_dir() -> Path:
    return project_root() / "templates" / "workloads"


# -- values -------------------------------------------------------------------------------------
def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise WorkloadError(f"cannot read values file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise WorkloadError(f"values file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise WorkloadError(f"values file {path} must be a mapping, not {type(data).__name__}")
    return data


def defaults(name: str) -> dict[str, Any]:
    """Shared defaults merged with the workload's own values.yaml."""
    folder = workloads_dir() / name
    if name != "verify" and (name not in WORKLOADS or not folder.is_dir()):
        raise WorkloadError(f"unknown workload {name!r}; workloads: {', '.join(WORKLOADS)}")
    values = _read_yaml(workloads_dir() / "values.yaml")
    for key, value in _read_yaml(folder / "values.yaml").items():
        values[key] = value
    return values


def _typed(path: str, default: Any, value: Any, origin: str) -> Any:
    """Check an override against the default's type (YAML-typed, as Helm's --set), then its
    text: no control characters anywhere, and the checks of RULES for the keys it has."""
    def bad(what: str) -> WorkloadError:
        return WorkloadError(f"{origin}: {path} expects {what}, got {value!r}")

    if default is None or (value is None and isinstance(default, int)):
        pass
    elif isinstance(default, bool):
        if not isinstance(value, bool):
            raise bad("true or false")
    elif isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer")
    elif isinstance(default, str):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str):
            raise bad("a string")
    elif isinstance(default, list):
        if not isinstance(value, list):
            raise bad("a list")
    elif isinstance(default, dict) and not isinstance(value, dict):
        raise bad("a mapping")
    _check_text(path, value, origin)
    rule = RULES.get(path)
    if rule is not None and isinstance(value, str):
        problem = rule(value)
        if problem:
            raise WorkloadError(f"{origin}: {path} {value!r} is refused: {problem}")
    return value


def _check_text(path: str, value: Any, origin: str) -> None:
    """Refuse a control character or line break in any string of ``value`` (keys included):
    in a manifest it could end the YAML document and start new objects."""
    if isinstance(value, dict):
        for k, v in value.items():
            _check_text(f"{path}.{k}", k, origin)
            _check_text(f"{path}.{k}", v, origin)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_text(f"{path}[{i}]", v, origin)
    elif isinstance(value, str):
        m = _CONTROL.search(value)
        if m:
            raise WorkloadError(
                f"{origin}: {path} holds a newline or control character ({m.group()!r} at "
                f"position {m.start()}) in {_shown(value)}; workload values must be single-line "
                "text without control characters: remove it (put a multi-line script in "
                "your image, or run it with command=[sh, -c, 'a; b'])")


def _shown(value: str, limit: int = 80) -> str:
    """``value`` escaped (repr), cut to about ``limit`` characters."""
    return repr(value) if len(value) <= limit else repr(value[:limit]) + f"... ({len(value)} " \
        "characters)"


def _namespace_problem(value: str) -> str | None:
    if not _DNS1123_LABEL.fullmatch(value):
        return ("a namespace must be a DNS-1123 label: at most 63 lower-case letters, digits "
                "and '-', starting and ending with a letter or digit (e.g. ml or team-a)")
    if value.startswith("kube-"):
        return ("kube-* namespaces belong to Kubernetes itself; use a namespace of your own, "
                "e.g. --set namespace=ml")
    return None


def _object_name_problem(value: str) -> str | None:
    if len(value) > 253 or not DNS1123_SUBDOMAIN.fullmatch(value):
        return ("a Kubernetes object name must be a DNS-1123 subdomain: lower-case letters, "
                "digits, '-' and '.', starting and ending with a letter or digit "
                "(e.g. gpuk8s-shared)")
    return None


def _nfs_path_problem(value: str) -> str | None:
    parts = value.split("/")[1:]
    if not _NFS_PATH.fullmatch(value) or any(p in (".", "..") for p in parts):
        return ("an NFS export path must be an absolute path of letters, digits and . _ + - "
                "(no whitespace, quotes, shell characters, '.' or '..' parts, trailing "
                "'/'), e.g. /srv/gpuk8s")
    return None


def _nfs_server_problem(value: str) -> str | None:
    if value and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.:-]*", value):
        return 'nfs.server must be "" (export from the first control plane) or a host name ' \
            "or IP address, e.g. 10.0.0.5 or nas.lab.example"
    return None


def export_clients_problem(value: str) -> str | None:
    """Why ``value`` (space- or comma-separated) is not a list of /etc/exports clients."""
    for client in re.split(r"[\s,]+", value.strip()) if value.strip() else []:
        if not _EXPORT_CLIENT.fullmatch(client):
            return (f"{client!r} is not an NFS client: give host names (* and ? wildcards "
                    "allowed), IP addresses, CIDRs like 10.88.0.0/24 or @netgroups, "
                    'separated by spaces or commas; "" = the cluster nodes\' addresses')
    return None


def _export_options_problem(value: str) -> str | None:
    options = value.split(",")
    if not all(_EXPORT_OPTION.fullmatch(o) for o in options):
        return ("export options must be comma-separated words, each optionally =value, "
                "e.g. rw,sync,no_subtree_check,root_squash")
    for o in options:
        key, _, arg = o.partition("=")
        if key in ("anonuid", "anongid") and not arg.isdigit():
            return f"{key} must be a number, e.g. {key}={NFS_ANON_ID}"
    return None


#: value checks by key, beyond the type: run on every --set / --values override (naming its
#: origin) and on the merged values
RULES: dict[str, Callable[[str], str | None]] = {
    "namespace": _namespace_problem,
    "storage.claimName": _object_name_problem,
    "tokenSecret": _object_name_problem,
    "storageClassName": lambda v: _object_name_problem(v) if v else None,
    "nfs.server": _nfs_server_problem,
    "nfs.path": _nfs_path_problem,
    "nfs.exportClients": export_clients_problem,
    "nfs.exportOptions": _export_options_problem,
    "homes.nfs.server": _nfs_server_problem,
    "homes.nfs.path": _nfs_path_problem,
    "homes.storageClassName": lambda v: _object_name_problem(v) if v else None,
    "homes.accessMode": lambda v: None if v in ("ReadWriteOnce", "ReadWriteMany") else
    "use ReadWriteOnce or ReadWriteMany",
    "https.secret": lambda v: _object_name_problem(v) if v else None,
    "gpuAllocation": lambda v: None if v in ("device-plugin", "dra") else
    "use device-plugin or dra (the cluster's gpu_allocation)",
}


def _assign(tree: dict[str, Any], base: Mapping[str, Any] | None, keys: Sequence[str],
            value: Any, origin: str, prefix: Sequence[str] = ()) -> None:
    """Set tree[k1][k2]... = value; keys must exist in the defaults unless the mapping they go
    under is empty in the defaults (free-form, like nodeSelector). ``prefix``: the keys of
    ``tree`` itself (error messages and RULES use the full path)."""
    node, ref = tree, base
    for i, key in enumerate(keys):
        path = ".".join([*prefix, *keys[: i + 1]])
        _check_text(path, key, origin)
        known = ref is None or not ref or key in ref
        if not known:
            assert ref is not None
            raise WorkloadError(f"{origin}: unknown value {path!r}; known here: "
                                f"{', '.join(sorted(ref))}")
        default = ref.get(key) if ref else None
        if i == len(keys) - 1:
            if isinstance(value, dict) and isinstance(node.get(key), dict):
                sub = default if isinstance(default, dict) else None
                for k, v in value.items():
                    _assign(node[key], sub, [str(k)], v, origin, path.split("."))
                return
            node[key] = _typed(path, default if ref else None, value, origin)
            return
        if key not in node:
            node[key] = {}
        if not isinstance(node[key], dict):
            raise WorkloadError(f"{origin}: {path} is {node[key]!r} "
                                f"({type(node[key]).__name__}), not a mapping: cannot set "
                                f"{'.'.join([*prefix, *keys])}")
        node = node[key]
        ref = default if isinstance(default, dict) else None


def parse_set(expr: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], the value's text); load_values types it against the
    default, by the rule inventories use too (variables.parse_set_value)."""
    key, sep, raw = expr.partition("=")
    key = key.strip()
    if not sep or not _SET_KEY.match(key):
        raise WorkloadError(f"--set {expr}: expected key.sub=value, e.g. --set gpus=2 "
                            "or --set service.nodePort=30999")
    return key.split("."), raw


def _extra_env_problem(env: Any) -> str | None:
    """extraEnv may not set the NVIDIA container toolkit's variables: NVIDIA_VISIBLE_DEVICES
    (=all) would ask for every GPU of the node whatever the scheduler allocated, and the
    other NVIDIA_* ones steer what the toolkit injects (capabilities, MIG devices, checks)."""
    if not isinstance(env, Mapping):
        return None
    bad = sorted(str(k) for k in env if str(k).upper().startswith("NVIDIA_"))
    if not bad:
        return None
    return (f"extraEnv {', '.join(bad)} is refused: NVIDIA_* variables steer the NVIDIA "
            "container toolkit (NVIDIA_VISIBLE_DEVICES=all would ask for every GPU of the "
            "node, not the ones the scheduler gave the pod); request GPUs with --set gpus=N")


def check_values(values: Mapping[str, Any], origin: str = "values") -> None:
    """RULES and the text check on merged values (the defaults included)."""
    problem = _extra_env_problem(values.get("extraEnv"))
    if problem:
        raise WorkloadError(f"{origin}: {problem}")
    for path, rule in RULES.items():
        node: Any = values
        for key in path.split("."):
            node = node.get(key) if isinstance(node, Mapping) else None
        if isinstance(node, str):
            problem = rule(node)
            if problem:
                raise WorkloadError(f"{origin}: {path} {node!r} is refused: {problem}")
    for key, value in values.items():
        _check_text(str(key), value, origin)


def load_values(name: str, values_files: Iterable[str | Path] = (),
                sets: Iterable[str] = ()) -> dict[str, Any]:
    """Defaults, then each --values file, then each --set, checked against the defaults."""
    base = defaults(name)
    values = json.loads(json.dumps(base))
    for path in values_files:
        data = _read_yaml(Path(path))
        for key, value in data.items():
            _assign(values, base, [str(key)], value, f"values file {path}")
    for expr in sets:
        keys, raw = parse_set(expr)
        default: Any = base
        for key in keys:
            default = default.get(key) if isinstance(default, Mapping) else None
        value = parse_set_value(raw, as_string=isinstance(default, str)) if raw.strip() else ""
        # a control character is refused below; the message shows the value once, escaped
        origin = f"--set {'.'.join(keys)}=..." if _CONTROL.search(expr) else f"--set {expr}"
        _assign(values, base, keys, value, origin)
    check_values(values, f"workload {name} values")
    if name == "distributed-tf" and values.get("ps"):
        raise WorkloadError(
            f"distributed-tf: ps={values['ps']} is refused: parameter-server training "
            "(ParameterServerStrategy) needs a ClusterCoordinator loop that Keras 3, the Keras "
            "of TensorFlow 2.16 and later (the images run 2.21), no longer drives from "
            "model.fit; gpuk8s trains synchronously with MultiWorkerMirroredStrategy instead. "
            "Use --set workers=N (each worker gets gpusPerWorker GPUs), or run your own "
            "image and script with --set image=... --set command=[...]")
    return values
