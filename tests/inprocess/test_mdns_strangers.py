"""The mDNS tests pass while strangers announce on the same loopback.

A person who runs the suite may have a `rallypoint serve` of their own on the host (the
README invites a single-node sidecar), and other software announces too. Every test that
uses real mDNS runs in a fresh session and asserts only about its own instances; this test
proves it by running them beside a foreign sidecar and raw announcers of every kind of
record a listener refuses.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.env import child_env
from tests.support.mdns import LOOPBACK_MDNS_TESTS, rogues
from tests.support.ports import free_port

#: Starts the product's processes: no machine-measuring test runs beside it (conftest.py).
pytestmark = pytest.mark.starts_processes

REPO = Path(__file__).resolve().parents[2]
#: Every test module that announces or browses with real mDNS on loopback.
MDNS_TESTS = LOOPBACK_MDNS_TESTS
RUN_BOUND_S = 600.0


def mdns_status(port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as resp:
        status = json.load(resp)
    mdns = status["mdns"]
    assert isinstance(mdns, dict)
    return mdns


@pytest.fixture
def foreign_sidecar(multicast_lo: None, tmp_path: Path) -> Iterator[int]:
    """A user's own `rallypoint serve` as the README starts it (single node, mDNS on), kept
    to loopback; yields its local API port once it announces."""
    local = free_port()
    env = {
        **child_env(),
        "RALLYPOINT_LOCAL_HOSTS": "127.0.0.1",
        "RALLYPOINT_LOCAL_PORT": str(local),
        "RALLYPOINT_PEER_HOST": "127.0.0.1",
        "RALLYPOINT_PEER_PORT": str(free_port()),
        "RALLYPOINT_MDNS_INTERFACES": "127.0.0.1",
        "RALLYPOINT_TF_PORT": str(free_port()),
        "MASTER_PORT": str(free_port()),
        "RALLYPOINT_TOKEN": "the-users-own-secret",
    }
    log = (tmp_path / "foreign.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rallypoint", "serve"], env=env, stdout=log, stderr=log
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (tmp_path / "foreign.log").read_text()
            try:
                if mdns_status(local).get("available"):
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the foreign sidecar did not start"
            time.sleep(0.1)
        yield local
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


async def test_the_mdns_tests_pass_beside_a_foreign_sidecar_and_rogue_announcers(
    foreign_sidecar: int, tmp_path: Path
) -> None:
    strangers = [
        {"session": "someone-else", "host": "their-node", "rank": "0"},  # another session
        {"v": "9", "junk": "x" * 40},  # a record no rallypoint writes: malformed
        {},  # an empty record
    ]
    before = mdns_status(foreign_sidecar)
    async with rogues(*strangers):
        env = {**child_env(), "PYTHONPATH": str(REPO)}
        if os.environ.get("CI"):
            env["CI"] = os.environ["CI"]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *MDNS_TESTS,
            cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), RUN_BOUND_S)
    report = out.decode(errors="replace")
    (tmp_path / "mdns-tests.log").write_text(report)
    assert proc.returncode == 0, report[-4000:]
    assert " passed" in report and " skipped" not in report, report[-2000:]
    # The medium was shared: the foreign sidecar heard the tests' own sessions and refused them.
    after = mdns_status(foreign_sidecar)
    assert int(str(after["rejected"])) > int(str(before["rejected"])), after
