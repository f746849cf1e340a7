"""A port thief on the master node: the published MASTER_PORT is never one it holds."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.cluster.build import Cluster
from tests.support.cluster.procs import read_json_file
from tests.support.netns import wait_for

pytestmark = pytest.mark.multihost

READY_S = 30.0
PREFERRED = 29500


@pytest.mark.parametrize("head_start", [True, False], ids=["thief-first", "thief-racing"])
def test_published_master_port_is_never_held_by_the_thief(
    cluster: Cluster, tmp_path: Path, head_start: bool
) -> None:
    master = cluster["main1"]
    out = tmp_path / "thief.json"
    # The preferred port and its neighbours at once, then one more port of the search range
    # every 100 ms while the master reserves; after each step the thief also tries whatever
    # MASTER_PORT the master serves, so a published-but-unheld port would end up stolen.
    thief = master.start_port_thief(
        out,
        first=range(PREFERRED, PREFERRED + 5),
        then=range(PREFERRED + 5, PREFERRED + 60),
        interval_s=0.1,
    )
    if head_start:
        wait_for(lambda: read_json_file(out), timeout_s=10.0, what="thief up")
    cluster.start_all(["--port-range", f"{PREFERRED}-{PREFERRED + 200}"])
    served = cluster.wait_all_ready(READY_S)
    master_port = int(served["main1"]["MASTER_PORT"])
    assert {env["MASTER_PORT"] for env in served.values()} == {str(master_port)}

    # Give the thief time to go after the published port.
    wait_for(
        lambda: master_port in (read_json_file(out) or {}).get("tried", []),
        timeout_s=10.0, what=f"thief to try port {master_port}",
    )  # fmt: skip
    time.sleep(0.5)
    thief.stop()
    state = read_json_file(out)

    assert thief.returncode == 0, thief.log()
    assert master_port not in state["held"], state
    assert master_port in state["tried"], state
    if head_start:
        assert PREFERRED in state["held"], state  # the contest was real
        assert master_port != PREFERRED
    held_by_master = master.status()["ports"]["master"]
    assert held_by_master["port"] == master_port and held_by_master["held"] is True
