"""The one confirmation prompt (runner.confirmed): bootstrap's "apply N change(s)?" and every
day-2 command's question (day2.steps.ask_confirmation), reset's typed name included."""

from __future__ import annotations

import io
import sys

import pytest

from gpuk8s.day2.steps import ask_confirmation
from gpuk8s.errors import Gpuk8sError
from gpuk8s.runner import confirmed


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def typed(monkeypatch: pytest.MonkeyPatch, answer: str) -> list[str]:
    """stdin a terminal where the user types ``answer``; the questions asked."""
    asked: list[str] = []
    monkeypatch.setattr(sys, "stdin", Terminal())
    monkeypatch.setattr("builtins.input", lambda q: asked.append(q) or answer)
    return asked


@pytest.mark.parametrize("answer, ok", [("y", True), (" YES\n", True), ("Yes", True),
                                        ("", False), ("n", False), ("yes please", False)])
def test_y_or_yes_in_any_case(monkeypatch: pytest.MonkeyPatch, answer: str, ok: bool) -> None:
    asked = typed(monkeypatch, answer)
    assert confirmed("apply 3 change(s)? [y/N] ") is ok
    assert asked == ["apply 3 change(s)? [y/N] "]


@pytest.mark.parametrize("answer, ok", [("cp-01", True), (" cp-01 ", True), ("y", False),
                                        ("CP-01", False), ("yes", False)])
def test_a_typed_name_must_match_exactly(monkeypatch: pytest.MonkeyPatch, answer: str,
                                         ok: bool) -> None:
    typed(monkeypatch, answer)
    assert confirmed("type cp-01: ", expected="cp-01") is ok


def test_without_a_terminal_it_refuses_and_names_yes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    with pytest.raises(Gpuk8sError, match="stdin is not a terminal; pass --yes"):
        confirmed("apply? [y/N] ")
    with pytest.raises(Gpuk8sError, match="pass --yes"):
        ask_confirmation("remove gpu-02? [y/N] ", False, None)
    ask_confirmation("remove gpu-02? [y/N] ", True, None)  # --yes: nothing asked


def test_a_callback_answers_instead_of_the_terminal() -> None:
    asked: list[str] = []
    assert confirmed("q? ", lambda q: asked.append(q) or True) is True
    assert asked == ["q? "]
    with pytest.raises(Gpuk8sError, match="aborted: nothing was changed"):
        ask_confirmation("reset? ", False, lambda q: False)
    ask_confirmation("reset? ", False, lambda q: True)


def test_day2_no_stops_with_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    typed(monkeypatch, "n")
    with pytest.raises(Gpuk8sError, match="aborted"):
        ask_confirmation("upgrade 2 node(s)? [y/N] ", False, None)
    typed(monkeypatch, "gpu")
    with pytest.raises(Gpuk8sError, match="aborted"):
        ask_confirmation("type cp-01: ", False, None, expected="cp-01")
    typed(monkeypatch, "cp-01")
    ask_confirmation("type cp-01: ", False, None, expected="cp-01")
