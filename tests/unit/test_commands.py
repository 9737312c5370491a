"""Each command and flag is declared once (gpuk8s/cli.py): `invoke COMMAND` and the `gpuk8s`
console script are the same tasks, so their flags, short aliases, help and defaults cannot
drift; the lab's and bench's tasks are invoke's only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from invoke import Program

import tasks
from gpuk8s import cli
from gpuk8s.errors import InventoryError, PhaseFailed, PreflightError

ROOT = Path(__file__).resolve().parents[2]


def contexts(ns: Any) -> dict[str, Any]:
    """Command name -> its parser context (flags, aliases, help), as the program builds it."""
    return {ctx.name: ctx for ctx in ns.to_contexts()}


def via_gpuk8s(argv: list[str]) -> int:
    return cli.main(argv)


def via_invoke(argv: list[str]) -> int:
    """The real `invoke ARGV` from the checkout (invoke's Program loading tasks.py)."""
    try:
        Program(binary="invoke").run(["invoke", "--search-root", str(ROOT), *argv])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def test_the_console_script_is_the_invoke_tasks_without_the_lab() -> None:
    assert cli.program.namespace is cli.ns
    assert set(tasks.ns.tasks) - set(cli.ns.tasks) == {"bench"}
    assert set(tasks.ns.collections) == {"lab"} and not cli.ns.collections
    assert all(tasks.ns.tasks[name] is task for name, task in cli.ns.tasks.items())
    ours, invokes = contexts(cli.ns), contexts(tasks.ns)
    assert len(ours) == 26
    for name, ctx in ours.items():  # built twice: the help survives a second parser
        assert ctx.help_tuples() == invokes[name].help_tuples(), name
        assert [a.name for a in ctx.positional_args] == \
            [a.name for a in invokes[name].positional_args]


def test_every_flag_has_help_and_its_one_short_alias_in_every_command() -> None:
    helps: dict[str, set[str]] = {}
    for name, ctx in contexts(cli.ns).items():
        for arg in ctx.args.values():
            assert arg.help, f"{name} --{arg.names[0]} has no help"
            shorts = [n for n in arg.names if len(n) == 1]
            assert shorts == ([cli.SHORT[arg.name]] if arg.name in cli.SHORT else []), \
                f"{name} --{arg.names[0]}: {shorts}"
            helps.setdefault(arg.name, set()).add(arg.help)
        if "set" in ctx.args:  # -e is --set wherever --set is (ansible's -e), and nothing else
            assert ctx.flags["-e"].name == "set", name
        else:
            assert "-e" not in ctx.flags, name
    assert {n for n, ctx in contexts(cli.ns).items() if "-e" in ctx.flags} == {
        "bootstrap", "plan", "check", "facts", "images", "deploy", "undeploy", "verify",
        "lock"}
    for flag in ("inventory", "ask_become_pass", "drain_timeout", "values", "diff", "max_fail"):
        assert len(helps[flag]) == 1, (flag, helps[flag])
    assert "any failure stops the run" in next(iter(helps["max_fail"]))


@pytest.mark.parametrize("command", ["bootstrap", "deploy", "verify", "report", "upgrade"])
def test_the_help_of_a_command_reads_the_same_in_both(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert via_gpuk8s(["--help", command]) == 0
    ours = capsys.readouterr().out
    assert via_invoke(["--help", command]) == 0
    invokes = capsys.readouterr().out
    assert ours.startswith(f"Usage: gpuk8s [--core-opts] {command} ")
    assert ours.split("\n", 1)[1] == invokes.split("\n", 1)[1]


#: command lines -> the function each must call and its arguments, the same from both
CALLS = [
    (["bootstrap", "-i", "inv.yaml", "-e", "a=1", "--set", "b=2", "-K", "-l", "gpu-0*",
      "--max-fail", "25%", "-q", "-y", "--diff"],
     "bootstrap", {"inventory": "inv.yaml", "limit": "gpu-0*", "yes": True, "check": False,
                   "diff": True, "sets": ["a=1", "b=2"], "ask_become_pass": True,
                   "max_fail": "25%", "quiet": True, "backup": True}),
    (["plan"], "plan", {"inventory": cli.INVENTORY, "limit": None, "diff": False, "sets": [],
                        "ask_become_pass": False}),
    (["facts", "-i", "x", "--json", "-e", "a=1"], "facts",
     {"inventory": "x", "limit": None, "sets": ["a=1"], "ask_become_pass": False,
      "as_json": True}),
    (["reprovision", "--host", "gpu-02", "-i", "x", "--drain-timeout", "60", "--full"],
     "reprovision", {"inventory": "x", "host": "gpu-02", "reinstall_driver": False,
                     "full": True, "drain_timeout": 60, "yes": False, "backup": True}),
    (["remove-node", "gpu-02", "-y", "--no-backup"], "remove_node",
     {"inventory": cli.INVENTORY, "host": "gpu-02", "drain_timeout": 300, "yes": True,
      "backup": False}),
    (["backup", "-i", "x", "--keep", "3"], "backup", {"inventory": "x", "keep": 3}),
    (["backup"], "backup", {"inventory": cli.INVENTORY, "keep": None}),
    (["restore", "-i", "x", "--from", "b/lab-20261129T120000Z", "-y"], "restore",
     {"inventory": "x", "source": "b/lab-20261129T120000Z", "yes": True, "backup": True}),
    (["renew-certs", "--host", "cp-02", "-y"], "renew_certs",
     {"inventory": cli.INVENTORY, "host": "cp-02", "yes": True, "backup": True}),
    (["deploy", "jupyter", "-i", "x", "-f", "v.yaml", "-e", "gpus=2", "--timeout", "30",
      "--render"], "deploy", {"inventory": "x", "name": "jupyter", "values_files": ["v.yaml"],
                              "sets": ["gpus=2"], "timeout": 30, "render_only": True}),
    (["verify", "--local", "-l", "gpu-01", "--without-nvcc", "--python", "/p"], "verify_local",
     {"inventory": cli.INVENTORY, "limit": "gpu-01", "python": "/p", "nvcc": False}),
    (["upgrade", "--kubernetes", "1.36.2", "--serial", "2", "-y"], "upgrade",
     {"inventory": cli.INVENTORY, "driver": None, "kubernetes": "1.36.2", "kernel": None,
      "limit": None, "serial": 2, "drain_timeout": 300, "yes": True, "backup": True}),
    (["upgrade", "--kernel", "-y", "--no-backup"], "upgrade",
     {"inventory": cli.INVENTORY, "driver": None, "kubernetes": None, "kernel": True,
      "limit": None, "serial": 1, "drain_timeout": 300, "yes": True, "backup": False}),
    (["upgrade", "--kernel", "6.8.0-60-generic", "-l", "gpu-01"], "upgrade",
     {"inventory": cli.INVENTORY, "driver": None, "kubernetes": None,
      "kernel": "6.8.0-60-generic", "limit": "gpu-01", "serial": 1, "drain_timeout": 300,
      "yes": False, "backup": True}),
    (["gpu-usage", "-o", "wide"], "gpu_usage",
     {"inventory": cli.INVENTORY, "as_json": False, "wide": True}),
    (["images", "-o", "list", "-f", "a", "-f", "b"], "images",
     {"inventory": cli.INVENTORY, "sets": [], "values_files": ["a", "b"], "output": "list"}),
    (["report", "--run", "runs/x"], "report", {"run": "runs/x"}),
    (["serve-bundle", "b.tar.gz", "--listen", "10.0.0.5", "--name", "admin.lab"],
     "serve_bundle", {"bundle": "b.tar.gz", "listen": "10.0.0.5", "names": ["admin.lab"],
                      "apt_port": 8443, "registry_port": 5443,
                      "state": "/var/lib/gpuk8s-bundle"}),
    (["lock", "-i", "x", "-e", "lock_workloads=[jupyter]", "-o", "x.lock"], "lock",
     {"inventory": "x", "output": "x.lock", "sets": ["lock_workloads=[jupyter]"]}),
]


@pytest.mark.parametrize("argv, command, kwargs", CALLS, ids=[c[0][0] for c in CALLS])
def test_both_front_ends_make_the_same_call(monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                            command: str, kwargs: dict[str, Any]) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    def record(command: str) -> Any:
        return lambda **kw: seen.append((command, kw))

    for name in cli.COMMANDS:
        monkeypatch.setitem(cli.COMMANDS, name, record(name))
    assert via_gpuk8s(argv) == 0
    assert via_invoke(argv) == 0
    assert seen == [(command, kwargs)] * 2


@pytest.mark.parametrize("error, code", [(PreflightError({"h": []}), 3),
                                         (PhaseFailed("node", {}), 2),
                                         (InventoryError("bad"), 1), (KeyboardInterrupt(), 130)])
def test_both_exit_with_the_error_code_and_one_message(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        error: BaseException, code: int) -> None:
    def boom(**kw: Any) -> None:
        raise error

    monkeypatch.setitem(cli.COMMANDS, "status", boom)
    assert via_gpuk8s(["status"]) == code
    ours = capsys.readouterr().err
    assert via_invoke(["status"]) == code
    assert capsys.readouterr().err == ours and ours.count("\n") >= 1 and "Traceback" not in ours


@pytest.mark.parametrize("argv, code, message", [
    (["status", "-o", "yaml"], 2, "error: --output 'yaml': use wide (every column) or json"),
    (["images", "-o", "yaml"], 2, "error: --output 'yaml': use table, json or list"),
    (["upgrade", "--serial", "two"], 1, "--serial takes a whole number, not 'two'"),
    (["bootstrap", "--nope"], 1, "No idea what '--nope' is!"),
    (["verify", "--without-nvcc"], 1, "add --local"),
    (["deploy"], 1, "'deploy' did not receive required positional arguments: 'name'"),
])
def test_usage_errors_read_and_exit_the_same(capsys: pytest.CaptureFixture[str],
                                             argv: list[str], code: int, message: str) -> None:
    assert via_gpuk8s(argv) == code
    ours = capsys.readouterr().err
    assert via_invoke(argv) == code
    assert capsys.readouterr().err == ours and message in ours and "Traceback" not in ours
