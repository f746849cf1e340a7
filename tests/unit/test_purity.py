"""The pure core imports no I/O library, not even transitively."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PURE = [
    "rallypoint.model",
    "rallypoint.errors",
    "rallypoint.settings",
    "rallypoint.providers",
    "rallypoint.derive",
    "rallypoint.tfconfig",
    "rallypoint.render",
    "rallypoint.wire",
    "rallypoint.mdns.txt",
    "rallypoint.mdns.ranks",
    "rallypoint.lifecycle",
    "rallypoint.reasons",
    "rallypoint.hostfile",
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
    out = subprocess.run(
        [sys.executable, "-I", "-c", PROBE, json.dumps(names), json.dumps(FORBIDDEN)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
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
    assert any(name.startswith("rallypoint.providers.") for name in result["loaded"])


def test_the_probe_detects_an_io_import() -> None:
    # The probe must be able to fail: a transitive I/O import (http.client -> socket) is caught.
    assert "socket" in _probe(["http.client"])["after"]
