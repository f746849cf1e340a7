"""The stand-in trainer of the compose example, run on loopback without Docker."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping

import pytest

from tests.compose import engine
from tests.support.ports import free_port

TRAINER = engine.DOCKER_DIR / "trainer.py"
HOST = socket.gethostname()


def node_env(rank: int, port: int, **overrides: str) -> dict[str, str]:
    cluster = {"worker": [f"{HOST}:{2222 + i}" for i in range(3)]}
    env = {
        "PATH": os.environ.get("PATH", ""),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "NNODES": "3",
        "NODE_RANK": str(rank),
        "WORLD_SIZE": "3",
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}}),
        "TRAINER_DEADLINE_S": "30",
    }
    env.update(overrides)
    return env


def start(env: Mapping[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(TRAINER)],
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_master_and_workers_exchange_messages_beside_a_held_port() -> None:
    """Workers start first and retry; the master binds a port another socket holds."""
    port = free_port()
    # The sidecar's hold: bound with SO_REUSEADDR, not listening.
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("0.0.0.0", port))
        procs = [start(node_env(rank, port)) for rank in (1, 2, 0)]
        outputs = [proc.communicate(timeout=60) for proc in procs]
    codes = [proc.returncode for proc in procs]
    assert codes == [0, 0, 0], outputs
    summaries = [engine.parse_summary(out) for out, _ in outputs]
    assert all(summary is not None for summary in summaries), outputs
    by_rank = {int(s["env"]["NODE_RANK"]): s for s in summaries if s is not None}
    assert sorted(by_rank[0]["exchanged"]) == [f"hello rank={r} host={HOST}" for r in (1, 2)]
    assert by_rank[1]["exchanged"] == [f"welcome from {HOST}"]
    assert by_rank[2]["env"]["MASTER_PORT"] == str(port)


@pytest.mark.parametrize(
    ("rank", "overrides", "message"),
    [
        (0, {"MASTER_PORT": ""}, "MASTER_PORT is not set"),
        (0, {"NODE_RANK": "3"}, "NODE_RANK=3 is out of range"),
        (0, {"TF_CONFIG": "{not json"}, "TF_CONFIG does not parse"),
        (
            1,
            {
                "TF_CONFIG": json.dumps(
                    {
                        "cluster": {"worker": ["a:1", "elsewhere:2"]},
                        "task": {"type": "worker", "index": 1},
                    }
                )
            },
            "not this host",
        ),
        (
            0,
            {
                "TF_CONFIG": json.dumps(
                    {"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 4}}
                )
            },
            "is not in cluster",
        ),
        (2, {"TRAINER_DEADLINE_S": "1"}, "cannot exchange a message with MASTER_ADDR=127.0.0.1"),
    ],
    ids=["no-port", "rank-range", "tf-json", "tf-other-host", "tf-index", "no-master"],
)
def test_unusable_env_fails_naming_the_variable(
    rank: int, overrides: dict[str, str], message: str
) -> None:
    proc = start(node_env(rank, free_port(), **overrides))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, (out, err)
    assert message in err
    assert engine.parse_summary(out) is None


def test_holding_trainer_logs_its_first_exchange_and_its_stop() -> None:
    """TRAINER_HOLD_S keeps every node mid-job after the exchange; SIGTERM ends it with 143."""
    port = free_port()
    procs = [start(node_env(rank, port, TRAINER_HOLD_S="120")) for rank in (0, 1, 2)]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # blocks until the exchange is done
            assert line.startswith("rallypoint-trainer-training "), line
            info = json.loads(line.partition(" ")[2])
            assert (info["hold_s"], info["attempt"]) == (120, 0), info
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        outputs = [proc.communicate(timeout=60) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert [proc.returncode for proc in procs] == [143, 143, 143], outputs
    for out, _err in outputs:
        assert out.startswith(f"rallypoint-trainer-stopped {HOST} by SIGTERM"), out
        assert engine.parse_summary(out) is None


def test_hold_that_is_not_a_number_fails_naming_it() -> None:
    port = free_port()
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("0.0.0.0", port))
        procs = [start(node_env(rank, port, TRAINER_HOLD_S="soon")) for rank in (0, 1, 2)]
        outputs = [proc.communicate(timeout=60) for proc in procs]
    assert [proc.returncode for proc in procs] == [1, 1, 1], outputs
    assert all("TRAINER_HOLD_S='soon' is not a number" in err for _out, err in outputs), outputs
