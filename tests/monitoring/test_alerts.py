"""Debian's Prometheus scrapes a namespace cluster's metrics listeners with the shipped rules.

The rules are the shipped ones, `for` included: the peer-down alert waits its real 30 s,
which the bound below adds to the sidecar's own 4 keep-alive intervals, one scrape and one
evaluation (slack for a loaded machine on top; the waits stop the test, they time nothing
else).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

from tests.monitoring import prom
from tests.monitoring.conftest import KEEPALIVE_S, METRICS_PORT, TOKEN, MakeMonitored
from tests.support.cluster.netio import Reply, http_get
from tests.support.cluster.nodes import Node
from tests.support.commands import run
from tests.support.netns import wait_for

pytestmark = pytest.mark.monitoring

HOSTS = ("sub1", "main1", "sub2")
READY_S = 40.0
#: The peer-down rule's `for`, as shipped.
PEER_DOWN_FOR_S = 30.0
#: Named down after 4 silent intervals, heard of within one more.
NAMED_S = 5 * KEEPALIVE_S
SLACK_S = 15.0


def settle(prometheus: prom.Prometheus, nodes: int) -> None:
    """Wait until every target was scraped and the rules have seen every node ready."""
    wait_for(prometheus.targets_up, timeout_s=30.0, what="every target up")
    wait_for(
        lambda: len(prometheus.query("rallypoint_ready == 1")) == nodes,
        timeout_s=30.0, what="every node ready in Prometheus",
    )  # fmt: skip


def scrape(node: Node, path: str, prometheus: prom.Prometheus) -> Reply:
    """GET path from node's metrics listener, from Prometheus' namespace."""
    return http_get(prometheus.ns, node.address, METRICS_PORT, path)


@pytest.mark.quiet_machine  # nothing to warn of only on an unstarved host
def test_a_healthy_cluster_fires_nothing_and_warns_of_nothing(
    make_monitored: MakeMonitored, promtool: str
) -> None:
    cluster, prometheus = make_monitored(HOSTS)
    cluster.start_all()
    cluster.wait_all_ready(READY_S)
    settle(prometheus, len(HOSTS))
    rules = prometheus.rules_loaded()
    assert len(rules) == 10 and all(r["health"] == "ok" for r in rules), rules
    # A few more evaluations with every series present: no alert, not even pending.
    time.sleep(5 * prometheus.interval_s)
    assert prometheus.alerts() == []
    for node in cluster:
        assert node.status()["warnings"] == [], node.name
    # What the metrics listener serves: the exposition (promtool accepts it), nothing else.
    master = cluster["main1"]
    body = scrape(master, "/metrics", prometheus)
    assert body.status == 200 and b"rallypoint_ready 1.0" in body.body
    checked = run([promtool, "check", "metrics"], input=body.text, timeout_s=30, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    env = master.env()
    assert env is not None
    for path in ("/env", "/status", "/job", "/readyz", "/metrics/../env", "/v1/ready"):
        assert scrape(master, path, prometheus).status == 404, path
    for secret in (TOKEN, f"MASTER_PORT={env['MASTER_PORT']}", env["MASTER_PORT"]):
        assert secret.encode() not in body.body


# It asserts that nothing but the peer-down alert fires: the clean links must measure clean.
@pytest.mark.quiet_machine
def test_a_node_that_leaves_fires_nothing_and_one_killed_fires_the_peer_down_alert(
    make_monitored: MakeMonitored,
) -> None:
    cluster, prometheus = make_monitored(HOSTS)
    cluster.start_all()
    cluster.wait_all_ready(READY_S)
    settle(prometheus, len(HOSTS))
    assert prometheus.alerts() == []
    # sub1's sidecar stops on purpose (SIGTERM, as when its container ends): it says goodbye
    # and is shown left, and over the same wait as sub2's alert, nothing fires for it.
    sidecar = cluster["sub1"].sidecar
    assert sidecar is not None
    sidecar.stop()
    wait_for(
        lambda: [x["host"] for x in cluster["main1"].status()["liveness"]["left"]] == ["sub1"],
        timeout_s=10.0, what="sub1 shown left on the master",
    )  # fmt: skip
    killed = time.monotonic()
    cluster["sub2"].kill_sidecar()
    bound_s = NAMED_S + 2 * prometheus.interval_s + PEER_DOWN_FOR_S
    fired: list[dict[str, Any]] = wait_for(
        lambda: prometheus.firing("RallypointPeerDown"),
        timeout_s=bound_s + SLACK_S, interval_s=0.25,
        what="RallypointPeerDown firing", describe=lambda: str(prometheus.alerts()),
    )  # fmt: skip
    after_s = time.monotonic() - killed
    assert after_s >= PEER_DOWN_FOR_S, f"fired {after_s:.1f} s after the kill, before `for`"
    (alert,) = fired
    assert alert["labels"]["peer"] == "sub2"
    assert alert["annotations"]["summary"] == "peer sub2 is down"
    assert alert["annotations"]["description"].startswith("1 node(s) name sub2 down")
    names = {a["labels"]["alertname"] for a in prometheus.alerts()}
    assert names == {"RallypointPeerDown"}, prometheus.alerts()
    assert prometheus.query('rallypoint_peer_up{peer="sub1"}') == []
    liveness = cluster["main1"].status()["liveness"]
    assert [x["host"] for x in liveness["left"]] == ["sub1"], liveness
    assert [x["host"] for x in liveness["down"]] == ["sub2"], liveness


def test_a_node_lost_while_its_job_runs_fires_the_node_lost_alert(
    make_monitored: MakeMonitored,
) -> None:
    """Every node runs a job under `rallypoint run`; sub2's node vanishes (its sidecar and its
    run SIGKILLed). The others name it lost, stop their jobs (exit 75) and count the failure,
    which the real Prometheus scrapes from the sidecars that stay up: RallypointNodeLost."""
    cluster, prometheus = make_monitored(HOSTS)
    cluster.start_all()
    cluster.wait_all_ready(READY_S)
    settle(prometheus, len(HOSTS))
    argv = [sys.executable, "-m", "rallypoint", "run", "--quiet", "--timeout", "60", "--",
            "sh", "-c", "exec sleep 600"]  # fmt: skip
    runs = {node.name: node.spawn(argv, label="run") for node in cluster}
    try:
        wait_for(
            lambda: cluster["main1"].get("/job").json()["counts"].get("running") == len(HOSTS),
            timeout_s=30.0, what="every job running",
        )  # fmt: skip
        lost = time.monotonic()
        cluster["sub2"].kill_sidecar()
        runs["sub2"].kill()
        (alert,) = wait_for(
            lambda: prometheus.firing("RallypointNodeLost"),
            timeout_s=NAMED_S + 2 * prometheus.interval_s + SLACK_S, interval_s=0.25,
            what="RallypointNodeLost firing", describe=lambda: str(prometheus.alerts()),
        )  # fmt: skip
        print(f"RallypointNodeLost fired {time.monotonic() - lost:.1f} s after the kill")
        assert alert["labels"]["severity"] == "critical" and alert["labels"]["cause"] == "lost"
        for name in ("main1", "sub1"):
            assert runs[name].wait(30.0) == 75, runs[name].log()[-2000:]
    finally:
        for proc in runs.values():
            proc.kill()


def test_a_shaped_link_fires_the_slow_link_alert(make_monitored: MakeMonitored) -> None:
    cluster, prometheus = make_monitored(HOSTS)
    cluster["sub2"].shape(10)
    cluster.start_all()
    cluster.wait_all_ready(READY_S)
    settle(prometheus, len(HOSTS))
    (alert,) = wait_for(
        lambda: prometheus.firing("RallypointSlowLink"),
        timeout_s=5 * prometheus.interval_s + SLACK_S,
        what="RallypointSlowLink firing", describe=lambda: str(prometheus.alerts()),
    )  # fmt: skip
    assert alert["labels"]["instance"] == f"main1:{METRICS_PORT}"  # the master judges links
    named = [w for w in cluster["main1"].status()["link_warnings"] if w["code"] == "slow_link"]
    assert named and all(w["host"] == "sub2" for w in named), named
    assert float(alert["value"]) == len(named)
    # The shaper's queue drops packets too: a lossy link may come with it, nothing else.
    names = {a["labels"]["alertname"] for a in prometheus.alerts()}
    assert names <= {"RallypointSlowLink", "RallypointLossyLink"}, prometheus.alerts()
