"""Workloads on a bootstrapped cluster: deploy, undeploy and verify.

``templates/workloads/<name>/*.yaml.j2`` are rendered with Helm-style values (the shared
``templates/workloads/values.yaml``, the workload's ``values.yaml``, then ``--values`` files, then
``--set key.sub=value``; Jinja2 StrictUndefined), every object is labelled
``app.kubernetes.io/managed-by=gpuk8s`` and ``gpuk8s.io/workload=<name>``, and the manifest is
applied with ``kubectl apply --server-side`` on the first control plane, sent in a heredoc inside
the script (never on a command line). Deploy then waits for the workload's own readiness
(Deployments available, Jobs complete, claims bound) and prints one table of its pods; a pod the
scheduler cannot place is reported with the scheduler's FailedScheduling message.

Values never add YAML: templates emit every value with ``| tojson`` (one JSON scalar, which YAML
reads as the same value), control characters are refused in every value and key, and RULES check
the values that name things (namespace, claim, NFS path, clients, options). The manifest is
applied as cluster-admin, so render() also refuses any object whose kind the workload does not
create (KINDS) and any namespaced object outside ``values.namespace``.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import yaml
from rich.table import Table
from rich.text import Text

from gpuk8s.api import Session, open_session
from gpuk8s.errors import Gpuk8sError
from gpuk8s.executor import parallel as in_parallel
from gpuk8s.facts.kube import ADMIN_CONF, parse_nodes
from gpuk8s.inventory import load_inventory
from gpuk8s.ops import q
from gpuk8s.report import Reporter, untrusted
from gpuk8s.roles import project_root
from gpuk8s.sinks import shell
from gpuk8s.transport import CommandResult, ConnectSpec, Redactor, open_transport

WORKLOADS = ("storage", "jupyter", "tensorflow-job", "distributed-tf", "tensorboard", "eval")
LABEL = "gpuk8s.io/workload"
MANAGED = "app.kubernetes.io/managed-by"
KUBECTL = f"kubectl --kubeconfig {ADMIN_CONF} --request-timeout=20s"
#: namespaced kinds a workload may create (undeploy deletes these by label)
NS_KINDS = "deployments,jobs,services,configmaps,secrets,persistentvolumeclaims"
_SET_KEY = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
#: per workload, the (apiVersion, kind) of every object its templates legitimately render; any
#: other object is refused before anything is applied (objects are applied as cluster-admin).
#: Every namespaced kind here is one undeploy deletes (NS_KINDS, plus TFJobs for distributed-tf).
KINDS: dict[str, frozenset[tuple[str, str]]] = {
    "storage": frozenset({("v1", "PersistentVolume"), ("v1", "PersistentVolumeClaim")}),
    # the Secret is the notebook token deploy adds (never a template)
    "jupyter": frozenset({("v1", "ConfigMap"), ("apps/v1", "Deployment"), ("v1", "Service"),
                          ("v1", "Secret")}),
    "tensorflow-job": frozenset({("v1", "ConfigMap"), ("batch/v1", "Job")}),
    "distributed-tf": frozenset({("v1", "ConfigMap"), ("v1", "Service"), ("batch/v1", "Job"),
                                 ("kubeflow.org/v1", "TFJob")}),
    "tensorboard": frozenset({("apps/v1", "Deployment"), ("v1", "Service")}),
    "eval": frozenset({("v1", "ConfigMap"), ("batch/v1", "Job")}),
    "verify": frozenset({("batch/v1", "Job")}),
}
#: kinds in KINDS without a namespace; every other object must be in values.namespace
CLUSTER_SCOPED = frozenset({"PersistentVolume"})
#: control characters, and the characters YAML 1.1 also reads as line breaks (NEL, LS, PS)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
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
_TF_GPU = re.compile(r"PhysicalDevice\(name='/physical_device:GPU:(\d+)'")
_SMI_GPU = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9a-f-]+)\)", re.M)


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
    if len(value) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(value):
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
    """``a.b=value`` -> (["a", "b"], value typed as YAML: 2 -> int, true -> bool)."""
    key, sep, raw = expr.partition("=")
    key = key.strip()
    if not sep or not _SET_KEY.match(key):
        raise WorkloadError(f"--set {expr}: expected key.sub=value, e.g. --set gpus=2 "
                            "or --set service.nodePort=30999")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def check_values(values: Mapping[str, Any], origin: str = "values") -> None:
    """RULES and the text check on merged values (the defaults included)."""
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
        keys, value = parse_set(expr)
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


# -- rendering ----------------------------------------------------------------------------------
def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(workloads_dir())),
                              undefined=jinja2.StrictUndefined, trim_blocks=True,
                              lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)


def _prune(obj: Any) -> Any:
    """Drop keys whose value is null or an empty list (lists emptied by disabled options)."""
    if isinstance(obj, dict):
        return {k: _prune(v) for k, v in obj.items() if v is not None and v != []}
    if isinstance(obj, list):
        return [_prune(v) for v in obj]
    return obj


def pod_templates(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec") or {}
    if "template" in spec:
        return [spec["template"]]
    return [r["template"] for r in (spec.get("tfReplicaSpecs") or {}).values()]


def stamp(doc: dict[str, Any], name: str) -> dict[str, Any]:
    """Label an object and its pod templates as this workload's."""
    labels = {MANAGED: "gpuk8s", LABEL: name}
    doc.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
    for tpl in pod_templates(doc):
        tpl.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
    return doc


