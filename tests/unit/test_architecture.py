"""The shape of the code: gpuk8s's modules import each other without a cycle (function-level
imports included), its packages (facts/, session.py...) import only the layers below them
(ALLOWED) and form no loop either, and roles/ import only the engine's public layers."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(package: str = "gpuk8s") -> dict[str, set[str]]:
    """module -> the gpuk8s modules it imports anywhere in its text."""
    files = {_module_name(p): p for p in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = module.split(".") if is_package else module.split(".")[:-1]
                    anchor = anchor[:len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != module and target != package:
                    graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_walk_sees_real_imports() -> None:
    graph = import_graph()
    assert "gpuk8s.session" in graph["gpuk8s.api"]
    assert "gpuk8s.day2.steps" in graph["gpuk8s.day2.nodes"]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_no_import_cycle_in_gpuk8s() -> None:
    assert cycles(import_graph()) == []


def package_of(module: str) -> str:
    """A module's package-level node: gpuk8s.facts.kube -> facts, gpuk8s.session -> session."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph(graph: dict[str, set[str]] | None = None
                  ) -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    """(package -> the packages it imports, (package, imported) -> the module imports that make
    the edge): gpuk8s's top-level modules and subpackages as nodes, gpuk8s/__init__ left out."""
    graph = import_graph() if graph is None else graph
    packages: dict[str, set[str]] = {}
    why: dict[tuple[str, str], list[str]] = {}
    for module, targets in sorted(graph.items()):
        if module == "gpuk8s":
            continue
        source = package_of(module)
        packages.setdefault(source, set())
        for target in sorted(targets):
            if (imported := package_of(target)) != source:
                packages[source].add(imported)
                why.setdefault((source, imported), []).append(f"{module} -> {target}")
    return packages, why


def test_no_import_cycle_between_packages() -> None:
    """Packages (facts/, ops/, session.py...) form layers: no package reaches itself back
    through the others, even when each module-level import is fine on its own."""
    packages, why = package_graph()
    loops = cycles(packages)
    edges = [f"  {a} -> {b}: {', '.join(why[a, b])}" for loop in loops for a in loop
             for b in sorted(packages[a]) if b in loop]
    assert loops == [], "a package-level import loop through " + "; ".join(
        ", ".join(loop) for loop in loops) + "; its edges:\n" + "\n".join(edges) + \
        "\nmove the thing imported the wrong way to the layer it belongs to (see ALLOWED)"


# The layers. A package imports only what its ALLOWED row names: packages of lower layers (not
# necessarily all of them) and, in the order shown, of its own; never upward, never in a loop.
#   commands       cli, api, day2, workloads, images, bundle, gpucheck, lock (+ their helpers
#                  bundlefiles, gpucheck_script, htmlreport)
#   runner/session runner > backups > gather, drain, handoffs, cluster_values > session > report
#                  (etcdsnap, the snapshot reader backups use, imports nothing of gpuk8s)
#   playbook/roles inventory > variables > roles > templating; playbook; gpusharing
#   executor       runs Op values on the transports (ops/ are pure descriptions: they never
#                  import the executor, and neither do roles, which only plan)
#   ops/facts      dra, mig > ops > facts
#   transport      ssh, local, known_hosts
#   leaves         errors, sinks, sections, progress, redact, cafile, checks, paths, parallel,
#                  lockfile:
#                  importable by all
LEAVES = frozenset({"errors", "sinks", "sections", "progress", "redact", "cafile", "checks",
                    "paths", "parallel", "lockfile"})
#: every package below the commands
ENGINE = frozenset({"runner", "backups", "etcdsnap", "gather", "drain", "handoffs",
                    "cluster_values", "session", "report", "inventory", "variables", "roles",
                    "templating", "playbook", "gpusharing", "dra", "mig", "tenancy", "ops",
                    "facts", "executor", "transport"}) | LEAVES
