"""The layers as the imports really are (docs/architecture.md, "Layers"), checked on every module's syntax tree.

Every import statement counts, at module level or inside a function. The rules:
- the tools (cli/) never import mlx, mlx-lm or a package that does (engine, scheduler, drafters' users),
  and never the daemon, except the one seam: ``mlxd_cli/local.py`` imports ``mlxd_daemon.local``, inside a
  function (mlx-generate --local);
- the daemon never imports the tools, and reaches the engine, scheduler and drafters through their
  packages' public names, not their modules (the engine's model-loading modules excepted, below);
- the protocol imports only the standard library, msgpack and pyzmq; ``messages`` nothing of the codec;
- the scheduler and the drafters never import mlx; the drafters only the standard library;
- inside the engine, storage never imports loading: no module under ``mlxd_engine/storage/`` imports one under
  ``mlxd_engine/loading/`` (relative or absolute, in a function too);
- the HTTP gateway's routes import helpers, never the app, and only ``context`` touches ``app.state``;
- no import cycle among the project's own modules (packages/, daemon/, cli/): every import counts, at module
  level or inside a function, but one under ``if TYPE_CHECKING:`` (never run); an import names the module it
  names (``from pkg import mod`` the submodule ``pkg.mod``, ``from pkg import name`` the package), not the
  packages above it that Python also runs;
- no relative import inside a function unless a comment says why: a comment that starts with ``# lazy:``,
  trailing the import's first line (``from .server import DaemonServer  # lazy: loads mlx``), or on the line
  just above it or above the run of import lines it stands in (one comment for a few imports).
  Reasons that count: an optional or heavy dependency, the tools' start-up time, a plugin seam. A module that
  would import back is not one: move the shared piece to a module both import (``mlxd_engine/errors.py``).
A subprocess then imports every tool module and checks that mlx was not loaded.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MLX = {"mlx", "mlx_lm"}
NEEDS_MLX = MLX | {"mlxd_engine", "mlxd_scheduler"}
SEAM_MODULE, SEAM_TARGET = "cli/mlxd_cli/local.py", "mlxd_daemon.local"
PROJECT_FOLDERS = ("packages", "daemon", "cli")  # each holds top-level packages
LAZY_MARK = "# lazy:"


@dataclass(frozen=True)
class Import:
    path: str  # relative to the repository root
    module: str  # absolute module name ("" for a relative import)
    names: tuple[str, ...]  # the names taken from it (from-imports)
    relative: bool
    in_function: bool
    level: int = 0  # the dots of a relative import
    line: int = 0
    type_checking: bool = False  # under ``if TYPE_CHECKING:``: never run


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, source: str | None = None) -> list[Import]:
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    found: list[Import] = []
    rel = str(path.relative_to(ROOT))

    def visit(node: ast.AST, in_function: bool, type_checking: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(
                Import(rel, alias.name, (), False, in_function, 0, node.lineno, type_checking) for alias in node.names
            )
        elif isinstance(node, ast.ImportFrom):
            names = tuple(alias.name for alias in node.names)
            module, level = node.module or "", node.level
            found.append(Import(rel, module, names, level > 0, in_function, level, node.lineno, type_checking))
        nested = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for part in node.body:
                visit(part, nested, True)
            for part in node.orelse:
                visit(part, nested, type_checking)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, nested, type_checking)

    visit(tree, False, False)
    return found


def modules_under(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def top(module: str) -> str:
    return module.split(".")[0]


def test_the_tools_never_import_mlx_nor_the_daemon_but_through_the_seam():
    wrong = []
    for path in modules_under("cli"):
        for imp in imports_of(path):
            if imp.relative:
                continue
            if imp.path == SEAM_MODULE and imp.module == SEAM_TARGET:
                if not imp.in_function:
                    wrong.append(f"{imp.path}: the seam import must be inside a function (it loads mlx)")
                continue
            if top(imp.module) in NEEDS_MLX | {"mlxd_daemon", "mlxd_drafters"}:
                wrong.append(f"{imp.path}: imports {imp.module}")
    assert not wrong, wrong


def test_the_daemon_never_imports_the_tools_nor_library_internals():
    wrong = []
    for path in modules_under("daemon"):
        for imp in imports_of(path):
            if imp.relative:
                continue
            if top(imp.module) == "mlxd_cli":
                wrong.append(f"{imp.path}: imports {imp.module}")
            library = top(imp.module) in {"mlxd_engine", "mlxd_scheduler", "mlxd_drafters"}
            if library and imp.module != top(imp.module):
                wrong.append(f"{imp.path}: imports the module {imp.module} (use the package's public names)")
            if library and any(name.startswith("_") for name in imp.names):
                wrong.append(f"{imp.path}: imports a private name from {imp.module}: {imp.names}")
    assert not wrong, wrong


def test_the_protocol_is_a_leaf_and_messages_never_imports_the_codec():
    allowed = set(sys.stdlib_module_names) | {"msgpack", "zmq"}
    wrong = [
        f"{imp.path}: imports {imp.module}"
        for path in modules_under("packages/mlxd_protocol")
        for imp in imports_of(path)
        if not imp.relative and top(imp.module) not in allowed
    ]
    assert not wrong, wrong
    messages = imports_of(ROOT / "packages/mlxd_protocol/messages.py")
    assert {imp.module for imp in messages if imp.relative} == {
        "codes",
        "field_checks",
        "request_checks",
        "sampling_rules",
        "values",
    }
    for leaf in ("codes", "field_checks", "request_checks", "sampling_rules", "values"):
        leaf_imports = imports_of(ROOT / f"packages/mlxd_protocol/{leaf}.py")
        assert {imp.module for imp in leaf_imports if imp.relative} <= {
            "codes",
            "field_checks",
            "request_checks",
            "sampling_rules",
        }, leaf


@pytest.mark.parametrize(
    "package, forbidden",
    [
        ("packages/mlxd_scheduler", MLX | {"mlxd_daemon", "mlxd_cli"}),
        ("packages/mlxd_drafters", MLX | {"mlxd_engine", "mlxd_scheduler", "mlxd_daemon", "mlxd_cli", "mlxd_protocol"}),
        ("packages/mlxd_engine", {"mlxd_scheduler", "mlxd_drafters", "mlxd_daemon", "mlxd_cli"}),
    ],
)
def test_libraries_import_only_downwards(package, forbidden):
    wrong = [
        f"{imp.path}: imports {imp.module}"
        for path in modules_under(package)
        for imp in imports_of(path)
        if not imp.relative and top(imp.module) in forbidden
    ]
    assert not wrong, wrong


def test_the_drafters_use_the_standard_library_only():
    wrong = [
        f"{imp.path}: imports {imp.module}"
        for path in modules_under("packages/mlxd_drafters")
        for imp in imports_of(path)
        if not imp.relative and top(imp.module) not in set(sys.stdlib_module_names) | {"mlxd_drafters"}
    ]
    assert not wrong, wrong


def test_gateway_routes_import_helpers_not_the_app_and_leave_app_state_to_the_context():
    folder = ROOT / "cli/mlxd_cli/serve_http"
    for route in ("openai_routes.py", "llama_routes.py"):
        assert not [imp for imp in imports_of(folder / route) if imp.relative and imp.module == "app"], route
    touching = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "state" and path.name != "context.py":
                touching.append(f"{path.name}:{node.lineno}")
    assert not touching, touching


def test_importing_every_tool_loads_no_mlx():
    modules = sorted(
        ".".join(p.relative_to(ROOT / "cli").with_suffix("").parts).removesuffix(".__init__")
        for p in modules_under("cli")
        if p.name != "__main__.py"
    )
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm', 'mlxd_engine', "
        "'mlxd_scheduler', 'mlxd_daemon')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout


def module_name(path: Path) -> str:
    """``packages/mlxd_engine/loading/loader.py`` -> ``mlxd_engine.loading.loader``; ``__init__`` -> the package."""
    for folder in PROJECT_FOLDERS:
        if path.is_relative_to(ROOT / folder):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    raise ValueError(path)


def project_modules() -> dict[str, Path]:
    return {module_name(path): path for path in modules_under(*PROJECT_FOLDERS)}


def imported_modules(imp: Import, importer: str, is_package: bool, known: dict[str, Path]) -> list[str]:
    """The project modules an import statement names (none for a third-party or standard module)."""
    base = imp.module
    if imp.relative:
        package = importer.split(".") if is_package else importer.split(".")[:-1]
        package = package[: len(package) - (imp.level - 1)]
        base = ".".join([*package, imp.module] if imp.module else package)
    if not imp.names:  # ``import a.b.c``: the deepest of its modules the project has
        parts = base.split(".")
        return next(([".".join(parts[:n])] for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in known), [])
    targets = []
    for name in imp.names:
        if f"{base}.{name}" in known:  # ``from pkg import mod``
            targets.append(f"{base}.{name}")
        elif base in known:
            targets.append(base)
    return list(dict.fromkeys(targets))


def import_graph() -> dict[str, set[str]]:
    known = project_modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for imp in imports_of(path):
            if imp.type_checking:
                continue
            for target in imported_modules(imp, name, path.name == "__init__.py", known):
                if target != name:
                    graph[name].add(target)
    return graph


def cycles_of(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle a depth-first search closes (one per back edge), each from its smallest module."""
    found: dict[tuple[str, ...], list[str]] = {}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt) :]
                start = cycle.index(min(cycle))
                cycle = cycle[start:] + cycle[:start]
                found.setdefault(tuple(cycle), cycle)
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return sorted(found.values())


