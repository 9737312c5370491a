"""Roles in Ansible's shape (defaults.yaml, templates/, role.py) loaded from <project>/roles.

roles/<name>/role.py is imported once, as the module ``roles.<name>.role`` (the package
``roles`` is the project root's roles/), whether load_role, another role or a test imports it."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, TypeVar

import jinja2

from gpuk8s.checks import Rule
from gpuk8s.errors import PlanError
from gpuk8s.facts import Fact, HostFacts
from gpuk8s.facts.system import OsRelease, System
from gpuk8s.lockfile import release_key
from gpuk8s.ops import Op
from gpuk8s.ops.apt import Apt
from gpuk8s.paths import project_root
from gpuk8s.templating import HostVars, host_placeholders


@dataclass
class HostContext:
    """Everything a role's plan may read: one host's vars and facts, plus cluster values."""

    host: str
    role: str
    vars: Mapping[str, Any]
    facts: HostFacts
    #: values shared by the whole run: control plane address, GPU counts, join command...
    cluster: dict[str, Any] = field(default_factory=dict)
    groups: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.vars, HostVars):
            facts = self.facts
            self.vars = HostVars(self.vars, lambda: host_placeholders(
                facts.get(OsRelease(), None) or {}))

    def var(self, name: str) -> Any:
        """The variable ``name``; a URL comes with its placeholders filled in and checked."""
        return self.vars[name]

    @property
    def apt(self) -> Apt:
        """How this host's apt-get runs (its apt_lock_timeout), with the versions the
        inventory's lock pins for its OS release (cluster["apt_lock"], when there is a lock)."""
        lock = self.cluster.get("apt_lock")
        if lock is None:
            return Apt.for_host(self.vars)
        system = self.facts.get(System(), None)
        release = release_key(self.facts.get(OsRelease(), None) or {},
                              system.arch if system is not None else "")
        if release not in lock["releases"]:
            raise PlanError(f"{lock['path']} has no packages for {release} ({self.host}'s OS "
                            f"release; it has {', '.join(sorted(lock['releases'])) or 'none'})"
                            ": run `invoke lock` again now that the host is in the inventory")
        return Apt.for_host(self.vars, pins=lock["releases"][release])

    def template(self, name: str, **extra: Any) -> bytes:
        """Render roles/<role>/templates/<name> (or templates/<name>) with vars + extra."""
        raw = self.vars.raw if isinstance(self.vars, HostVars) else self.vars
        return render(self.role, name, {**raw, **self.cluster, **extra}).encode()


def _env(role: str) -> jinja2.Environment:
    return _root_env(project_root(), role)


@cache
def _root_env(root: Path, role: str) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(root / "roles" / role / "templates"),
                                        str(root / "templates")]),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True,
        lstrip_blocks=True, autoescape=False)


def render(role: str, name: str, context: Mapping[str, Any]) -> str:
    """Render a template; an undefined variable or syntax error is a PlanError naming both."""
    try:
        return _env(role).get_template(name).render(**context)
    except jinja2.TemplateSyntaxError as exc:
        raise PlanError(f"template {exc.filename or name}:{exc.lineno}: {exc.message}") from None
    except jinja2.UndefinedError as exc:
        raise PlanError(f"template {name} (role {role}): {exc.message}") from None


#: a handler: the op a role's steps notify by name, run once after them
Handler = Callable[[HostContext], Op]
#: a preflight problem: (check name, message, fix); a check listed in preflight_ignore becomes
#: a warning
Problem = tuple[str, str, str]
#: a host's preflight problems: (errors, warnings)
Problems = tuple[list[Problem], list[Problem]]


class Exports:
    """What other code uses of one role beside its plan: a frozen dataclass per role (below),
    which that role's role.py fills in as EXPORTS; read it with :func:`exports`."""

    role: ClassVar[str]


@dataclass(frozen=True)
class ContainerRuntimeExports(Exports):
    role: ClassVar[str] = "container_runtime"
    #: the pod sandbox (pause) image containerd runs at these variables
    sandbox_image: Callable[[Mapping[str, Any]], str]