#: package -> the packages it may import (gpuk8s/facts/*.py is "facts", session.py "session")
ALLOWED: dict[str, frozenset[str]] = {
    # leaves: each other only, in this order
    "errors": frozenset(), "sections": frozenset(), "progress": frozenset(),
    "redact": frozenset(), "sinks": frozenset({"errors"}), "cafile": frozenset({"errors"}),
    "paths": frozenset({"errors"}), "parallel": frozenset(),
    # where an inventory's lock lives and its apt pins (gpuk8s/lock writes it)
    "lockfile": frozenset({"errors"}),
    "checks": frozenset({"errors", "sinks", "cafile"}),
    "transport": LEAVES,
    "facts": LEAVES,
    "ops": LEAVES | {"facts"},
    "mig": LEAVES | {"facts"},
    "dra": LEAVES | {"facts", "ops"},
    "executor": LEAVES | {"transport", "ops"},
    "playbook": LEAVES,
    "templating": LEAVES,
    "roles": LEAVES | {"facts", "ops", "templating"},
    "gpusharing": LEAVES | {"mig"},
    # the lab's users and groups as namespaces, quotas and bindings (pure, like gpusharing)
    "tenancy": LEAVES,
    # every role's RULES and defaults: the variables read the roles, not the reverse
    "variables": LEAVES | {"playbook", "roles", "templating"},
    "inventory": LEAVES | {"variables"},
    "report": LEAVES | {"executor", "ops"},
    "session": LEAVES | {"report", "inventory", "playbook", "roles", "ops", "facts",
                         "executor", "transport"},
    "drain": LEAVES | {"session", "ops"},
    "handoffs": LEAVES | {"session", "executor", "ops", "facts"},
    # gather also opens a gathered session (gathered_session: day-2 commands, accept)
    "gather": LEAVES | {"session", "inventory", "playbook", "roles", "executor", "facts",
                        "report", "cluster_values"},
    "etcdsnap": frozenset(),
    # the backup before a control-plane change (runner) and `invoke backup` (day2)
    "backups": LEAVES | {"etcdsnap", "gather", "handoffs", "session", "report", "facts",
                         "ops"},
    # the cluster values roles read (HostContext.cluster), from the inventory and the facts
    "cluster_values": LEAVES | {"session", "inventory", "playbook", "facts", "gpusharing"},
    "runner": LEAVES | {"backups", "gather", "drain", "handoffs", "cluster_values", "session",
                        "report", "playbook", "roles", "ops", "facts", "executor"},
    # commands and their helpers
    "bundlefiles": LEAVES | {"report"},
    "htmlreport": LEAVES | {"report"},
    "gpucheck_script": LEAVES,
    "api": ENGINE | {"htmlreport"},
    # GPU acceptance: add-node (day2) runs it, so it stays below day2
    "accept": ENGINE,
    "day2": ENGINE | {"accept"},
    "workloads": ENGINE,
    "images": ENGINE | {"workloads"},
    "bundle": ENGINE | {"bundlefiles"},
    "gpucheck": ENGINE | {"gpucheck_script"},
    # `invoke lock`: the plan's apt sources and packages, and the images (images, workloads)
    "lock": ENGINE | {"images", "workloads", "bundle"},
    "cli": ENGINE | {"api", "day2", "workloads", "images", "gpucheck", "accept", "lock"},
    # scripts that run on a node (torch_probe.py...): nothing of gpuk8s
    "data": frozenset(),
}


def test_every_package_imports_only_what_its_layer_allows() -> None:
    packages, why = package_graph()
    new = sorted(set(packages) - set(ALLOWED))
    assert new == [], f"packages missing from ALLOWED: {', '.join(new)}; give each a row there " \
        "(the packages it may import) at its layer (see the layers above ALLOWED)"
    wrong = [f"{module} imports {target}: {source} may import only "
             f"{', '.join(sorted(ALLOWED[source])) or 'nothing of gpuk8s'}"
             for source in sorted(packages)
             for imported in sorted(packages[source] - ALLOWED[source])
             for module, _, target in (w.partition(" -> ") for w in why[source, imported])]
    assert wrong == [], "imports against the layers:\n  " + "\n  ".join(wrong) + \
        "\nfix: move what is imported down to a layer both may import (a leaf, or the lower " \
        "package's layer), or move the importing code up to the layer it belongs to; change " \
        "ALLOWED only when the new arrow points down and makes no loop"


