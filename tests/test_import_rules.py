"""The layers as the imports really are (docs/architecture.md, "Layers"), checked on every module's syntax tree.

Every import statement counts, at module level or inside a function. The rules:
- the tools (cli/) never import mlx, mlx-lm or a package that does (engine, scheduler, drafters' users),
  and never the daemon, except the one seam: ``mlxd_cli/local.py`` imports ``mlxd_daemon.local``, inside a
  function (mlx-generate --local);
- the daemon never imports the tools, and reaches the engine, scheduler and drafters through their
  packages' public names, not their modules (the engine's model-loading modules excepted, below);
- the protocol imports only the standard library, msgpack and pyzmq; ``messages`` nothing of the codec;
- the scheduler and the drafters never import mlx; the drafters only the standard library;
- the HTTP gateway's routes import helpers, never the app, and only ``context`` touches ``app.state``.
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


@dataclass(frozen=True)
class Import:
    path: str  # relative to the repository root
    module: str  # absolute module name ("" for a relative import)
    names: tuple[str, ...]  # the names taken from it (from-imports)
    relative: bool
    in_function: bool


def imports_of(path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            rel = str(path.relative_to(ROOT))
            if isinstance(child, ast.Import):
                found.extend(Import(rel, alias.name, (), False, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                names = tuple(alias.name for alias in child.names)
                found.append(Import(rel, child.module or "", names, child.level > 0, in_function))
            visit(child, nested)

    visit(tree, False)
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
    assert {imp.module for imp in messages if imp.relative} == {"field_checks", "sampling_rules"}


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
