"""Faults in the middle of a session: the master crashes and returns, a link goes dark."""

from __future__ import annotations

import errno
import sys
import time
from functools import partial

import pytest

from tests.support.cluster.build import Cluster, MakeCluster
from tests.support.cluster.nodes import Node
from tests.support.netns import wait_for

pytestmark = pytest.mark.multihost

READY_S = 30.0


@pytest.mark.parametrize("port_taken", [False, True], ids=["old-port-free", "old-port-taken"])
def test_master_killed_and_restarted_gives_a_new_generation(
    cluster: Cluster, port_taken: bool
) -> None:
    cluster.start_all()
    before = cluster.wait_all_ready(READY_S)
    old_generation = before["main1"]["RALLYPOINT_GENERATION"]
    old_port = int(before["main1"]["MASTER_PORT"])
    master, sub1, sub2 = cluster["main1"], cluster["sub1"], cluster["sub2"]

    master.kill_sidecar()
    # Workers notice at once (their long-poll breaks) and say so; they keep serving the
    # last verified env meanwhile, since the training processes may well still be running.
    for worker in (sub1, sub2):
        wait_for(
            partial(_reports_lost_master, worker), timeout_s=10.0,
            what=f"{worker.name} to report the lost master", describe=worker.describe,
        )  # fmt: skip
    # Keep sub2 away while the master comes back, so that the new rendezvous cannot finish
    # and sub1's passage through "not ready" is observable, not a millisecond blip.
    sub2.link_down()
    if port_taken:
        # Something else took the old port while the master was down: a plain bind holder.
        holder = master.spawn([sys.executable, "-c", _HOLD_PORT, str(old_port)], label="holder")
        wait_for(
            lambda: master.try_bind(old_port) == errno.EADDRINUSE,
            timeout_s=10.0, what=f"holder on port {old_port}",
        )  # fmt: skip
    master.start_sidecar()

    sub1.wait_not_ready(15.0)
    assert sub1.env() is None
    sub2.link_up()
    after = cluster.wait_all_ready(READY_S)

    generations = {env["RALLYPOINT_GENERATION"] for env in after.values()}
    ports = {env["MASTER_PORT"] for env in after.values()}
    assert len(generations) == 1 and old_generation not in generations, (old_generation, after)
    assert len(ports) == 1, after
    new_port = int(ports.pop())
    assert master.status()["ports"]["master"]["port"] == new_port
    if port_taken:
        assert new_port != old_port
        assert holder.alive()


def _reports_lost_master(worker: Node) -> bool:
    problem = worker.status().get("master_problem") or {}
    return bool(problem.get("host") == "main1")


_HOLD_PORT = """
import socket, sys, time
s = socket.socket()
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen()
time.sleep(300)
"""


def test_link_cut_during_rendezvous_recovers(cluster: Cluster) -> None:
    late = cluster["sub2"]
    late.link_down()
    cluster.start_all()
    time.sleep(3.0)  # the rendezvous is under way without sub2
    for node in cluster:
        assert not node.is_ready(), f"{node.name} ready while sub2 is cut off"
    late.link_up()
    served = cluster.wait_all_ready(READY_S)
    assert len({env["RALLYPOINT_GENERATION"] for env in served.values()}) == 1


def test_link_cut_beyond_the_deadline_fails_with_a_clear_reason(
    make_cluster: MakeCluster,
) -> None:
    deadline_s = 4.0
    cluster = make_cluster(args=["--deadline", str(deadline_s)])
    late, master = cluster["sub2"], cluster["main1"]
    late.link_down()
    start = time.monotonic()
    cluster.start_all()

    def expired(node: Node) -> list[dict[str, object]] | None:
        reasons = node.not_ready_reasons()
        codes = {reason.get("code") for reason in reasons or []}
        return reasons if "deadline_exceeded" in codes else None

    late_reasons = wait_for(
        lambda: expired(late), timeout_s=deadline_s + 15.0, what="sub2 past its deadline",
        describe=late.describe,
    )  # fmt: skip
    assert time.monotonic() - start >= deadline_s
    # The node that was cut off says which peer it could not reach ...
    assert any(r.get("host") == "main1" and r.get("code") != "deadline_exceeded"
               for r in late_reasons), late_reasons  # fmt: skip
    # ... and the master says who never joined.
    master_reasons = wait_for(
        lambda: expired(master), timeout_s=10.0, what="main1 past its deadline",
        describe=master.describe,
    )  # fmt: skip
    assert any("sub2" in str(r.get("message")) for r in master_reasons), master_reasons
    assert not any(node.is_ready() for node in cluster)

    late.link_up()  # the sidecars keep retrying after the deadline: a late repair still works
    cluster.wait_all_ready(READY_S)
