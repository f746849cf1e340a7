"""The tiers that run real mDNS in the test process bind it to loopback, never everywhere.

The compose and multi-host tiers create and remove bridges and Docker networks beside them;
a zeroconf bound to every interface sends on those too, and a goodbye sent while an
interface goes away fails with "Network is unreachable" and never arrives. So every
announcer, browser and sidecar with mDNS in these tiers names its interfaces.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
#: The tiers whose mDNS runs on the host's own interfaces (the multi-host tier's runs inside
#: its namespaces, on its own bridge).
HOST_TIERS = ("inprocess", "hardening", "support")
#: Calls that open zeroconf, and the keyword that chooses its interfaces.
OPENERS = {"Mdns": "interfaces", "AsyncZeroconf": "interfaces", "Zeroconf": "interfaces"}
#: Calls that build a sidecar's settings, where ``mdns=True`` needs ``mdns_interfaces``
#: (tests/hardening/serve.py's Serve pins RALLYPOINT_MDNS_INTERFACES itself).
SETTINGS = {"fast_settings", "Settings", "start_node"}


def unbound_openers(path: Path, root: Path = TESTS) -> list[str]:
    """``file:line call`` for each zeroconf opened without naming its interfaces, and each
    settings call that turns mDNS on without ``mdns_interfaces``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        keywords = {k.arg for k in node.keywords}
        if None in keywords:
            continue  # **kwargs: not decidable here, and not used for these calls
        if name in OPENERS and OPENERS[name] not in keywords:
            found.append(f"{path.relative_to(root)}:{node.lineno} {name}")
        mdns_on = name in SETTINGS and any(
            k.arg == "mdns" and isinstance(k.value, ast.Constant) and k.value.value is True
            for k in node.keywords
        )
        if mdns_on and "mdns_interfaces" not in keywords:
            found.append(f"{path.relative_to(root)}:{node.lineno} {name}(mdns=True)")
    return found


@pytest.mark.parametrize("tier", HOST_TIERS)
def test_every_zeroconf_in_the_host_tiers_names_its_interfaces(tier: str) -> None:
    found = [hit for path in sorted((TESTS / tier).rglob("*.py")) for hit in unbound_openers(path)]
    assert found == [], found


def test_the_check_finds_an_unbound_announcer(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "Mdns(session='s', host='h', peer_port=1, auth=a)\n"
        "Mdns(session='s', host='h', peer_port=1, auth=a, interfaces=['127.0.0.1'])\n"
        "fast_settings(mdns=True)\n"
        "fast_settings(mdns=True, mdns_interfaces=('127.0.0.1',))\n"
    )
    assert unbound_openers(probe, tmp_path) == [
        "probe.py:1 Mdns",
        "probe.py:3 fast_settings(mdns=True)",
    ]