def test_cycles_of_finds_a_cycle_and_ignores_a_dag():
    assert cycles_of({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles_of({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_relative_imports_resolve_to_the_modules_they_name():
    known = {name: Path() for name in ("p", "p.a", "p.b", "p.sub", "p.sub.c", "q")}
    rel = Import("x", "", ("a", "helper"), True, False, 1)
    assert imported_modules(rel, "p.sub.c", False, known) == ["p.sub"]
    assert imported_modules(rel, "p.b", False, known) == ["p.a", "p"]
    assert imported_modules(Import("x", "a", ("f",), True, False, 2), "p.sub.c", False, known) == ["p.a"]
    assert imported_modules(Import("x", "c", ("f",), True, False, 1), "p.sub", True, known) == ["p.sub.c"]
    assert imported_modules(Import("x", "p.sub.c.f", (), False, False), "q", False, known) == ["p.sub.c"]
    assert imported_modules(Import("x", "json", (), False, False), "q", False, known) == []


def test_imports_know_functions_and_type_checking():
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\nelse:\n    from .b import B\n"
        "def f():\n    from .c import C\n"
    )
    found = {imp.module: (imp.in_function, imp.type_checking) for imp in imports_of(ROOT / "x.py", source)}
    assert found == {"typing": (False, False), "a": (False, True), "b": (False, False), "c": (True, False)}


def test_the_engines_storage_never_imports_its_loading():
    known = project_modules()
    wrong = [
        f"{imp.path}:{imp.line}: imports {target}"
        for name, path in known.items()
        if name == "mlxd_engine.storage" or name.startswith("mlxd_engine.storage.")
        for imp in imports_of(path)
        for target in imported_modules(imp, name, path.name == "__init__.py", known)
        if target == "mlxd_engine.loading" or target.startswith("mlxd_engine.loading.")
    ]
    assert known.keys() >= {"mlxd_engine.storage.kv_storage", "mlxd_engine.loading.loader"}  # the rule bites
    assert not wrong, wrong


def test_no_import_cycle_among_the_projects_modules():
    cycles = cycles_of(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join([*cycle, cycle[0]]) for cycle in cycles)


def test_a_relative_import_inside_a_function_says_why():
    unexplained = []
    for path in modules_under(*PROJECT_FOLDERS):
        lines = path.read_text().splitlines()
        for imp in imports_of(path):
            if not (imp.relative and imp.in_function):
                continue
            same, above = lines[imp.line - 1], imp.line - 2
            while above >= 0 and lines[above].strip().startswith(("from ", "import ")):
                above -= 1  # the run of imports this one stands in
            if LAZY_MARK not in same and not (above >= 0 and lines[above].strip().startswith(LAZY_MARK)):
                unexplained.append(f"{imp.path}:{imp.line}: {same.strip()}")
    assert not unexplained, (
        f"relative imports inside functions without a '{LAZY_MARK} <why>' comment (move them to the top):\n"
        + "\n".join(unexplained)
    )