def test_the_allowed_table_has_no_loop() -> None:
    """ALLOWED itself is layered: no row lets a package reach itself back."""
    assert cycles({p: set(ALLOWED[p]) & set(ALLOWED) for p in ALLOWED}) == []
    assert set(ENGINE) <= set(ALLOWED)


#: the modules that may run a command on a host's transport themselves: the transport, the
#: executor, and the fact probe (gather.py); everything else goes through the executor
MAY_RUN = {"gpuk8s/transport/__init__.py", "gpuk8s/transport/base.py",
           "gpuk8s/transport/ssh.py", "gpuk8s/transport/local.py",
           "gpuk8s/transport/known_hosts.py", "gpuk8s/executor.py", "gpuk8s/gather.py"}
_TRANSPORT_RUN = re.compile(r"transports\[[^\]]+\]\.run\(|\btransport\.run\(")


def test_only_the_executor_runs_commands_on_hosts() -> None:
    offenders = []
    for path in sorted((ROOT / "gpuk8s").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel in MAY_RUN:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _TRANSPORT_RUN.search(line):
                offenders.append(f"{rel}:{number}: {line.strip()}")
    assert offenders == []
    assert _TRANSPORT_RUN.search("result = session.transports[cp].run(f'cat x')")


def test_every_rule_names_a_variable_its_role_owns() -> None:
    from gpuk8s.variables import CLUSTER_RULES, load_variable_specs, rules

    specs = load_variable_specs()
    for name in rules():
        assert name in specs, f"a RULES entry names no variable: {name}"
        owner = specs[name].role
        if name not in CLUSTER_RULES:
            from gpuk8s.roles import load_role

            assert name in load_role(owner).rules(), \
                f"{name} is {owner}'s variable but another role declares its rule"


def test_only_the_transport_imports_paramiko_and_fabric() -> None:
    """SSH is the transport's; invoke is also the command line's (gpuk8s/cli.py: the commands
    are invoke tasks, and the gpuk8s console script is invoke's Program)."""
    graph_files = sorted((ROOT / "gpuk8s").rglob("*.py"))
    importers: dict[str, set[str]] = {"paramiko": set(), "fabric": set(), "invoke": set()}
    for path in graph_files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for top in {n.split(".")[0] for n in names} & set(importers):
                where = path.relative_to(ROOT)
                importers[top].add(str(where if where.name == "cli.py" else where.parent))
    assert importers["paramiko"] | importers["fabric"] == {"gpuk8s/transport"}
    assert importers["invoke"] <= {"gpuk8s/transport", "gpuk8s/cli.py"}


def test_no_module_in_gpuk8s_is_over_500_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "gpuk8s").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}, "split these by subject: " + ", ".join(f"{p} ({n})" for p, n in long.items())


def test_roles_never_render_placeholders_themselves() -> None:
    """URL variables reach roles rendered (HostContext.var): no role imports the renderer."""
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "roles").rglob("*.py")
                 if re.search(r"gpuk8s\.templating|render_(url|value)", p.read_text())]
    assert offenders == []


def test_a_role_sees_its_url_rendered_with_the_host_facts() -> None:
    from gpuk8s.facts import HostFacts
    from gpuk8s.facts.system import OsRelease
    from gpuk8s.roles import HostContext

    facts = HostFacts("n", {OsRelease(): {"ID": "ubuntu", "VERSION_ID": "24.04"}})
    ctx = HostContext("n", "nvidia_driver", {
        "nvidia_cuda_repo_url": "https://x.example/{{ nvidia_cuda_distro }}/",
        "docker_repo_url": "https://d.example/{{ os_id }}", "apt_lock_timeout": 5}, facts)
    assert ctx.var("nvidia_cuda_repo_url") == "https://x.example/ubuntu2404/"
    assert ctx.var("docker_repo_url") == "https://d.example/ubuntu"
    assert ctx.var("apt_lock_timeout") == 5


