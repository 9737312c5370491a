"""Variable specs (from the defaults files), value checks, precedence merge and Jinja rendering."""

from __future__ import annotations

import builtins
import difflib
import functools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import yaml

from gpuk8s import paths
from gpuk8s.checks import (
    Rule,
    VarProblem,
    check_count,
    check_host_list,
    check_positive,
    check_url,
    has_jinja,
    show,
)
from gpuk8s.errors import InventoryError
from gpuk8s.templating import ENV, is_rendered

CLUSTER_DEFAULTS = "gpuk8s/defaults.yaml"


def check_workload_names(name: str, value: list[Any]) -> VarProblem | None:
    """Names of gpuk8s workloads (which ones exist is checked where they are used)."""
    for item in value:
        if not isinstance(item, str) or not re.fullmatch(r"[a-z][a-z0-9-]{0,62}", item):
            return VarProblem(name, f"{name}: {show(item)} is not a workload name",
                              f'write {name}: ["tensorflow-job"] (the names `invoke deploy` '
                              "takes)")
    return None


# Variables whose value is one of a few words. nvidia_fabricmanager also takes a YAML bool.
#: the cluster-level variables' rules (gpuk8s/defaults.yaml); each role declares its own
#: variables' rules in its RULES (roles/<role>/role.py)
CLUSTER_RULES: dict[str, Rule] = {
    "apt_proxy": Rule(functools.partial(check_url, allow_empty=True)),
    "apt_https_proxy": Rule(lambda name, value: None if value == "DIRECT" else
                            check_url(name, value, allow_empty=True)),
    "apt_proxy_direct": Rule(check_host_list),
    "backup_keep": Rule(check_count, cluster_wide=True),
    "lock_workloads": Rule(check_workload_names, cluster_wide=True),
}


@functools.cache
def rules() -> dict[str, Rule]:
    """Every variable's rule: the cluster's and each role's (its check, choices and scope)."""
    from gpuk8s.playbook import ALL_ROLES
    from gpuk8s.roles import load_role

    out = dict(CLUSTER_RULES)
    for role in dict.fromkeys(ALL_ROLES):
        out.update(load_role(role).rules())
    return out


def cluster_wide() -> tuple[str, ...]:
    """Variables that must be the same on every host of one cluster."""
    return tuple(name for name, rule in rules().items() if rule.cluster_wide)


_KINDS: dict[type, str] = {bool: "bool", int: "int", str: "str", list: "list", dict: "dict"}
_WORDS: dict[type, str] = {bool: "boolean", int: "whole number", str: "string", list: "list",
                           dict: "mapping", float: "number", type(None): "null"}
# Host variables of other tools' inventories, with what to do instead.
@dataclass(frozen=True)
class VarSpec:
    """One public variable: its default, type (from the default), help text and owner."""

    name: str
    default: Any
    type: builtins.type
    help: str
    role: str  # "cluster" or the role name
    source: str  # "roles/kubernetes/defaults.yaml"
    line: int
    choices: tuple[Any, ...] | None = None

    @property
    def type_name(self) -> str:
        return _KINDS[self.type]


# --------------------------------------------------------------------------- specs


def load_variable_specs(project_root: Path | None = None) -> dict[str, VarSpec]:
    """Read gpuk8s/defaults.yaml and roles/*/defaults.yaml (sorted) into specs, by name, from
    ``project_root``, by default the one the roles come from (gpuk8s.paths.project_root).

    Raises InventoryError when a defaults file is broken or two files define one variable,
    ProjectRootError when $GPUK8S_HOME is no gpuk8s checkout.
    """
    root = (project_root or paths.project_root()).resolve()
    return dict(_load_specs_cached(root))


@functools.lru_cache(maxsize=8)
def _load_specs_cached(root: Path) -> dict[str, VarSpec]:
    files = [(root / CLUSTER_DEFAULTS, "cluster")]
    files += [(p, p.parent.name) for p in sorted((root / "roles").glob("*/defaults.yaml"))]
    specs: dict[str, VarSpec] = {}
    for path, role in files:
        if not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        for spec in _read_defaults(path, rel, role):
            if spec.name in specs:
                other = specs[spec.name]
                raise InventoryError(
                    f"variable {spec.name!r} is defined twice (also in "
                    f"{other.source}:{other.line})",
                    path=rel, line=spec.line, fix="keep it in one defaults.yaml only")
            specs[spec.name] = spec
    return specs


def _choices(name: str) -> tuple[Any, ...] | None:
    rule = rules().get(name)
    return rule.choices if rule else None


