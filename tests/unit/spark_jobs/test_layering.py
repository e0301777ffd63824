"""The job's import graph: each unit imports only the units below it, and no module imports itself back.

The units are Delta's own (statement, storage, protocol, analysis, scan, source, write, merge, commit,
uniform), plus the root's modules: the basics every unit may import, the delta engine (Delta's own MERGE,
beside the pipeline), the contract between them, and the entry points that import everything. Every import
counts: module level, inside functions and under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
from pathlib import Path

JOB = Path(__file__).resolve().parents[3] / "spark_jobs" / "delta_merge"
PREFIX = "spark_jobs.delta_merge"

# Lowest first. A unit is a package of the job or a module at its root.
LAYERS: list[set[str]] = [
    {"errors", "metrics", "field_checks", "stage_timing", "spark_confs", "expectations", "session_facts",
     "task_frames", "sql_names"},
    {"statement"},
    {"spec"},
    {"storage"},
    {"protocol"},
    {"analysis"},
    {"scan"},
    {"source"},
    {"write"},
    {"merge"},
    {"commit"},
    {"uniform"},
    {"delta_engine"},
    {"contract", "pipeline", "__main__", "__init__"},
]
LAYER_OF = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    parts = path.relative_to(JOB).with_suffix("").parts
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join((PREFIX, *parts)) if parts != ("__init__",) else PREFIX


def unit_of(module: str) -> str:
    rest = module[len(PREFIX) + 1 :] if module != PREFIX else "__init__"
    return rest.split(".")[0]


def job_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(JOB.rglob("*.py"))}


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The job's modules that ``path`` imports (``from X import name`` counts as ``X.name`` where that is
    a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith(PREFIX))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PREFIX):
            assert node.level == 0, f"{path}: relative import; the job imports absolutely"
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in modules else node.module)
    return found & modules


def import_graph() -> dict[str, set[str]]:
    modules = job_modules()
    return {name: imports_of(path, set(modules)) - {name} for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_unit_of_the_job_has_a_layer() -> None:
    units = {unit_of(module) for module in job_modules()}
    assert units - set(LAYER_OF) == set(), "give each new package or root module its place in LAYERS"
    assert set(LAYER_OF) - units == set(), "LAYERS names a unit the job no longer has"


def test_no_unit_imports_a_unit_above_it() -> None:
    upward = [
        f"{source} ({unit_of(source)}) imports {target} ({unit_of(target)})"
        for source, targets in sorted(import_graph().items())
        for target in sorted(targets)
        if LAYER_OF[unit_of(target)] > LAYER_OF[unit_of(source)]
    ]
    assert upward == []


def test_the_job_has_no_import_circles() -> None:
    assert cycles(import_graph()) == []


def test_the_checker_finds_a_circle_and_an_upward_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert unit_of(f"{PREFIX}.protocol.snapshot") == "protocol"
    assert LAYER_OF["protocol"] < LAYER_OF["merge"]
