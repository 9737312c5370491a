"""Placeholders in inventory strings (``{{ kubernetes_version }}`` in a repo URL): rendered once,
in Jinja's sandbox, with host facts inserted as plain text, never rendered themselves."""

from __future__ import annotations

from collections.abc import Mapping
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
    checked like any URL the inventory gives; PlanError names the variable otherwise."""
    url = render_value(vars[name], vars, name=name, data=data)
    problem = check_url(name, url, rendered=True)
    if problem:
        raise PlanError(f"{problem.message} once its placeholders are filled in"
                        f"\n  fix: {problem.fix}")
    return str(url)
