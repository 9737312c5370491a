"""Typed facts: a read-only shell command plus a pure parser of its output."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Generic, TypeVar

from gpuk8s.errors import FactError

T = TypeVar("T")
#: a fact only produces its value (parse), so a Fact[dict] is a Fact[Mapping]
T_co = TypeVar("T_co", covariant=True)


class Fact(Generic[T_co]):
    """One piece of host state. Subclasses set ``command()`` and ``parse()``.

    A fact instance is also its own request: ``Files("/etc/a", "/etc/b")`` asks for those paths.
    Commands must be read-only POSIX sh and should exit 0 when a tool is simply absent.
    """

    name: ClassVar[str]

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
        return isinstance(other, Fact) and (self.name, self.args) == (other.name, other.args)

    def __repr__(self) -> str:
        return self.key

    def command(self) -> str:
        raise NotImplementedError

    def parse(self, output: str, exit_code: int) -> T_co:
        raise NotImplementedError


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