def _read_defaults(path: Path, rel: str, role: str) -> list[VarSpec]:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InventoryError(f"not valid YAML: {exc}", path=rel,
                             line=mark.line + 1 if mark else None,
                             fix="fix the YAML syntax") from None
    if node is None:
        return []
    if not isinstance(node, yaml.MappingNode) or not isinstance(data, dict):
        raise InventoryError("a defaults file must be a mapping of variable: default", path=rel,
                             line=1, fix="write one `name: value` per variable")
    out = []
    for key_node, _ in node.value:
        name = key_node.value
        line = key_node.start_mark.line + 1
        default = data[name]
        kind = type(default)
        if kind not in _KINDS:
            raise InventoryError(
                f"default of {name!r} must be a bool, int, string, list or mapping",
                path=rel, line=line, fix=f'give {name} a typed default, e.g. {name}: ""')
        help_lines: list[str] = []
        i = line - 2
        while i >= 0 and lines[i].lstrip().startswith("#"):
            help_lines.insert(0, lines[i].lstrip()[1:].strip())
            i -= 1
        out.append(VarSpec(name=name, default=default, type=kind, help=" ".join(help_lines),
                           role=role, source=rel, line=line, choices=_choices(name)))
    return out


def suggest(name: str, known: Iterable[str]) -> str | None:
    """The closest known name to ``name`` (difflib), or None: for values and host patterns;
    variable names use gpuk8s.inventory.names.near_miss, which is much tighter."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return close[0] if close else None


# --------------------------------------------------------------------------- value checks


def coerce_value(spec: VarSpec, value: Any,
                 raw: str | None = None) -> tuple[Any, VarProblem | None]:
    """Check ``value`` against the spec's type; return (normalised value, problem or None).

    An int given to a string variable becomes its decimal text (580 -> "580"); a float never
    does, since YAML reads an unquoted 1.30 as 1.3. ``raw`` is the scalar as written, if known.
    """
    name = spec.name
    if spec.name == "nvidia_fabricmanager" and isinstance(value, bool):
        return value, None
    if value is None:
        example = {bool: "true", int: "1", str: '""', list: "[]", dict: "{}"}[spec.type]
        return value, VarProblem(name, f"{name} has no value (null)",
                                 f"give it a value, e.g. {name}: {example}")
    if spec.type is str:
        if isinstance(value, str):
            return value, None
        if isinstance(value, int) and not isinstance(value, bool):
            text = raw.strip() if raw is not None else ""
            return (text if text.isdigit() else str(value)), None
        if isinstance(value, float):
            written = raw.strip() if raw is not None else repr(value)
            msg = (f"{name} must be a quoted string: YAML reads the unquoted {written} as the "
                   f"number {value!r}")
            if written != repr(value):
                msg += f" (an unquoted {written} loses digits)"
            elif raw is None:
                msg += " (an unquoted 1.30 becomes 1.3)"
            return value, VarProblem(name, msg, f'quote it: {name}: "{written}"')
    elif spec.type is bool:
        if isinstance(value, bool):
            return value, None
    elif spec.type is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value, None
    elif isinstance(value, spec.type):
        return value, None
    kind = _WORDS.get(type(value), type(value).__name__)
    if isinstance(value, bool):
        kind = _WORDS[bool]
    hint = {bool: f"{name}: true (or false), without quotes",
            int: f"{name}: {spec.default} (a whole number, without quotes)",
            str: f'{name}: "{spec.default}"',
            list: f"{name}: [a, b] (a YAML list)",
            dict: f"{name}: {{key: value}} (a YAML mapping)"}[spec.type]
    return value, VarProblem(name, f"{name} must be a {_WORDS[spec.type]}, got {kind} "
                             f"{show(value)}", f"write {hint}")


def check_value(spec: VarSpec, value: Any, raw: str | None = None) -> tuple[Any, VarProblem | None]:
    """Type check (with coercion), choices and the semantic check of one variable."""
    value, problem = coerce_value(spec, value, raw)
    if problem:
        return value, problem
    if spec.choices is not None:
        if spec.name == "nvidia_fabricmanager" and isinstance(value, str) \
                and value.lower() in ("true", "false"):
            return value.lower() == "true", None
        if value not in spec.choices or (isinstance(value, bool)
                                         and spec.name != "nvidia_fabricmanager"):
            words = "|".join(str(c).lower() if isinstance(c, bool) else str(c)
                             for c in spec.choices)
            best = suggest(str(value), [str(c) for c in spec.choices if isinstance(c, str)])
            fix = f"write {spec.name}: {best}" if best else f"use one of {words}"
            return value, VarProblem(spec.name, f"{spec.name} must be one of {words}, got "
                                     f"{show(value)}", fix)
        return value, None
    if has_jinja(value):
        if not is_rendered(spec.name):
            return value, VarProblem(
                spec.name, f"{spec.name} holds a placeholder ({{{{ or {{%), but gpuk8s expands "
                "placeholders only in the *_url variables; this value would be used as written",
                f"write the value itself, e.g. {spec.name}: {show(spec.default)}")
        problem = _check_jinja_syntax(spec.name, value)
        if problem:
            return value, problem
    rule = rules().get(spec.name)
    check = rule.check if rule else None
    if check is None and spec.name.endswith("_url"):
        check = check_url
    if check is None and spec.type is int:
        check = check_positive
    if check is None:
        return value, None
    return value, check(spec.name, value)


def _check_jinja_syntax(name: str, value: str) -> VarProblem | None:
    try:
        ENV.parse(value)
    except jinja2.TemplateSyntaxError as exc:
        return VarProblem(name, f"{name} has a broken Jinja placeholder: {exc.message}",
                          'write placeholders as "{{ variable }}", e.g. '
                          '"{{ kubernetes_version }}"')
    return None


def check_combination(values: Mapping[str, Any]) -> list[VarProblem]:
    """Checks across variables of one host: each rule's ``across``, declared by the role that
    owns the variable. The problem's key is the variable to change."""
    return [p for rule in rules().values() if rule.across and (p := rule.across(values))]


