"""Typed facts: a read-only shell command plus a pure parser of its output."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from gpuk8s.errors import FactError

T = TypeVar("T")
#: a fact only produces its value (parse), so a Fact[dict] is a Fact[Mapping]
T_co = TypeVar("T_co", covariant=True)


class Request:
    """What a probe is asked for, named by its class and args (``Files("/etc/a")``): a Fact or a
    Source. Two requests are equal when they are of one kind (both facts, or both sources), of
    one class name and args."""

    name: ClassVar[str]
    #: Fact or Source: a fact never equals a source of the same name and args
    _kind: ClassVar[type[Request]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.name = cls.__name__

    def __init__(self, *args: str) -> None:
        self.args: tuple[str, ...] = tuple(args)

    @property
    def key(self) -> str:
        return self.name if not self.args else f"{self.name}({','.join(self.args)})"

    def __hash__(self) -> int:
        return hash((self.name, self.args))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, self._kind) and isinstance(other, Request) and \
            (self.name, self.args) == (other.name, other.args)

    def __repr__(self) -> str:
        return self.key


class Fact(Request, Generic[T_co]):
    """One piece of host state. Subclasses set ``command()`` and ``parse()``.

    A fact instance is also its own request: ``Files("/etc/a", "/etc/b")`` asks for those paths.
    Commands must be read-only POSIX sh and should exit 0 when a tool is simply absent.
    """

    def command(self) -> str:
        raise NotImplementedError

    def parse(self, output: str, exit_code: int) -> T_co:
        raise NotImplementedError

    def sources(self) -> tuple[Source, ...]:
        """The shared reads this fact's command takes its part from (see Source)."""
        return ()


class Source(Request):
    """One read several facts share (one ``nvidia-smi --query-gpu``, one ``systemctl show``,
    one round of kubectl reads), so that a probe runs each tool once per host.

    A source's ``command()`` runs in the probe's own shell, before the facts, and leaves what
    it read in shell variables (``_gk_`` names), which the facts' subshells inherit; it never
    exits, and prints nothing a fact needs. Sources of one class merge into one (``merge``:
    the union of their args, first seen first), which build_probe runs once. A fact's command
    starts with its sources' ``ensure()``: their commands, run only where no probe ran them
    first (``ready()`` is false), so a fact's command still works on its own and gives the
    same output either way. A source is named and compared by its class and args, as facts
    are."""

    def command(self) -> str:
        raise NotImplementedError

    def ready(self) -> str:
        """A shell test, true once this source's variables are set (by a probe's run of it,
        or of a merged source covering it)."""
        raise NotImplementedError

    def start(self) -> str:
        """Shell lines for a read that can go on in the background (its ``command()`` then
        collects it): a probe runs them at its very top, before any section, and runs the
        facts that need this source after all the others, so that the read overlaps them.
        They never print and never read stdin. None by default."""
        return ""

    def ensure(self) -> str:
        """Shell lines that run this source unless it already ran in this shell."""
        return f"{self.ready()} || {{\n{self.start()}\n{self.command()}\n}}"

    @classmethod
    def merge(cls, sources: Sequence[Source]) -> Source:
        """One source covering ``sources`` (all of this class): their args, each once."""
        return cls(*dict.fromkeys(a for s in sources for a in s.args))


Fact._kind = Fact
Source._kind = Source


class HostFacts(Mapping[Fact[Any], Any]):
    """The parsed facts of one host. ``facts[SomeFact()]`` raises KeyError if never probed."""

    def __init__(self, host: str, values: Mapping[Fact[Any], Any]) -> None:
        self.host = host
        self._values = dict(values)

    def __getitem__(self, fact: Fact[T]) -> T:
        try:
            value: T = self._values[fact]
            return value
        except KeyError:
            raise FactError(f"{self.host}: fact {fact.key} was not probed (planning bug)") \
                from None

    def get(self, fact: Fact[T], default: Any = None) -> Any:
        return self._values.get(fact, default)

    def __iter__(self) -> Iterator[Fact[Any]]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def as_json(self) -> dict[str, Any]:
        return {fact.key: value for fact, value in self._values.items()}