@dataclass(frozen=True)
class NvidiaDriverExports(Exports):
    role: ClassVar[str] = "nvidia_driver"
    #: the driver packages the role installs or asks about at these variables
    driver_package_names: Callable[[Mapping[str, Any]], list[str]]


@dataclass(frozen=True)
class PreflightExports(Exports):
    role: ClassVar[str] = "preflight"
    #: one host's checks, preflight_ignore applied
    check: Callable[[HostContext], Problems]
    #: the checks that need only the inventory (`gpuk8s check` runs them before any contact)
    inventory_check: Callable[[HostContext], Problems]
    #: checks whose failure leaves nothing to plan for the host
    unplannable: frozenset[str]


E = TypeVar("E", bound=Exports)


@dataclass(frozen=True)
class Role:
    """A loaded role, used through these methods only: its plan, facts, HANDLERS,
    REPLANNED_HANDLERS, RULES, PACKAGES and EXPORTS (each optional but plan)."""

    name: str
    _module: ModuleType = field(repr=False)

    def facts(self, vars: Mapping[str, Any]) -> Sequence[Fact[Any]]:
        """The facts its plan reads on a host with these variables."""
        fn: Callable[[Mapping[str, Any]], Sequence[Fact[Any]]] | None = self._get("facts", None)
        return fn(vars) if fn else ()

    def plan(self, ctx: HostContext) -> list[Op]:
        fn: Callable[[HostContext], list[Op]] = self._get("plan")
        return fn(ctx)

    def handlers(self) -> Mapping[str, Handler]:
        return self._get("HANDLERS", {})

    def replanned_handlers(self) -> frozenset[str]:
        """Handlers the role plans again from the host's state (REPLANNED_HANDLERS): a run
        killed before one of them needs no marker to have it run next time."""
        return frozenset(self._get("REPLANNED_HANDLERS", ()))

    def rules(self) -> Mapping[str, Rule]:
        """Its variables' rules (RULES): their checks, choices and scope."""
        return self._get("RULES", {})

    def packages(self) -> tuple[str, ...]:
        """The apt packages it installs (PACKAGES), which a reset with purge removes."""
        return tuple(self._get("PACKAGES", ()))

    def exports(self, kind: type[E]) -> E:
        """Its EXPORTS, which must be a ``kind``."""
        value = self._get("EXPORTS", None)
        if not isinstance(value, kind):
            raise PlanError(f"role {self.name} exports no {kind.__name__} (its EXPORTS is "
                            f"{type(value).__name__}, in {self._module.__file__})")
        return value

    def _get(self, attr: str, *default: Any) -> Any:
        return getattr(self._module, attr, *default)


def exports(kind: type[E]) -> E:
    """The EXPORTS of the role ``kind`` describes (``kind.role``)."""
    return load_role(kind.role).exports(kind)


def load_role(name: str) -> Role:
    """The role ``name`` of the project root (gpuk8s.paths.project_root), loaded once."""
    return _load_role(project_root(), name)


@cache
def _load_role(root: Path, name: str) -> Role:
    path = root / "roles" / name / "role.py"
    if not path.exists():
        raise PlanError(f"role {name!r} not found at {path}")
    _import_roles_package(root)
    return Role(name, importlib.import_module(f"roles.{name}.role"))


def _import_roles_package(root: Path) -> None:
    """Make the package ``roles`` root/roles (as ``import roles`` with root on sys.path would);
    one that is imported already from another folder is a PlanError."""
    folder = root / "roles"
    package = sys.modules.get("roles")
    if package is None:
        spec = importlib.machinery.PathFinder.find_spec("roles", [str(root)])
        assert spec
        package = importlib.util.module_from_spec(spec)
        sys.modules["roles"] = package
        assert spec.loader
        spec.loader.exec_module(package)
    where = [Path(p).resolve() for p in getattr(package, "__path__", [])]
    if where != [folder.resolve()]:
        shown = ", ".join(map(str, where)) or repr(package)
        raise PlanError(f"cannot load the roles of {root}: the package roles is imported from "
                        f"{shown} already")
