"""The test tree's layout: a test module imports helpers, never another test module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
TEST_MODULES = sorted(TESTS.rglob("test_*.py"))


def imported_test_modules(path: Path) -> list[str]:
    """The test modules (``test_*`` inside tests/) that ``path`` imports, or imports from."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            # A relative import stays inside tests/; spell it out as if from the top.
            base = ".".join(filter(None, ["tests" if node.level else "", node.module or ""]))
            # `from tests.inprocess import test_server` names the test module as an alias.
            modules = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        found += [
            m
            for m in modules
            if m.startswith("tests.") and m.rpartition(".")[2].startswith("test_")
        ]
    return found


def test_the_scan_sees_every_tier() -> None:
    tiers = {path.parent.name for path in TEST_MODULES}
    assert {"unit", "inprocess", "hardening", "multihost", "slurm"} <= tiers


@pytest.mark.parametrize(
    "source, imported",
    [
        ("from tests.inprocess.test_server import checked\n", ["tests.inprocess.test_server"]),
        ("from tests.inprocess import test_server\n", ["tests.inprocess.test_server"]),
        ("import tests.unit.test_cli\n", ["tests.unit.test_cli"]),
        (
            "def f():\n    from tests.inprocess.test_mdns import works\n",
            ["tests.inprocess.test_mdns"],
        ),
        ("from tests.support.ports import free_port\nfrom tests.fakes import FakeResolver\n", []),
    ],
)
def test_the_scan_finds_test_module_imports(
    tmp_path: Path, source: str, imported: list[str]
) -> None:
    path = tmp_path / "test_example.py"
    path.write_text(source)
    assert imported_test_modules(path) == imported


@pytest.mark.parametrize("path", TEST_MODULES, ids=lambda p: str(p.relative_to(TESTS)))
def test_no_test_module_imports_another(path: Path) -> None:
    imported = imported_test_modules(path)
    assert not imported, (
        f"{path.relative_to(TESTS)} imports {imported}: move the shared helper to "
        "tests/support/ (or the tier's conftest.py or harness) and import it from there"
    )


# --- no import circles among the package's modules ------------------------------------------

SRC = TESTS.parent / "src" / "rallypoint"


def rallypoint_imports(path: Path) -> set[str]:
    """The rallypoint modules a source file imports, type-checking-only imports included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "rallypoint":
                found |= {f"rallypoint.{alias.name}" for alias in node.names}
            elif node.module.startswith("rallypoint."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("rallypoint.")}
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_imports_itself_back_through_others() -> None:
    graph = {module_name(p): rallypoint_imports(p) for p in SRC.rglob("*.py")}
    circles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        for target in sorted(graph.get(module, ())):
            if target == path[0]:
                circles.append([*path, target])
            elif target not in path and target in graph and len(path) < 6:
                visit(target, [*path, target])

    for module in ("rallypoint.names", "rallypoint.settings", "rallypoint.tfconfig"):
        visit(module, [module])
    assert not circles, f"import circles: {circles[:3]}"