# --------------------------------------------------------------------------- overrides


def parse_set_value(text: str, *, as_string: bool = False) -> Any:
    """One ``--set`` value, the same rule for inventories and workloads: parsed as YAML, except
    that where a string is wanted (``as_string``) the text is kept as typed when YAML would
    read a number or null (``--set kubernetes_version=1.30`` is "1.30", never 1.3)."""
    if as_string and text == "":
        return ""
    try:
        value = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, TypeError, RecursionError):
        return text
    if as_string and isinstance(value, (int, float)) and not isinstance(value, bool):
        return text.strip()
    if as_string and value is None:
        return text
    return value


def parse_override_value(spec: VarSpec | None, text: str) -> Any:
    """An inventory ``--set`` value (see parse_set_value)."""
    return parse_set_value(text, as_string=spec is not None and spec.type is str)


# --------------------------------------------------------------------------- merge


@dataclass(frozen=True)
class Origin:
    """Where a value came from; ``str()`` gives e.g. ``inventories/lab.yaml:12 (all.vars)``."""

    text: str
    path: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class VarLayer:
    """One precedence level: values by key, each with its Origin."""

    values: Mapping[str, Any]
    origins: Mapping[str, Origin] = field(default_factory=dict)
    label: str = ""

    def origin(self, key: str) -> Origin:
        return self.origins.get(key) or Origin(self.label or "?")


class MergedVars(Mapping[str, Any]):
    """Variables after precedence; ``origin(key)`` says where each value came from."""

    __slots__ = ("_history", "_origins", "_values")

    def __init__(self, values: Mapping[str, Any], origins: Mapping[str, Origin],
                 history: Mapping[str, Sequence[tuple[Origin, Any]]] | None = None) -> None:
        self._values = dict(values)
        self._origins = dict(origins)
        self._history = {k: tuple(v) for k, v in (history or {}).items()}

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"MergedVars({self._values!r})"

    def origin(self, key: str) -> str:
        """Where the value of ``key`` came from, e.g. ``group_vars/workers.yaml:3``."""
        return str(self._origins[key])

    def origin_of(self, key: str) -> Origin:
        """Like origin() but structured (path, line)."""
        return self._origins[key]

    def history(self, key: str) -> tuple[tuple[Origin, Any], ...]:
        """Every value ``key`` had, lowest precedence first; the last one won."""
        return self._history.get(key, ())

    def subset(self, keys: Iterable[str]) -> MergedVars:
        wanted = [k for k in keys if k in self._values]
        return MergedVars({k: self._values[k] for k in wanted},
                          {k: self._origins[k] for k in wanted},
                          {k: self._history[k] for k in wanted if k in self._history})

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)


def merge_vars(layers: Iterable[VarLayer]) -> MergedVars:
    """Merge layers, lowest precedence first; a later layer replaces a key (no deep merge)."""
    values: dict[str, Any] = {}
    origins: dict[str, Origin] = {}
    history: dict[str, list[tuple[Origin, Any]]] = {}
    for layer in layers:
        for key, value in layer.values.items():
            where = layer.origin(key)
            values[key] = value
            origins[key] = where
            history.setdefault(key, []).append((where, value))
    return MergedVars(values, origins, history)


def defaults_layer(specs: Mapping[str, VarSpec]) -> VarLayer:
    """The lowest layer: every spec's default."""
    origins = {}
    for name, spec in specs.items():
        kind = "default" if spec.role == "cluster" else "role default"
        origins[name] = Origin(f"{kind} ({spec.source})", spec.source, spec.line)
    return VarLayer({n: s.default for n, s in specs.items()}, origins, "role default")


# --------------------------------------------------------------------------- rendering
