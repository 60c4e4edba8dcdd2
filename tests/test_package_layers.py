"""The package's layers, read from its imports: the core has no Dagster imports, no two packages
of the product import each other (directly or round a longer cycle), the product never imports its
tools (compaction_tools), and no product module outgrows the size a reader can hold."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ROOT / "compaction_assets"
CORE = ("lake", "planning", "execution", "commit", "maintenance", "iceberg_compat")
MAX_LINES = 500  # a module past this holds more than one concern: split it along its seams


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def _unit(path: Path) -> str:
    """A product module's unit of layering: its subpackage (lake, commit, ...) or top-level module."""
    return path.relative_to(PRODUCT).parts[0].removesuffix(".py")


def _modules() -> list[Path]:
    return sorted(p for p in PRODUCT.rglob("*.py") if "__pycache__" not in p.parts)


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in _modules():
        unit = _unit(path)
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "compaction_assets" and len(parts) > 1 and parts[1] != unit:
                graph.setdefault(unit, set()).add(parts[1])
    return graph


@pytest.mark.parametrize("package", CORE)
def test_the_core_imports_no_dagster(package: str) -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted((PRODUCT / package).rglob("*.py"))
        for name in _imports(path)
        if name.split(".")[0] in ("dagster", "dagster_pyspark", "dagster_shared")
    ]
    assert not offenders, offenders


def test_no_cycle_between_the_products_packages() -> None:
    graph = _graph()
    state: dict[str, str] = {}  # unit -> "open" while on the path, "done" after

    def visit(unit: str, path: list[str]) -> None:
        state[unit] = "open"
        for nxt in sorted(graph.get(unit, ())):
            if state.get(nxt) == "open":
                cycle = [*path[path.index(nxt) :], nxt]
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[unit] = "done"

    for unit in sorted(graph):
        if unit not in state:
            visit(unit, [unit])


def test_the_product_never_imports_its_tools() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in _modules()
        for name in _imports(path)
        if name.split(".")[0] == "compaction_tools"
    ]
    assert not offenders, offenders


def test_no_product_module_is_over_the_size_a_reader_holds() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in _modules()}
    assert not {p: n for p, n in sizes.items() if n > MAX_LINES}
