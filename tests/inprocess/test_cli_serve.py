"""`rallypoint serve` in a child process, driven by the other commands as a user would."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.support.cli import rallypoint
from tests.support.env import child_env
from tests.support.ports import free_port
from tests.support.served import Served

#: Starts the product's processes: no machine-measuring test runs beside it (conftest.py).
pytestmark = pytest.mark.starts_processes


def test_wait_env_check_status_against_a_real_sidecar(served: Served) -> None:
    port = str(served.local_port)
    waited = rallypoint("wait", "--local-port", port, "--timeout", "60")
    assert waited.returncode == 0, waited.stderr
    env = json.loads(waited.stdout)
    assert {k: env[k] for k in ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK")} == {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(served.master_port),
        "NNODES": "1",
        "NODE_RANK": "0",
    }
    assert (env["WORLD_SIZE"], env["RANK"], env["LOCAL_RANK"]) == ("1", "0", "0")
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"worker": [f"127.0.0.1:{served.tf_port}"]},
        "task": {"type": "worker", "index": 0},
    }

    now = rallypoint("env", "--local-port", port, "--format", "sh")
    assert now.returncode == 0, now.stderr
    assert f"export MASTER_PORT={served.master_port}\n" in now.stdout

    # The console script itself, as a HEALTHCHECK would run it.
    script = shutil.which("rallypoint")
    command = [script] if script else [sys.executable, "-m", "rallypoint"]
    check = subprocess.run(
        [*command, "check", "--local-port", port],
        env=child_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (check.returncode, check.stdout, check.stderr) == (0, "", "")

    status = rallypoint("status", "--local-port", port)
    assert status.returncode == 0, status.stderr
    assert ["ready", "yes"] in [line.split() for line in status.stdout.splitlines()]
    # A healthy single node: its loopback name is no problem, so no remedy and no alarm.
    row = next(line for line in status.stdout.splitlines() if line.startswith("0 "))
    assert "loopback (fine)" in row
    assert "map the name" not in status.stdout
    doc = json.loads(rallypoint("status", "--local-port", port, "--json").stdout)
    assert doc["peers"][0]["verdict"] == "loopback"
    assert doc["peers"][0]["excused"].startswith("a single node")
    explained = rallypoint("status", "--local-port", port, "--explain")
    assert "fine: a single node: no peer dials this name" in explained.stdout


def test_exec_sees_the_served_env(served: Served) -> None:
    code = "import os; print(os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'])"
    proc = rallypoint("exec", "--local-port", str(served.local_port), "--timeout", "60",
                      "--", sys.executable, "-c", code)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["127.0.0.1", str(served.master_port)]


def test_serve_stops_on_sigterm(served: Served) -> None:
    waited = rallypoint("wait", "--local-port", str(served.local_port), "--timeout", "60")
    assert waited.returncode == 0, waited.stderr
    served.proc.send_signal(signal.SIGTERM)
    try:
        code = served.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail("`rallypoint serve` still runs 10 s after SIGTERM")
    assert code == 0
    after = rallypoint("check", "--local-port", str(served.local_port))
    assert after.returncode == 1


def test_serve_with_a_bad_setting_exits_2_before_listening() -> None:
    proc = rallypoint("serve", "--local-port", str(free_port()), "--port-range", "9-1")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: --port-range: '9-1' is not a port range: use LO-HI with 1 <= LO <= HI <= 65535, "
        "e.g. 20000-29999"
    ]


@pytest.mark.parametrize(
    ("env", "line"),
    [
        (
            {"RALLYPOINT_FRAMEWORKS": "jax", "JAX_COORDINATOR_ADDRESS": "main1"},
            "error: JAX_COORDINATOR_ADDRESS from the environment: 'main1' is not host:port; "
            "write it as host:port (an IPv6 host as [addr]:port)",
        ),
        (
            {"MASTER_PORT": "http"},
            "error: MASTER_PORT='http' from the environment is not a port: use an integer "
            "from 1 to 65535",
        ),
    ],
)
def test_serve_with_a_malformed_user_value_exits_2_before_listening(
    env: dict[str, str], line: str
) -> None:
    local = free_port()
    proc = rallypoint(
        "serve", "--local-port", str(local), "--peer-port", str(free_port()), "--no-mdns", env=env
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [line]


def test_serve_with_master_port_on_its_own_peer_port_exits_2_before_listening() -> None:
    peer = free_port()
    proc = rallypoint(
        "serve",
        "--local-port",
        str(free_port()),
        "--peer-port",
        str(peer),
        "--no-mdns",
        env={"MASTER_PORT": str(peer)},
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"error: MASTER_PORT={peer} (from environment) is the port of this sidecar's peer"
        " API (RALLYPOINT_PEER_PORT); give the job another port or move the sidecar's listener"
    ]


def test_demo_prints_every_node_ready() -> None:
    proc = rallypoint("demo", "--nodes", "2", "--peer-port", str(free_port()),
                      "--master-port", str(free_port()))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == ["node 0", "node 1"]
    assert all("MASTER_ADDR=node0" in line and "NNODES=2" in line for line in lines[:2])
    assert lines[2].startswith("2 nodes ready in ")


def test_peers_lists_a_sidecar_announcing_on_loopback(start: Callable[..., Served]) -> None:
    served = start("--mdns-interface", "127.0.0.1")
    waited = rallypoint("wait", "--local-port", str(served.local_port), "--timeout", "60")
    assert waited.returncode == 0, waited.stderr
    seen = rallypoint("peers", "--seconds", "2", "--mdns-interface", "127.0.0.1", "--json")
    assert seen.returncode == 0, seen.stderr
    mine = [a for a in json.loads(seen.stdout) if a["peer_port"] == served.peer_port]
    assert [(a["session"], a["rank"]) for a in mine] == [("single", 0)]
    table = rallypoint("peers", "--seconds", "2", "--mdns-interface", "127.0.0.1")
    assert table.stdout.splitlines()[0].split()[:3] == ["SESSION", "RANK", "HOST"]
    assert any(str(served.peer_port) in line.split() for line in table.stdout.splitlines())
