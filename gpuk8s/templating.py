"""Placeholders in inventory strings (``{{ kubernetes_version }}`` in a repo URL): rendered once,
in Jinja's sandbox, with host facts inserted as plain text, never rendered themselves."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jinja2
import jinja2.meta
import jinja2.sandbox

from gpuk8s.checks import JINJA_MARK, check_url
from gpuk8s.errors import PlanError

#: Inventory strings are the operator's, but they travel (shared group_vars, --set from CI):
#: a sandbox keeps a placeholder from reaching Python objects on the admin machine
ENV = jinja2.sandbox.ImmutableSandboxedEnvironment(
    undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
ENV.globals.clear()  # lipsum, range, cycler...: a placeholder names variables, nothing else


def is_rendered(name: str) -> bool:
    """Whether gpuk8s expands placeholders in the variable ``name`` (only the URLs)."""
    return name.endswith("_url")


def render_value(value: Any, context: Mapping[str, Any], *, name: str | None = None,
                 data: Mapping[str, Any] | None = None) -> Any:
    """Render Jinja placeholders in strings (recursing into lists and mappings), once.

    A placeholder may name a variable of ``context`` whose own value holds placeholders: that
    value is rendered first (once, with loops refused). ``data`` holds values that came from a
    host (``os_id``): they are inserted as plain text and never rendered, so a node's output
    cannot become a template. Raises PlanError naming the variable on an undefined name, a
    syntax error or a loop.
    """
    return _Renderer(context, data or {}, name).value(value, ())


class _Renderer:
    def __init__(self, context: Mapping[str, Any], data: Mapping[str, Any],
                 name: str | None) -> None:
        self.context, self.data, self.name = context, data, name
        self.done: dict[str, Any] = {}

    def value(self, value: Any, stack: tuple[str, ...]) -> Any:
        if isinstance(value, str):
            return self.text(value, stack)
        if isinstance(value, list):
            return [self.value(v, stack) for v in value]
        if isinstance(value, tuple):
            return tuple(self.value(v, stack) for v in value)
        if isinstance(value, Mapping):
            return {k: self.value(v, stack) for k, v in value.items()}
        return value

    def variable(self, key: str, stack: tuple[str, ...]) -> Any:
        if key in self.data:
            return self.data[key]
        if key not in self.done:
            if key in stack:
                label = f"{self.name}: " if self.name else ""
                raise PlanError(f"{label}placeholders refer to each other in a loop: "
                                + " -> ".join((*stack, key)))
            self.done[key] = self.value(self.context[key], (*stack, key))
        return self.done[key]

    def text(self, text: str, stack: tuple[str, ...]) -> str:
        if not JINJA_MARK.search(text):
            return text
        label = f"{self.name}: " if self.name else ""
        try:
            template = ENV.from_string(text)
            names = jinja2.meta.find_undeclared_variables(ENV.parse(text))
            known = {n: self.variable(n, stack) for n in names
                     if n in self.data or n in self.context}
            return template.render(known)
        except jinja2.UndefinedError as exc:
            raise PlanError(f"{label}{exc.message} in {text!r}") from None
        except jinja2.sandbox.SecurityError as exc:
            raise PlanError(f"{label}{text!r} reaches outside the template sandbox ({exc}); "
                            "placeholders may only name variables") from None
        except jinja2.TemplateError as exc:
            raise PlanError(f"{label}cannot render {text!r}: {exc}") from None


def render_url(vars: Mapping[str, Any], name: str, **data: str) -> str:
    """The URL variable ``name`` rendered (host facts in ``data`` as plain text), then
    checked like any URL the inventory gives; PlanError names the variable otherwise. An
    empty value stays empty (the variable's own check said whether "" is allowed)."""
    if vars[name] == "":
        return ""
    url = render_value(vars[name], vars, name=name, data=data)
    problem = check_url(name, url, rendered=True)
    if problem:
        raise PlanError(f"{problem.message} once its placeholders are filled in"
                        f"\n  fix: {problem.fix}")
    return str(url)


def host_placeholders(os_release: Mapping[str, str]) -> dict[str, str]:
    """What a URL placeholder may take from the host itself (inserted as plain text, never
    rendered): ``os_id`` (ubuntu, debian) and ``nvidia_cuda_distro`` (ubuntu2404, debian12:
    the folder names of NVIDIA's CUDA repositories)."""
    os_id = os_release.get("ID", "debian")
    return {"os_id": os_id, "nvidia_cuda_distro":
            f"{os_release.get('ID', '')}{os_release.get('VERSION_ID', '').replace('.', '')}"}


class HostVars(Mapping[str, Any]):
    """One host's variables as roles see them: every variable that takes placeholders (the
    URLs) is rendered once, on first use, with the host's placeholder data, and checked; the
    others are as the inventory gives them. Roles never render anything themselves."""

    def __init__(self, raw: Mapping[str, Any], data: Callable[[], Mapping[str, str]]) -> None:
        self.raw = raw
        self._data = data
        self._done: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        value = self.raw[name]
        if not is_rendered(name) or not isinstance(value, str):
            return value
        if name not in self._done:
            self._done[name] = render_url(self.raw, name, **self._data())
        return self._done[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)
