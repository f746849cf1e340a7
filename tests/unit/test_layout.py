"""The test tree's layout: a test module imports helpers, never another test module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.layers import (
    COMPOSERS,
    IO_PACKAGES,
    MAX_TOP_MODULES,
    PURE_PACKAGES,
    RENDEZVOUS_ROOMS,
    RENDEZVOUS_SHARED,
    WINGS,
    top_modules,
)

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


def is_module(name: str) -> bool:
    """Whether the dotted name is a module or package of src/rallypoint."""
    path = SRC.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def rallypoint_imports(path: Path) -> set[str]:
    """The rallypoint modules a source file imports, type-checking-only imports included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "rallypoint" or node.module.startswith("rallypoint."):
                # `from rallypoint.cli import output` imports the module cli/output.py.
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    found.add(sub if is_module(sub) else node.module)
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

    for module in sorted(graph):
        visit(module, [module])
    assert not circles, f"import circles: {circles[:3]}"


# --- the layers of docs/architecture.md, as the folders show them --------------------------

ARCHITECTURE = TESTS.parent / "docs" / "architecture.md"


def layers_picture() -> str:
    """The first code block under docs/architecture.md's "## Layers"."""
    text = ARCHITECTURE.read_text().split("## Layers", 1)[1]
    return text.split("```", 2)[1]


def test_every_top_level_module_and_package_has_its_place_in_the_layers_picture() -> None:
    words = set(layers_picture().replace(",", " ").replace("/", " ").split())
    top = {p.stem for p in SRC.glob("*.py")} | {p.name for p in SRC.iterdir() if p.is_dir()}
    top -= {"__init__", "__main__", "__pycache__"}
    missing = sorted(top - words)
    assert not missing, f"docs/architecture.md's layers picture does not place {missing}"


BELOW_THE_WINGS = sorted(
    [p for p in SRC.glob("*.py") if p.stem not in COMPOSERS]
    + [
        p
        for package in PURE_PACKAGES + IO_PACKAGES
        if package not in WINGS
        for p in (SRC / package).glob("*.py")
    ]
)


def test_the_floors_below_the_wings_are_scanned() -> None:
    # The scan must be able to fail: it holds a module of every floor.
    scanned = {p.parent.name for p in BELOW_THE_WINGS}
    assert {"rallypoint", "core", "wire", "served", "net"} <= scanned


@pytest.mark.parametrize("path", BELOW_THE_WINGS, ids=lambda p: str(p.relative_to(SRC)))
def test_the_floors_below_the_wings_import_no_wing(path: Path) -> None:
    wings = tuple(f"rallypoint.{wing}" for wing in WINGS)
    found = sorted(m for m in rallypoint_imports(path) if m.startswith(wings))
    assert not found, (
        f"{path.relative_to(SRC)} imports {found}: only the wings and sidecar build on them"
    )


def test_at_most_ten_modules_sit_loose_at_the_top() -> None:
    loose = top_modules()
    assert len(loose) <= MAX_TOP_MODULES, (
        f"{len(loose)} modules at the top of src/rallypoint ({sorted(loose)}): "
        "move each into the package of its concern (docs/architecture.md)"
    )


RENDEZVOUS = sorted((SRC / "rendezvous").rglob("*.py"))


def rendezvous_id(path: Path) -> str:
    return str(path.relative_to(SRC / "rendezvous"))


@pytest.mark.parametrize("path", RENDEZVOUS, ids=rendezvous_id)
def test_the_rendezvous_imports_no_other_wing(path: Path) -> None:
    others = tuple(f"rallypoint.{wing}" for wing in WINGS if wing != "rendezvous")
    found = sorted(m for m in rallypoint_imports(path) if m.startswith(others))
    assert not found, f"rendezvous/{rendezvous_id(path)} imports {found}"


def test_the_rendezvous_rooms_are_all_scanned() -> None:
    rooms = {p.parent.name for p in RENDEZVOUS if p.parent.name != "rendezvous"}
    assert rooms == set(RENDEZVOUS_ROOMS), "a new room of rendezvous/: give it its arrows"


@pytest.mark.parametrize("path", RENDEZVOUS, ids=rendezvous_id)
def test_each_rendezvous_room_imports_only_the_rooms_below_it(path: Path) -> None:
    room = path.parent.name
    inner = {m.split(".")[2] for m in all_imports(path) if m.startswith("rallypoint.rendezvous.")}
    if room == "rendezvous":  # the composer (node) and what it serves: any room
        return
    allowed = {room, *RENDEZVOUS_ROOMS[room], *RENDEZVOUS_SHARED}
    assert inner <= allowed, (
        f"rendezvous/{rendezvous_id(path)} imports {sorted(inner - allowed)}: "
        "a room imports only the rooms below it and the shared modules (docs/architecture.md)"
    )


def all_imports(path: Path) -> set[str]:
    """Every module a source file imports by absolute name, anywhere in it (type-checking
    imports and imports inside functions included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


@pytest.mark.parametrize("path", sorted((SRC / "core").glob("*.py")), ids=lambda p: p.name)
def test_core_is_the_floor_it_imports_no_wire_net_or_asyncio(path: Path) -> None:
    above = ("rallypoint.wire", "rallypoint.net", "asyncio", "aiohttp")
    found = sorted(m for m in all_imports(path) if m == "rallypoint" or m.startswith(above))
    assert not found, f"core/{path.name} imports {found}: core is the floor (docs/architecture.md)"


def test_the_floor_scan_can_fail(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    import asyncio\n    from rallypoint.wire import fields\n")
    assert {"asyncio", "rallypoint.wire"} <= all_imports(planted)


#: The size a module, a function and the performance reference are held to (#47's figures).
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
DOCS = TESTS.parent / "docs"


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_no_module_over_400_lines_nor_a_function_over_60(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{path.name}: move code out first"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            assert length <= MAX_FUNCTION_LINES, f"{path.name}: {node.name} is {length} lines"


def test_the_performance_reference_stays_a_reference() -> None:
    lines = len((DOCS / "performance.md").read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"docs/performance.md has {lines} lines: the history is git's"
