"""The shape of the package: the runtime imports nothing from the compiler, and cmc's import
graph has no circle (so a stage can be read, and replaced, on its own)."""

from __future__ import annotations

import ast
import subprocess
import sys

from .conftest import ROOT

# What the runtime may load besides its own modules: the dependency-free contract modules,
# and the cubin reader (it imports only cmc.errors), with which load checks the launch
# bounds and parameter block of the cubins it is about to launch (runtime/launch_check.py).
RUNTIME_MAY_IMPORT = {"cmc", "cmc.abi", "cmc.contract", "cmc.errors", "cmc.kernels",
                      "cmc.cubin"}


def test_runtime_imports_nothing_from_the_compiler():
    code = ("import sys, cmc.runtime; "
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] == 'cmc')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.split()
    assert "cmc.runtime.loader" in loaded
    assert {m for m in loaded if not m.startswith("cmc.runtime")} <= RUNTIME_MAY_IMPORT


def _module_name(path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


def import_graph() -> dict[str, set[str]]:
    """Module -> the cmc modules it imports anywhere (function bodies too; not under
    TYPE_CHECKING). `from pkg import sub` counts as importing the submodule only."""
    files = {_module_name(p): p for p in (ROOT / "cmc").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(node.test)
                       for stmt in node.body for n in ast.walk(stmt)}
        deps: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom):
                parts = pkg.split(".")
                base = parts[:len(parts) - node.level + 1] if node.level else []
                mod = ".".join(base + ([node.module] if node.module else []))
                subs = {f"{mod}.{a.name}" for a in node.names} & files.keys()
                deps |= subs or ({mod} & files.keys())
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names} & files.keys()
        graph[name] = deps - {name}
    return graph


def test_import_graph_has_no_circle():
    graph = import_graph()
    assert graph["cmc.driver"] >= {"cmc.package", "cmc.emit"}  # the walk sees lazy imports
    done: set[str] = set()

    def visit(m: str, path: tuple[str, ...]) -> None:
        if m in path:
            raise AssertionError("import circle: " + " -> ".join(path[path.index(m):] + (m,)))
        if m in done:
            return
        for d in sorted(graph[m]):
            visit(d, path + (m,))
        done.add(m)

    for m in sorted(graph):
        visit(m, ())