def context(name: str, values: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    ctx: dict[str, Any] = {**values, "workload": name}
    ctx["train_script"] = (workloads_dir() / "_train.py.j2").read_text()
    if name == "jupyter":
        ctx["starter_notebook"] = (workloads_dir() / "jupyter" / "gpus.ipynb").read_text()
    if name == "storage":
        own = extra.pop("nfs_server", "CONTROL_PLANE")   # the first control plane's address
        ctx["nfs_server"] = values["nfs"]["server"] or own
    ctx.update(extra)
    return ctx


def render(name: str, values: Mapping[str, Any], **extra: Any) -> list[dict[str, Any]]:
    """The workload's objects, labelled; raises WorkloadError naming the template and value."""
    folder = workloads_dir() / name
    docs: list[dict[str, Any]] = []
    ctx = context(name, values, **extra)
    for path in sorted(folder.glob("*.yaml.j2")):
        rel = f"{name}/{path.name}"
        try:
            text = _env().get_template(rel).render(**ctx)
        except jinja2.UndefinedError as exc:
            raise WorkloadError(f"template {rel}: {exc.message}") from None
        except jinja2.TemplateSyntaxError as exc:
            raise WorkloadError(f"template {rel}:{exc.lineno}: {exc.message}") from None
        try:
            loaded = [d for d in yaml.safe_load_all(text) if d]
        except yaml.YAMLError as exc:
            raise WorkloadError(f"template {rel} rendered invalid YAML with these values: "
                                f"{exc}") from None
        docs += [stamp(_prune(d), name) for d in loaded]
    if not docs:
        raise WorkloadError(f"workload {name} rendered no objects")
    check_objects(name, docs, values["namespace"])
    return docs


def check_objects(name: str, docs: Sequence[Mapping[str, Any]], namespace: str) -> None:
    """Refuse any object workload ``name`` does not legitimately create (KINDS), and any
    namespaced object outside ``namespace``: the manifest is applied with admin.conf."""
    problem = _namespace_problem(namespace)
    if problem:
        raise WorkloadError(f"workload {name}: namespace {namespace!r} is refused: {problem}")
    allowed = KINDS.get(name, frozenset())
    for doc in docs:
        api, kind = doc.get("apiVersion"), doc.get("kind")
        meta: Mapping[str, Any] = doc.get("metadata") or {}
        what = f"{kind}/{meta.get('name')} ({api})"
        if (api, kind) not in allowed:
            kinds = ", ".join(f"{k} ({a})" for a, k in sorted(allowed, key=lambda x: x[1]))
            raise WorkloadError(
                f"workload {name}: refused to apply {what}: {name} only creates "
                f"{kinds or 'nothing'}. A template or a value added this object: check "
                f"templates/workloads/{name}/ and the values you passed")
        if kind in CLUSTER_SCOPED:
            ref = (doc.get("spec") or {}).get("claimRef") or {}
            if ref and ref.get("namespace") != namespace:
                raise WorkloadError(
                    f"workload {name}: refused to apply {what}: it is reserved for a claim in "
                    f"namespace {ref.get('namespace')!r}, not the workload's namespace "
                    f"{namespace!r} (values.namespace)")
        elif meta.get("namespace") != namespace:
            raise WorkloadError(
                f"workload {name}: refused to apply {what}: its namespace is "
                f"{meta.get('namespace')!r}, not the workload's namespace {namespace!r}; every "
                "object of a workload goes in values.namespace (--set namespace=NAME)")


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (scripts, notebooks) as literal blocks, so manifests stay readable."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(docs: Sequence[Mapping[str, Any]]) -> str:
    return yaml.dump_all(list(docs), Dumper=_Dumper, sort_keys=False, width=1000)


# -- talking to the control plane ---------------------------------------------------------------
@dataclass
class Remote:
    """kubectl on the first control plane through the run's transport; every script and its
    output go to the run folder, redacted."""

    session: Session

    @property
    def host(self) -> str:
        return self.session.first_cp

    def run(self, script: str, timeout: float = 120) -> CommandResult:
        log = self.session.runlog.host_logger(self.host)
        log(f"$ {script}")
        result = self.session.transports[self.host].run(script, timeout=timeout)
        log(f"exit {result.exit_code}\n{result.stdout}")
        return result

    def probe(self, commands: Mapping[str, str], timeout: float = 120
              ) -> dict[str, tuple[int, str]]:
        """Several kubectl commands in one round trip: {key: (exit code, output)}."""
        marker = f"##gpuk8s-{secrets.token_hex(4)}"
        parts = [f'k="{KUBECTL}"']
        for key, cmd in commands.items():
            parts.append(f"echo '{marker} {key}'; ( {cmd} ) 2>&1; rc=$?; echo; "
                         f"echo \"{marker}-rc $rc\"")
        out = self.run("\n".join(parts), timeout).stdout
        results: dict[str, tuple[int, str]] = {}
        for chunk in out.split(f"{marker} ")[1:]:
            key, _, rest = chunk.partition("\n")
            body, _, rc = rest.rpartition(f"{marker}-rc ")
            results[key.strip()] = (int(rc.split()[0]) if rc.strip() else 1, body.rstrip("\n"))
        missing = set(commands) - set(results)
        if missing:
            raise WorkloadError(f"{self.host}: kubectl probe lost its output for "
                                f"{', '.join(sorted(missing))}: "
                                + self.session.redact(out.strip()[-300:]))
        return results

    def apply(self, docs: Sequence[Mapping[str, Any]]) -> str:
        text = dump(docs)
        eof = "GPUK8S_EOF_" + secrets.token_hex(4)
        script = (f"{KUBECTL} apply --server-side --force-conflicts --field-manager=gpuk8s "
                  f"-f - <<'{eof}'\n{text}{eof}\n")
        result = self.run(script, timeout=180)
        if not result.ok:
            raise WorkloadError(f"{self.host}: kubectl apply failed (exit {result.exit_code}):\n"
                                + self.session.redact(result.stdout.strip()[-1500:]))
        return result.stdout


def _control_plane(inventory: str | Path) -> str:
    inv = load_inventory(inventory)
    if not inv.control_planes:
        raise WorkloadError("no control plane in the inventory: workloads are deployed "
                            "through the first control plane's kubectl")
    return inv.control_planes[0].name


def open_control_plane(inventory: str | Path, command: str, reporter: Reporter | None,
                       *, all_hosts: bool = False,
                       opener: Callable[[ConnectSpec, Redactor], Any] = open_transport
                       ) -> Session:
    """A session connected to the first control plane only (or every host, for NFS clients)."""
    limit = None if all_hosts else _control_plane(inventory)
    return open_session(inventory, limit=limit, sets=(), command=command, reporter=reporter,
                        opener=opener)


def _json(text: str, what: str) -> dict[str, Any]:
    start = text.find("{")
    try:
        data: dict[str, Any] = json.JSONDecoder().raw_decode(text[start:])[0] if start >= 0 \
            else {}
    except ValueError:
        data = {}
    if not data and text.strip():
        raise WorkloadError(f"cannot read {what} from kubectl: {text.strip()[-300:]}")
    return data


# -- waiting ------------------------------------------------------------------------------------
@dataclass
class PodRow:
    name: str
    node: str
    phase: str
    gpus: int
    detail: str = ""
    host_ip: str = ""
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class WaitResult:
    ready: bool
    pods: list[PodRow]
    problems: list[str]
    objects: dict[str, str]   # "Kind/name" -> its state in words
    services: list[dict[str, Any]] = field(default_factory=list)


def _gpus(pod: Mapping[str, Any]) -> int:
    total = 0
    for c in pod.get("spec", {}).get("containers") or []:
        limits = (c.get("resources") or {}).get("limits") or {}
        total += int(str(limits.get("nvidia.com/gpu", 0)))
    return total


def _cond(obj: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    for c in obj.get("status", {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return None


def snapshot(remote: Remote, namespace: str, selector: str,
             unschedulable_since: dict[str, float], pending_grace: float) -> WaitResult:
    """One look at the workload's objects, pods and Warning events."""
    ns = shell(namespace)
    sel = shell(selector)
    res = remote.probe({
        "objects": f"$k get deployments,jobs,persistentvolumeclaims,services,pods -n {ns} "
                   f"-l {sel} -o json",
        "events": f"$k get events -n {ns} --field-selector type=Warning -o json"})
    rc, out = res["objects"]
    if rc != 0:
        raise WorkloadError(f"{remote.host}: kubectl get failed: {out.strip()[-300:]}")
    items = _json(out, "objects").get("items", [])
    events = _json(res["events"][1], "events").get("items", []) if res["events"][0] == 0 else []
    last_event: dict[str, dict[str, Any]] = {}
    for ev in sorted(events, key=lambda e: e.get("lastTimestamp") or ""):
        inv = ev.get("involvedObject") or {}
        if inv.get("kind") == "Pod":
            last_event[inv.get("name", "")] = ev
    objects: dict[str, str] = {}
    problems: list[str] = []
    pods: list[PodRow] = []
    services: list[dict[str, Any]] = []
    ready = True
    now = time.monotonic()
    for item in items:
        kind, meta = item.get("kind"), item.get("metadata", {})
        name, spec, st = meta.get("name", ""), item.get("spec", {}), item.get("status", {})
        if kind == "Deployment":
            want, have = int(spec.get("replicas", 1)), int(st.get("availableReplicas") or 0)
            objects[f"Deployment/{name}"] = f"{have}/{want} available"
            ready = ready and have >= want
        elif kind == "Job":
            done, failed = _cond(item, "Complete"), _cond(item, "Failed")
            if failed and failed.get("status") == "True":
                objects[f"Job/{name}"] = "failed"
                problems.append(f"Job {name} failed: {failed.get('reason', '')}: "
                                f"{failed.get('message', '')}")
            elif done and done.get("status") == "True":
                objects[f"Job/{name}"] = "complete"
            else:
                objects[f"Job/{name}"] = (f"{st.get('succeeded', 0)}/"
                                          f"{spec.get('completions', 1)} succeeded")
                ready = False
        elif kind == "PersistentVolumeClaim":
            phase = st.get("phase", "Pending")
            objects[f"PersistentVolumeClaim/{name}"] = phase
            ready = ready and phase == "Bound"
        elif kind == "Service":
            services.append(item)
        elif kind == "Pod":
            phase = st.get("phase", "Pending")
            row = PodRow(name, spec.get("nodeName", ""), phase, _gpus(item),
                         host_ip=st.get("hostIP", ""), labels=dict(meta.get("labels") or {}))
            sched = _cond(item, "PodScheduled")
            ev = last_event.get(name)
            if phase == "Pending" and sched and sched.get("status") == "False":
                msg = (ev.get("message") if ev and ev.get("reason") == "FailedScheduling"
                       else sched.get("message", ""))
                row.detail = f"FailedScheduling: {msg}"
                first = unschedulable_since.setdefault(name, now)
                if now - first >= pending_grace:
                    problems.append(f"pod {name} is Pending: the scheduler cannot place it: "
                                    f"{msg}")
            elif phase == "Failed":
                row.detail = f"{st.get('reason', '')}: {st.get('message', '')}".strip(": ")
                owners = {o.get("kind") for o in meta.get("ownerReferences") or []}
                if "Job" not in owners:
                    problems.append(f"pod {name} failed: {row.detail}")
            elif phase == "Pending" and ev:
                row.detail = f"{ev.get('reason')}: {ev.get('message')}"
            pods.append(row)
    if not objects:
        ready = False
        problems.append(f"no objects labelled {selector} in namespace {namespace}")
    return WaitResult(ready and not problems, pods, problems, objects, services)


def wait(remote: Remote, namespace: str, selector: str, timeout: float,
         pending_grace: float) -> WaitResult:
    """Poll until ready, a problem (unschedulable past the grace time, failed Job) or timeout."""
    deadline = time.monotonic() + timeout
    since: dict[str, float] = {}
    while True:
        result = snapshot(remote, namespace, selector, since, pending_grace)
        if result.ready or (result.problems and "no objects" not in result.problems[0]):
            return result
        if time.monotonic() >= deadline:
            waiting = [f"{k}: {v}" for k, v in result.objects.items()]
            result.problems.append(f"not ready after {timeout:.0f}s ({'; '.join(waiting)})")
            return result
        time.sleep(2.0)


def pod_table(reporter: Reporter, title: str, result: WaitResult) -> None:
    table = Table(title=reporter.cell(title), title_justify="left")
    for col in ("pod", "node", "phase", "GPUs", "detail"):
        table.add_column(col)
    for row in sorted(result.pods, key=lambda r: r.name):
        style = {"Running": "green", "Succeeded": "green", "Failed": "red"}.get(row.phase,
                                                                               "yellow")
        table.add_row(reporter.cell(row.name), reporter.cell(row.node or "-"),
                      reporter.cell(row.phase, style), str(row.gpus), reporter.cell(row.detail))
    reporter.console.print(table)
    for key, state in result.objects.items():
        reporter.print(f"  {key}: {state}")


# -- storage (NFS) ------------------------------------------------------------------------------
def export_line(values: Mapping[str, Any], node_addresses: Sequence[str] = ()) -> str:
    """The /etc/exports.d line: nfs.path to nfs.exportClients, or, when that is "" (the
    default), to each cluster node's address, every client with nfs.exportOptions."""
    nfs = values["nfs"]
    for key in ("path", "exportClients", "exportOptions"):
        problem = RULES[f"nfs.{key}"](nfs[key])
        if problem:
            raise WorkloadError(f"nfs.{key} {nfs[key]!r} is refused: {problem}")
    if nfs["path"] == "/":
        raise WorkloadError("nfs.path '/' is refused for gpuk8s' own export (it would share "
                            "the control plane's whole file system); use a folder of its own, "
                            "e.g. --set nfs.path=/srv/gpuk8s")
    clients = re.split(r"[\s,]+", nfs["exportClients"].strip())
    if not nfs["exportClients"].strip():
        clients = list(dict.fromkeys(node_addresses))
        for address in clients:
            if export_clients_problem(address):
                raise WorkloadError(
                    f"the NFS export goes to the cluster nodes' addresses by default, but "
                    f"{address!r} (an inventory address) cannot be an /etc/exports client; "
                    "name the clients yourself, e.g. --set nfs.exportClients=10.88.0.0/24")
        if not clients:
            raise WorkloadError("no node addresses to export the NFS volume to; name the "
                                "clients, e.g. --set nfs.exportClients=10.88.0.0/24")
    return " ".join([nfs["path"], *(f"{c}({nfs['exportOptions']})" for c in clients)])


def _anon_ids(options: str) -> tuple[int, int]:
    found = dict(o.partition("=")[::2] for o in options.split(","))
    return (int(found.get("anonuid") or NFS_ANON_ID), int(found.get("anongid") or NFS_ANON_ID))


def nfs_server_script(values: Mapping[str, Any], node_addresses: Sequence[str] = ()) -> str:
    """Idempotent: nfs-kernel-server installed, the export folder and /etc/exports.d entry
    present, exportfs applied. Exit 3 with a message when the kernel has no NFS server.

    ``node_addresses``: the export's clients when nfs.exportClients is "" (the default)."""
    nfs = values["nfs"]
    line = export_line(values, node_addresses)
    path = q(nfs["path"])
    dirs = " ".join(f"{path}/{d}" for d in ("data", "checkpoints", "logs"))
    # Who writes: the TensorFlow and Jupyter images run as root (uid 0), and with root_squash
    # (the default) nfsd maps a pod's root to anonuid:anongid (65534 = nobody:nogroup unless
    # nfs.exportOptions says otherwise). So the three folders belong to that uid:gid, mode
    # 2770 (setgid: new entries keep the group): the pods' squashed root can write there,
    # other users on the server cannot read or write, and nobody on a client is root on the
    # share. A pod running as another uid needs that gid as a supplemental group. The export's
    # top folder stays root's. (The lab mounts no NFS; its nodes' kernel has no nfsd.)
    uid, gid = _anon_ids(nfs["exportOptions"])
    missing = q(f"{nfs['path']} not in exportfs -v")
    return f"""set -e
if ! grep -qw nfsd /proc/filesystems && ! modprobe nfsd 2>/dev/null; then
  echo "gpuk8s: this host's kernel has no NFS server (nfsd is neither in /proc/filesystems nor \
loadable); name an existing NFS server with --set nfs.server=ADDRESS --set nfs.path=EXPORT"
  exit 3
fi
if ! dpkg-query -W -f '${{Status}}' nfs-kernel-server 2>/dev/null | grep -q 'ok installed'; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nfs-kernel-server
  echo "changed: installed nfs-kernel-server"
fi
mkdir -p {dirs}
for d in {dirs}; do
  if [ "$(stat -c %u:%g:%a "$d")" != "{uid}:{gid}:2770" ]; then
    chown {uid}:{gid} "$d" && chmod 2770 "$d"
    echo "changed: $d owned by {uid}:{gid}, mode 2770"
  fi
done
mkdir -p /etc/exports.d
want={q(line)}
if [ "$(cat /etc/exports.d/gpuk8s.exports 2>/dev/null)" != "$want" ]; then
  printf '%s\\n' "$want" > /etc/exports.d/gpuk8s.exports
  echo "changed: /etc/exports.d/gpuk8s.exports"
fi
systemctl enable --now nfs-server >/dev/null 2>&1 || systemctl enable --now nfs-kernel-server
exportfs -ra
exportfs -v | awk '{{print $1}}' | grep -qxF -- {path} || {{ echo {missing}; exit 4; }}
"""


NFS_CLIENT_SCRIPT = """set -e
if ! dpkg-query -W -f '${Status}' nfs-common 2>/dev/null | grep -q 'ok installed'; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nfs-common
  echo "changed: installed nfs-common"
fi
command -v mount.nfs >/dev/null
"""


def _setup_nfs(session: Session, values: Mapping[str, Any]) -> str:
    """Export from the first control plane, clients everywhere; return the server address."""
    cp = session.first_cp
    rep = session.reporter
    nodes = [session.host(h).address for h in dict.fromkeys([cp, *session.scope])]
    result = Remote(session).run(nfs_server_script(values, nodes), timeout=600)
    if not result.ok:
        raise WorkloadError(f"{cp}: NFS export failed (exit {result.exit_code}):\n"
                            + session.redact(result.stdout.strip()[-800:]))
    changes = [ln for ln in result.stdout.splitlines() if ln.startswith("changed:")]
    rep.print(f"  {cp}: NFS export {values['nfs']['path']} "
              + (", ".join(c[9:] for c in changes) if changes else "already in place"))
    if values["nfs"]["installClients"]:
        hosts = [h for h in session.scope if h in session.transports]

        def one(host: str) -> CommandResult:
            log = session.runlog.host_logger(host)
            res = session.transports[host].run(NFS_CLIENT_SCRIPT, timeout=600)
            log(f"nfs client: exit {res.exit_code}\n{res.stdout}")
            return res

        failed = []
        for host, res in in_parallel(hosts, one).items():
            if not isinstance(res, CommandResult) or not res.ok:
                failed.append(f"{host}: {getattr(res, 'stdout', res)!s}"[-300:])
        if failed:
            raise WorkloadError("NFS client (nfs-common) install failed:\n  "
                                + "\n  ".join(session.redact(f) for f in failed))
        rep.print(f"  nfs-common on {len(hosts)} node(s)")
    return session.host(cp).address


# -- deploy / undeploy --------------------------------------------------------------------------
def _prechecks(remote: Remote, name: str, values: Mapping[str, Any]) -> dict[str, str]:
    """Fail with a clear message on a missing claim, storage class or CRD; return the
    existing notebook token (base64) if any."""
    ns = values["namespace"]
    checks: dict[str, str] = {}
    if name != "storage" and values["storage"]["enabled"]:
        claim = shell(values["storage"]["claimName"])
        checks["pvc"] = (f"$k get persistentvolumeclaim {claim} -n {shell(ns)} "
                         "-o jsonpath='{.status.phase}'")
    if name == "storage" and values["storageClassName"]:
        checks["sc"] = f"$k get storageclass {shell(values['storageClassName'])} -o name"
    if name == "distributed-tf" and values["tfjob"]:
        checks["crd"] = "$k get customresourcedefinition tfjobs.kubeflow.org -o name"
    if name == "jupyter":
        checks["token"] = (f"$k get secret {shell(values['tokenSecret'])} -n "
                           f"{shell(ns)} -o jsonpath='{{.data.token}}'")
    if not checks:
        return {}
    res = remote.probe(checks)
    found: dict[str, str] = {}
    if "pvc" in res:
        rc, out = res["pvc"]
        claim = f"{ns}/{values['storage']['claimName']}"
        if rc != 0 and "NotFound" in out:
            raise WorkloadError(
                f"PersistentVolumeClaim {claim} does not exist: deploy the shared volume first "
                f"(invoke deploy storage), name an existing claim with --set "
                f"storage.claimName=NAME, or run without it (--set storage.enabled=false)")
        if rc != 0:
            raise WorkloadError(f"cannot read PersistentVolumeClaim {claim}: {out.strip()}")
        if out.strip() != "Bound":
            remote.session.reporter.print(
                f"  ! PersistentVolumeClaim {claim} is {out.strip() or 'Pending'}, not Bound: "
                "pods that mount it wait until it is", style="magenta")
    if "sc" in res and res["sc"][0] != 0:
        raise WorkloadError(f"StorageClass {values['storageClassName']!r} does not exist "
                            f"(kubectl get storageclass lists them); leave storageClassName "
                            f"empty for gpuk8s' NFS volume")
    if "crd" in res and res["crd"][0] != 0:
        raise WorkloadError("tfjob: true needs the Kubeflow training operator (CRD "
                            "tfjobs.kubeflow.org is not installed); the default Indexed Job "
                            "form needs no operator")
    if "token" in res and res["token"][0] == 0 and res["token"][1].strip():
        found["token"] = res["token"][1].strip()
    return found


def _notebook_token(remote: Remote, values: Mapping[str, Any], existing: str | None
                    ) -> tuple[str, dict[str, Any] | None]:
    """Reuse the Secret's token, or generate one locally; register it with the redactor."""
    redact = remote.session.redact
    if existing:
        redact.add(existing)
        token = base64.b64decode(existing).decode().strip()
        redact.add(token)
        return token, None
    token = secrets.token_hex(24)
    redact.add(token, base64.b64encode(token.encode()).decode())
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
              "metadata": {"name": values["tokenSecret"], "namespace": values["namespace"]},
              "stringData": {"token": token}}
    return token, secret


def _namespace_doc(namespace: str) -> dict[str, Any]:
    # shared by every workload: labelled managed-by only, so undeploy never removes it
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {MANAGED: "gpuk8s"}}}


def _delete_script(namespace: str, selector: str, kinds: str, wait_s: int) -> str:
    ns, sel = shell(namespace), shell(selector)
    return (f'k="{KUBECTL}"\n'
            f"$k delete {kinds} -n {ns} -l {sel} --ignore-not-found --wait=false\n"
            f"i=0; while [ $i -lt {wait_s} ]; do\n"
            f"  left=$($k get {kinds},pods -n {ns} -l {sel} -o name 2>/dev/null)\n"
            f'  [ -z "$left" ] && exit 0; sleep 1; i=$((i+1)); done\n'
            f'echo "still present after {wait_s}s: $left"; exit 1\n')


def render_manifests(inventory: str | Path, name: str, *, values_files: Sequence[str] = (),
                     sets: Sequence[str] = ()) -> str:
    """The manifests ``deploy`` would apply (after values files and --set), as YAML documents,
    as ``helm template`` shows them. No host is contacted: the inventory is only read, for the
    control plane's address that the storage workload's NFS volume names. Jupyter's token
    Secret is made at deploy time and is not shown."""
    values = load_values(name, values_files, sets)
    extra: dict[str, Any] = {}
    if name == "storage" and not values["nfs"]["server"] and not values["storageClassName"]:
        inv = load_inventory(inventory)
        cp = _control_plane(inventory)
        extra["nfs_server"] = next(h.address for h in inv.control_planes if h.name == cp)
    docs = render(name, values, **extra)
    head = f"# gpuk8s deploy {name} --render: what deploy would apply (no host was contacted)\n"
    if name == "jupyter":
        head += "# (plus Secret jupyter-token, made at deploy time)\n"
    return head + "---\n" + dump([_namespace_doc(values["namespace"]), *docs])


def deploy(inventory: str | Path, name: str, *, values_files: Sequence[str] = (),
           sets: Sequence[str] = (), reporter: Reporter | None = None,
           timeout: float = 600, pending_grace: float = 20,
           show_secret: bool | None = None, render_only: bool = False,
           opener: Callable[[ConnectSpec, Redactor], Any] = open_transport) -> dict[str, Any]:
    """Render, apply and wait for one workload; print its pods; raise WorkloadError when it is
    not ready (unschedulable pods are named with the scheduler's reason). With ``render_only``
    (``--render``) print the manifests deploy would apply and contact no host."""
    if render_only:
        sys.stdout.write(render_manifests(inventory, name, values_files=values_files,
                                          sets=sets))
        sys.stdout.flush()
        return {"workload": name, "rendered": True}
    values = load_values(name, values_files, sets)
    render(name, values)   # fail on a bad value before any host is contacted
    needs_all = name == "storage" and not values["nfs"]["server"] and \
        not values["storageClassName"]
    session = open_control_plane(inventory, f"deploy-{name}", reporter, all_hosts=needs_all,
                                 opener=opener)
    rep, remote = session.reporter, Remote(session)
    ns = values["namespace"]
    started = time.monotonic()
    try:
        rep.phase(f"deploy {name} (namespace {ns}, through {session.first_cp})")
        found = _prechecks(remote, name, values)
        extra: dict[str, Any] = {}
        if needs_all:
            extra["nfs_server"] = _setup_nfs(session, values)
        elif name == "storage" and not values["storageClassName"]:
            rep.print(f"  using the existing NFS export {values['nfs']['server']}:"
                      f"{values['nfs']['path']}")
        docs = render(name, values, **extra)
        token = None
        if name == "jupyter":
            token, secret = _notebook_token(remote, values, found.get("token"))
            if secret:
                docs.append(stamp(secret, name))
        check_objects(name, docs, ns)
        selector = f"{LABEL}={name}"
        if any(d["kind"] in ("Job", "TFJob") for d in docs):
            # a Job's pod template is immutable: running it again means a new Job
            res = remote.run(_delete_script(ns, selector, "jobs", 120), timeout=180)
            if not res.ok:
                raise WorkloadError(f"cannot remove the previous {name} Job: "
                                    + session.redact(res.stdout.strip()[-300:]))
        out = remote.apply([_namespace_doc(ns), *docs])
        for line in out.splitlines():
            rep.print(f"  {line}", style="dim")
        result = wait(remote, ns, selector, timeout, pending_grace)
        pod_table(rep, f"{name}: pods", result)
        summary: dict[str, Any] = {
            "workload": name, "ready": result.ready, "problems": result.problems,
            "objects": result.objects,
            "pods": [{"name": p.name, "node": p.node, "phase": p.phase, "gpus": p.gpus,
                      "detail": p.detail} for p in result.pods],
            "run_dir": str(session.runlog.path)}
        session.runlog.write_report(**{k: v for k, v in summary.items() if k != "run_dir"},
                                    wall_time=round(time.monotonic() - started, 3))
        if not result.ready:
            raise WorkloadError(f"{name} is not ready:\n  " + "\n  ".join(
                session.redact(p) for p in result.problems))
        for svc in result.services:
            _print_service(session, svc, result, token, show_secret)
        rep.print(f"{name} ready ({time.monotonic() - started:.1f}s); run folder: "
                  f"{session.runlog.path}", style="green")
        return summary
    except Gpuk8sError as exc:
        session.runlog.write_report(workload=name, error=session.redact(str(exc)))
        raise
    finally:
        for t in session.transports.values():
            t.close()


def _print_service(session: Session, svc: Mapping[str, Any], result: WaitResult,
                   token: str | None, show_secret: bool | None) -> None:
    spec = svc.get("spec", {})
    name = svc.get("metadata", {}).get("name", "")
    ports = spec.get("ports") or []
    if spec.get("type") != "NodePort" or not ports or not ports[0].get("nodePort"):
        session.reporter.print(f"  service {name}: {spec.get('clusterIP', '')}:"
                               f"{ports[0].get('port') if ports else ''} (inside the cluster)")
        return
    ip = next((p.host_ip for p in result.pods if p.host_ip), "") or \
        session.host(session.first_cp).address
    url = f"http://{ip}:{ports[0]['nodePort']}/"
    if token is None:
        session.reporter.print(f"  {name}: {url}")
        return
    console = session.reporter.console
    if show_secret is None:
        show_secret = console.is_terminal
    if show_secret:
        # the one deliberate appearance of the token: on the terminal only, never in the run
        # folder (its logs and report.json go through the redactor)
        console.print(untrusted(f"  {name}: {url}?token={token}"), markup=False,
                      highlight=False)
        console.print("  (the token is shown this once; it is kept in the Secret "
                      f"{svc['metadata'].get('namespace')}/jupyter-token)", style="dim",
                      markup=False)
    else:
        ns = svc["metadata"].get("namespace")
        session.reporter.print(
            f"  {name}: {url}?token=<redacted> (output is not a terminal; read the token with "
            f"kubectl -n {ns} get secret jupyter-token -o jsonpath='{{.data.token}}' | "
            "base64 -d)")


def undeploy(inventory: str | Path, name: str, *, values_files: Sequence[str] = (),
             sets: Sequence[str] = (), reporter: Reporter | None = None, timeout: int = 180,
             opener: Callable[[ConnectSpec, Redactor], Any] = open_transport
             ) -> dict[str, Any]:
    """Delete every object labelled gpuk8s.io/workload=<name> (the NFS export stays)."""
    values = load_values(name, values_files, sets)
    session = open_control_plane(inventory, f"undeploy-{name}", reporter, opener=opener)
    rep, remote = session.reporter, Remote(session)
    ns, selector = values["namespace"], f"{LABEL}={name}"
    try:
        rep.phase(f"undeploy {name} (namespace {ns})")
        kinds = NS_KINDS
        if name == "distributed-tf":
            has_crd = remote.probe({"crd": "$k get customresourcedefinition "
                                           "tfjobs.kubeflow.org -o name"})["crd"][0] == 0
            kinds += ",tfjobs.kubeflow.org" if has_crd else ""
        res = remote.run(_delete_script(ns, selector, kinds, timeout), timeout=timeout + 60)
        if name == "storage" and res.ok:
            res = remote.run(f"{KUBECTL} delete persistentvolumes -l {shell(selector)} "
                             "--ignore-not-found", timeout=120)
        for line in res.stdout.splitlines():
            rep.print(f"  {line}", style="dim")
        if not res.ok:
            raise WorkloadError(f"undeploy {name} failed: "
                                + session.redact(res.stdout.strip()[-500:]))
        left = remote.probe({"left": f"$k get {kinds},pods -n {shell(ns)} -l "
                                     f"{shell(selector)} -o name"})["left"][1].strip()
        if left:
            raise WorkloadError(f"undeploy {name}: still present: {left}")
        deleted = sum(1 for ln in res.stdout.splitlines() if ln.rstrip().endswith("deleted")
                      or " deleted " in ln)
        rep.print(f"{name} removed ({deleted} object(s) deleted)", style="green")
        session.runlog.write_report(workload=name, deleted=deleted)
        return {"workload": name, "deleted": deleted, "run_dir": str(session.runlog.path)}
    finally:
        for t in session.transports.values():
            t.close()


# -- verify -------------------------------------------------------------------------------------
@dataclass
class NodeCheck:
    node: str
    expected: int
    allocatable: int | None
    smi: list[str] = field(default_factory=list)
    tf: int | None = None
    problem: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem and len(self.smi) == self.expected == self.tf \
            and self.allocatable == self.expected


def gpu_nodes(nodes_json: Mapping[str, Any]) -> list[dict[str, Any]]:
    """GPU nodes (labelled by gpuk8s from the PCI bus, or advertising nvidia.com/gpu)."""
    out = []
    for name, node in sorted(parse_nodes(dict(nodes_json)).items()):
        count = node.labels.get("nvidia.com/gpu.count")
        present = node.labels.get("nvidia.com/gpu.present") == "true"
        if not present and not node.gpu_allocatable:
            continue
        expected = int(count) if count and count.isdigit() else (node.gpu_allocatable or 0)
        out.append({"name": name, "gpus": expected, "allocatable": node.gpu_allocatable})
    return out


def verify(inventory: str | Path, *, reporter: Reporter | None = None,
           values_files: Sequence[str] = (), sets: Sequence[str] = (),
           pending_grace: float = 20,
           opener: Callable[[ConnectSpec, Redactor], Any] = open_transport
           ) -> dict[str, Any]:
    """Per GPU node: nvidia-smi -L in the CUDA base image, then TensorFlow's GPU list; both must
    show as many GPUs as the node has on its PCI bus. One table; WorkloadError on a mismatch."""
    values = load_values("verify", values_files, sets)
    session = open_control_plane(inventory, "verify", reporter, opener=opener)
    rep, remote = session.reporter, Remote(session)
    ns = values["namespace"]
    started = time.monotonic()
    try:
        rep.phase(f"verify GPU nodes (namespace {ns}, through {session.first_cp})")
        rc, out = remote.probe({"nodes": "$k get nodes -o json"})["nodes"]
        if rc != 0:
            raise WorkloadError(f"cannot list nodes: {out.strip()[-300:]}")
        nodes = gpu_nodes(_json(out, "nodes"))
        if not nodes:
            raise WorkloadError("no GPU nodes in the cluster (no node is labelled "
                                "nvidia.com/gpu.present=true or offers nvidia.com/gpu)")
        checks = {n["name"]: NodeCheck(n["name"], n["gpus"], n["allocatable"]) for n in nodes}
        selector = f"{LABEL}=verify"
        res = remote.run(_delete_script(ns, selector, "jobs", 120), timeout=180)
        if not res.ok:
            raise WorkloadError("cannot remove the previous verify Jobs: " + res.stdout[-300:])
        for stage in ("smi", "tf"):
            todo = [n for n in nodes if n["gpus"] > 0 and not checks[n["name"]].problem]
            if not todo:
                break
            docs = render("verify", values, gpu_nodes=todo, stage=stage)
            remote.apply([_namespace_doc(ns), *docs])
            result = wait(remote, ns, f"{selector},gpuk8s.io/verify-stage={stage}",
                          float(values["timeout"]), pending_grace)
            pods = {p.labels.get("gpuk8s.io/verify-node", ""): p for p in result.pods}
            logs = remote.probe({p.name: f"$k logs {shell(p.name)} -n {shell(ns)}"
                                 for p in result.pods if p.phase in ("Succeeded", "Failed")})
            for n in todo:
                check, pod = checks[n["name"]], pods.get(n["name"])
                what = "nvidia-smi" if stage == "smi" else "TensorFlow"
                if pod is None:
                    check.problem = f"{what}: no pod ({'; '.join(result.problems)})"
                    continue
                if pod.node and pod.node != n["name"]:
                    check.problem = f"{what} pod ran on {pod.node}"
                text = logs.get(pod.name, (1, ""))[1]
                if pod.phase != "Succeeded":
                    check.problem = f"{what}: pod {pod.phase}: " + (
                        pod.detail or text.strip().splitlines()[-1:][0] if text.strip() or
                        pod.detail else pod.phase)
                elif stage == "smi":
                    check.smi = [f"{m.group(2)}" for m in _SMI_GPU.finditer(text)]
                else:
                    check.tf = len(set(_TF_GPU.findall(text)))
        for n in nodes:
            if n["gpus"] == 0:
                checks[n["name"]].problem = "labelled as a GPU node but its GPU count is 0"
        table = Table(title="verify: GPUs per node", title_justify="left")
        for col in ("node", "PCI GPUs", "allocatable", "nvidia-smi", "TensorFlow", "result"):
            table.add_column(col)
        for c in checks.values():
            models = sorted(set(c.smi))
            table.add_row(rep.cell(c.node), str(c.expected),
                          "-" if c.allocatable is None else str(c.allocatable),
                          rep.cell(f"{len(c.smi)}" + (f" ({', '.join(models)})" if models
                                                      else "")),
                          "-" if c.tf is None else str(c.tf),
                          Text("ok", style="green") if c.ok else
                          Text.assemble(("FAIL", "red"), " ",
                                        rep.cell(c.problem or "counts differ")))
        rep.console.print(table)
        summary = {"nodes": {c.node: {"expected": c.expected, "allocatable": c.allocatable,
                                      "nvidia_smi": len(c.smi), "models": c.smi,
                                      "tensorflow": c.tf, "ok": c.ok,
                                      "problem": c.problem} for c in checks.values()},
                   "run_dir": str(session.runlog.path)}
        session.runlog.write_report(verify=summary["nodes"],
                                    wall_time=round(time.monotonic() - started, 3))
        bad = [c.node for c in checks.values() if not c.ok]
        if bad:
            raise WorkloadError(f"verify failed on {', '.join(bad)}")
        rep.print(f"verify: {len(checks)} GPU node(s) ok ({time.monotonic() - started:.1f}s)",
                  style="green")
        return summary
    finally:
        for t in session.transports.values():
            t.close()