def role_files_by_module() -> dict[Path, list[str]]:
    """Each file of roles/ that is imported: the names of its module objects in sys.modules."""
    loaded: dict[Path, list[str]] = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and Path(file).resolve().is_relative_to(ROOT / "roles"):
            loaded.setdefault(Path(file).resolve(), []).append(name)
    return loaded


def test_a_role_module_is_imported_under_one_name() -> None:
    """roles/<name>/role.py is one module, roles.<name>.role, whether load_role, another role
    or a test imports it: one copy of its state (preflight's INVENTORY_RULES...)."""
    import roles.preflight.role as preflight
    from gpuk8s.playbook import ALL_ROLES
    from gpuk8s.roles import load_role

    for role in ALL_ROLES:
        load_role(role)
    assert preflight.check is sys.modules["roles.preflight.role"].check
    loaded = role_files_by_module()
    assert ROOT / "roles" / "preflight" / "role.py" in loaded
    wrong = {str(path.relative_to(ROOT)): names for path, names in loaded.items()
             if names != [_module_name(path)]}
    assert wrong == {}, "role files imported under another name (or twice): import a role " \
        "as roles.<name>.role, or through gpuk8s.roles.load_role"
    # a second import of a role file, as a loader of its own would make it, is caught
    path = ROOT / "roles" / "base" / "role.py"
    spec = importlib.util.spec_from_file_location("elsewhere.base", path)
    assert spec and spec.loader
    sys.modules["elsewhere.base"] = importlib.util.module_from_spec(spec)
    try:
        assert sorted(role_files_by_module()[path]) == ["elsewhere.base", "roles.base.role"]
    finally:
        del sys.modules["elsewhere.base"]


def test_the_roles_package_is_the_project_roots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another folder's package roles, imported first, is a PlanError, not a silent mix."""
    from gpuk8s.errors import PlanError
    from gpuk8s.roles import _import_roles_package

    other = types.ModuleType("roles")
    other.__path__ = ["/elsewhere/roles"]
    monkeypatch.setitem(sys.modules, "roles", other)
    with pytest.raises(PlanError, match="the package roles is imported from /elsewhere/roles"):
        _import_roles_package(ROOT)


#: a reach into the module behind a Role (load_role(x).module.ATTR, role._module)
_REACH_IN = re.compile(r"load_role\([^)]*\)\s*\.\s*module\b|\._module\b")


def test_no_code_reaches_into_the_module_behind_a_role() -> None:
    """Code uses a role through Role's typed methods and its EXPORTS (gpuk8s.roles), or imports
    roles.<name>.role outright: never through the module a Role wraps."""
    from gpuk8s.roles import load_role

    assert not hasattr(load_role("base"), "module")
    files = [*(ROOT / "gpuk8s").rglob("*.py"), *(ROOT / "roles").rglob("*.py"),
             *(ROOT / "tests" / "unit").glob("*.py"), ROOT / "tasks.py"]
    skip = {ROOT / "gpuk8s" / "roles.py", Path(__file__).resolve()}
    offenders = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
                 for path in sorted(set(files) - skip)
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if _REACH_IN.search(line)]
    assert offenders == [], "use the role's methods, add what it offers to its EXPORTS " \
        "(gpuk8s/roles.py), or import roles.<name>.role"
    assert _REACH_IN.search('sandbox = load_role("container_runtime").module.sandbox_image(v)')


def test_every_role_exports_what_gpuk8s_reads() -> None:
    """Each Exports of gpuk8s/roles.py is its role's EXPORTS; another role has none to give."""
    from gpuk8s.errors import PlanError
    from gpuk8s.roles import Exports, PreflightExports, exports, load_role

    kinds = Exports.__subclasses__()
    assert len(kinds) >= 3
    for kind in kinds:
        assert isinstance(exports(kind), kind)
    with pytest.raises(PlanError, match="role base exports no PreflightExports"):
        load_role("base").exports(PreflightExports)
