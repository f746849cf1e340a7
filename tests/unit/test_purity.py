"""The pure core imports no I/O library, not even transitively."""

from __future__ import annotations

import ast
import json

import pytest

from tests.support.commands import python
from tests.support.layers import (
    IO_PACKAGES,
    PURE_MDNS,
    PURE_PACKAGES,
    PURE_SHARED,
    SRC,
    WINGS,
    packages,
)

PURE = [
    *(f"rallypoint.{name}" for name in PURE_SHARED + PURE_MDNS),
    *(f"rallypoint.{package}" for package in PURE_PACKAGES),
]
FORBIDDEN = ["asyncio", "socket", "aiohttp", "zeroconf"]

# Imports each pure module (and every module of providers/) in a fresh interpreter and
# reports which forbidden modules ended up in sys.modules.
PROBE = """
import importlib, json, pkgutil, sys
names = json.loads(sys.argv[1])
forbidden = json.loads(sys.argv[2])
before = {name for name in forbidden if name in sys.modules}
loaded = []
for name in names:
    module = importlib.import_module(name)
    loaded.append(name)
    if hasattr(module, "__path__"):
        for info in pkgutil.iter_modules(module.__path__, name + "."):
            importlib.import_module(info.name)
            loaded.append(info.name)
print(json.dumps({
    "before": sorted(before),
    "after": sorted(name for name in forbidden if name in sys.modules),
    "loaded": loaded,
}))
"""


def _probe(names: list[str]) -> dict[str, list[str]]:
    out = python("-I", "-c", PROBE, json.dumps(names), json.dumps(FORBIDDEN), check=True).stdout
    result: dict[str, list[str]] = json.loads(out)
    return result


def test_interpreter_starts_without_the_forbidden_modules() -> None:
    # Guards the main test: if a fresh interpreter already held one, it would prove nothing.
    assert _probe([])["before"] == []


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_no_io(module: str) -> None:
    result = _probe([module])
    assert result["after"] == [], f"{module} pulls in {result['after']}"


def test_all_pure_modules_together_import_no_io() -> None:
    result = _probe(PURE)
    assert result["after"] == []
    # The probe walks each pure package: every module file in it was imported.
    for package in PURE_PACKAGES:
        files = {
            f"rallypoint.{package}.{path.stem}"
            for path in (SRC / package).glob("*.py")
            if path.stem != "__init__"
        }
        assert files and files <= set(result["loaded"]), package


def test_the_pure_packages_are_the_floor_the_architecture_draws() -> None:
    # A new package must be placed on a floor (tests/support/layers.py).
    assert packages() == set(PURE_PACKAGES) | set(IO_PACKAGES) | set(WINGS)


def test_the_probe_detects_an_io_import() -> None:
    # The probe must be able to fail: a transitive I/O import (http.client -> socket) is caught.
    assert "socket" in _probe(["http.client"])["after"]


def _importers(library: str) -> set[str]:
    """The modules under src/rallypoint that import ``library`` or one of its submodules."""
    found = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module is not None and not node.level:
                names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            else:
                continue
            if any(name == library or name.startswith(f"{library}.") for name in names):
                found.add(path.relative_to(SRC).as_posix())
    return found


@pytest.mark.parametrize(
    ("library", "package", "known"),
    [
        ("aiohttp.web", "server/", "server/__init__.py"),
        ("click", "cli/", "cli/commands.py"),
        ("zeroconf", "mdns/", "mdns/announce.py"),
        ("prometheus_client", "metrics.py", "metrics.py"),
    ],
)
def test_one_package_imports_each_framework(library: str, package: str, known: str) -> None:
    # One adapter per library: the rest of the code runs without it.
    importers = _importers(library)
    # The scan must be able to fail: the adapter package itself is found.
    assert known in importers
    assert {name for name in importers if not name.startswith(package)} == set()
