"""The house: every module sits in a layer that imports only downwards, no import circle, no import of the
repository's development tools (``tools/``) or benchmarks, and the cluster adapter
holds only what a cluster run loads (what only a CPU rehearsal needs lives in ``dapo_verl/rehearsal/``, its
bridges in ``dapo_verl/rehearsal/bridges/``).

Imports are read from the source (every ``import`` statement, those inside functions and under ``TYPE_CHECKING``
included), so a lazy import counts as much as a module-level one.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dapo_verl"

LAYERS = [  # an import may go to the same layer or one below, never up
    {"core"},
    {"", "config", "files", "state_io", "lifetime"},
    {"sampler", "preflight", "data", "report", "toy"},
    {"local", "adapter"},
    {"rehearsal"},
    {"doctor", "main"},
    {"cli", "cli_errors", "cli_rehearse"},
]


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    return modules


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    """Every dapo_verl module ``path`` imports (a name imported from a package counts when it is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dapo_verl"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("dapo_verl"))
    return {name for name in found if name in MODULES}


GRAPH = {name: _imports(path) - {name} for name, path in MODULES.items()}


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for rank, members in enumerate(LAYERS):
        if top in members:
            return rank
    raise AssertionError(f"{module} is in no layer of this test; add its package to LAYERS")


def test_every_import_goes_down_or_across_never_up():
    upward = [
        f"{module} (layer {_layer(module)}) imports {target} (layer {_layer(target)})"
        for module, targets in GRAPH.items()
        for target in sorted(targets)
        if _layer(target) > _layer(module)
    ]
    assert not upward, "\n".join(upward)


def _top_level_imports(path: Path) -> set[str]:
    """The top-level package of every absolute import in ``path``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_the_package_imports_no_development_tool_or_benchmark():
    # tools/ (checks, generators, fakes) and benchmarks/ live beside the package and are not in the wheel
    outside = sorted(
        f"{name} imports {top}"
        for name, path in MODULES.items()
        for top in _top_level_imports(path)
        if top in ("tools", "benchmarks")
    )
    assert not outside, outside


def test_no_import_circle():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert not circles, circles


def _loaded_by_name() -> set[str]:
    """Adapter modules verl loads by name: the entry point and every ``dapo_verl.adapter.*`` path the configs give."""
    names = set(re.findall(r"dapo_verl\.adapter\.\w+", (ROOT / "pyproject.toml").read_text()))
    for config in (PACKAGE / "configs").rglob("*.yaml"):
        names.update(re.findall(r"dapo_verl\.adapter\.\w+", config.read_text()))
    return {name for name in names if name in MODULES}


def test_the_cluster_adapter_holds_only_what_a_cluster_run_loads():
    roots = _loaded_by_name() | {"dapo_verl.main"}
    assert {"dapo_verl.adapter.register", "dapo_verl.adapter.v1_sampler", "dapo_verl.adapter.verl_config"} <= roots
    reached, todo = set(), list(roots)
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo.extend(GRAPH[module])
    unused = sorted(m for m in MODULES if m.startswith("dapo_verl.adapter.") and m not in reached)
    assert not unused, f"adapter modules no cluster run loads (move them beside the rehearsal): {unused}"


@pytest.mark.parametrize("entry", ["dapo_verl.adapter.register", "dapo_verl.adapter.v1_sampler", "dapo_verl.main"])
def test_importing_what_a_cluster_run_loads_imports_nothing_of_the_rehearsal(entry):
    code = f"""
        import importlib, json, sys
        importlib.import_module({entry!r})
        print(json.dumps(sorted(m for m in sys.modules if m.startswith(("dapo_verl.rehearsal", "dapo_verl.local")))))
        """
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("module", ["dapo_verl.lifetime", "dapo_verl.rehearsal.reaper"])
def test_what_runs_under_python_minus_i_minus_s_imports_the_standard_library_only(module):
    # The watchdog runs reaper.py as a script under `python -I -S`, with no site-packages; lifetime's parent-death
    # wrapper is as small. Any third-party or dapo_verl import there would fail only once a command is killed.
    roots = {
        (node.module or "").split(".")[0] if isinstance(node, ast.ImportFrom) else alias.name.split(".")[0]
        for node in ast.walk(ast.parse(MODULES[module].read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom) and not (isinstance(node, ast.ImportFrom) and node.level)
        for alias in node.names
    }
    assert roots <= set(sys.stdlib_module_names) | {"__future__"}, sorted(roots - set(sys.stdlib_module_names))


def test_the_file_writer_imports_the_standard_library_only():
    # The data package (pyarrow, no torch) writes through it too.
    roots = {
        (node.module or "").split(".")[0] if isinstance(node, ast.ImportFrom) else alias.name.split(".")[0]
        for node in ast.walk(ast.parse(MODULES["dapo_verl.files"].read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert roots <= set(sys.stdlib_module_names) | {"__future__"}, sorted(roots - set(sys.stdlib_module_names))
