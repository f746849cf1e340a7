"""`rallypoint run` through its real entry point, against a real single-node sidecar.

The child's own status, the signals it is forwarded, the process group left behind, the
sidecar gone and back, bad flags and commands. Stops caused by other nodes are the
in-process cluster's (test_jobs.py) and the multi-host tier's (tests/multihost/test_run.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cli import rallypoint
from tests.support.env import child_env
from tests.support.holdproxy import HoldingProxy
from tests.support.served import Served

#: Starts the product's processes: no machine-measuring test runs beside it (conftest.py).
pytestmark = pytest.mark.starts_processes


def run_argv(served: Served, *args: str) -> list[str]:
    return [sys.executable, "-m", "rallypoint", "run", "--local-port", str(served.local_port),
            "--timeout", "60", "--quiet", *args]  # fmt: skip


def start_run(served: Served, *args: str) -> subprocess.Popen[str]:
    """`rallypoint run ARGS` in the background, its stderr kept."""
    argv = run_argv(served, *args)
    return subprocess.Popen(argv, env=child_env(), stderr=subprocess.PIPE, text=True)


def job(served: Served) -> dict[str, object]:
    shown = rallypoint("status", "--json", "--local-port", str(served.local_port))
    assert shown.returncode == 0, shown.stderr
    section = json.loads(shown.stdout)["job"]
    assert isinstance(section, dict)
    return section


def wait_running(local_port: int, timeout_s: float = 30.0) -> None:
    """Until the sidecar on ``local_port`` answers and has this node's job running."""
    deadline = time.monotonic() + timeout_s
    while True:
        shown = rallypoint("status", "--json", "--local-port", str(local_port))
        own = json.loads(shown.stdout)["job"]["own"] if shown.returncode == 0 else {}
        if own.get("state") == "running":
            return
        assert time.monotonic() < deadline, shown.stderr
        time.sleep(0.2)


def wait_file(path: Path, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)
    return path.read_text()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize(
    "script, status, what",
    [
        ("exit 0", 0, "exited 0"),
        ("exit 3", 3, "exited 3"),
        ("kill -9 $$", 137, "killed by SIGKILL"),
        ("kill -15 $$", 143, "killed by SIGTERM"),
    ],
)
def test_the_child_s_own_status_is_run_s_and_its_sidecar_knows_it(
    served: Served, script: str, status: int, what: str
) -> None:
    proc = rallypoint(*run_argv(served, "--", "sh", "-c", script)[3:])
    assert proc.returncode == status, proc.stderr
    own = job(served)["own"]
    assert isinstance(own, dict) and own["what"] == what
    if status:
        # The first failure is named on stderr, and it is this node's own.
        line = f"first failure: 127.0.0.1 (rank 0) {what}, "
        assert line in proc.stderr and proc.stderr.rstrip().endswith(f"; exit {status}"), (
            proc.stderr
        )
    else:
        assert "first failure" not in proc.stderr


def test_the_served_env_reaches_the_child(served: Served) -> None:
    proc = rallypoint(*run_argv(served, "--", "sh", "-c", 'echo "$MASTER_PORT $WORLD_SIZE"')[3:])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(served.master_port), "1"]


@pytest.mark.parametrize(
    "args, status, message",
    [
        (("--", "no-such-command-here"), 127, "not found"),
        (("--", "/etc/hostname"), 126, "cannot run"),
        (("--grace", "-1", "--", "true"), 2, "--grace"),
        (("--lost-exit-code", "0", "--", "true"), 2, "--lost-exit-code"),
        (("--lost-exit-code", "256", "--", "true"), 2, "--lost-exit-code"),
        ((), 2, "COMMAND"),
    ],
)
def test_bad_commands_and_flags_exit_with_one_line(
    served: Served, args: tuple[str, ...], status: int, message: str
) -> None:
    proc = rallypoint(*run_argv(served, *args)[3:])
    assert proc.returncode == status, proc.stderr
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_bad_variable_names_itself(served: Served) -> None:
    env = {"RALLYPOINT_LOST_EXIT_CODE": "zero"}
    proc = rallypoint(*run_argv(served, "--", "true")[3:], env=env)
    assert proc.returncode == 2 and "RALLYPOINT_LOST_EXIT_CODE" in proc.stderr, proc.stderr


SCRIPT = """
import os, signal, subprocess, sys, time

out = sys.argv[1]
# A data-loader-like grandchild in the same process group, which outlives nothing.
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
got = []
for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGINT):
    signal.signal(sig, lambda n, f: got.append(signal.Signals(n).name))
with open(out, "w") as f:
    f.write(f"{os.getpid()} {os.getpgid(0)} {worker.pid}\\n")
while len(got) < 4:
    time.sleep(0.05)
with open(out, "a") as f:
    f.write(" ".join(got) + "\\n")
sys.exit(0)
"""


@pytest.fixture
def job_script(tmp_path: Path) -> Path:
    path = tmp_path / "job.py"
    path.write_text(SCRIPT)
    return path


def test_signals_are_forwarded_to_the_group_and_nothing_of_it_is_left(
    served: Served, job_script: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    proc = start_run(served, "--", sys.executable, str(job_script), str(out))
    try:
        pid, pgid, worker = (int(x) for x in wait_file(out).split())
        # Its own process group: a terminal's Ctrl-C reaches `run`, which passes it on.
        assert pgid == pid and pgid != os.getpgid(proc.pid)
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
            proc.send_signal(sig)
            time.sleep(0.2)
        assert job(served)["own"]["state"] == "terminated"  # type: ignore[index]
        proc.send_signal(signal.SIGINT)
        status = proc.wait(30)
    finally:
        proc.kill()
    assert status == 0, proc.stderr
    assert out.read_text().splitlines()[1] == "SIGUSR1 SIGUSR2 SIGHUP SIGINT"
    # The grandchild that outlived the job was stopped with it.
    deadline = time.monotonic() + 15
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(worker)


def test_sigterm_stops_the_job_and_says_it_came_from_outside(
    served: Served, tmp_path: Path
) -> None:
    assert stopped_from_outside(served, tmp_path) == 9
    seen = job(served)
    assert seen["first"]["what"] == "stopped from outside by SIGTERM"  # type: ignore[index]


def stopped_from_outside(served: Served, tmp_path: Path) -> int:
    """`run` of a job that exits 9 on SIGTERM, sent SIGTERM once the job runs; its status."""
    out = tmp_path / "out"
    script = f'echo $$ > {out}; trap "exit 9" TERM; while true; do sleep 0.1; done'
    proc = start_run(served, "--", "sh", "-c", script)
    try:
        wait_file(out)
        proc.send_signal(signal.SIGTERM)
        return proc.wait(30)
    finally:
        proc.kill()


def test_a_job_that_ignores_sigterm_dies_with_a_killed_run(served: Served, tmp_path: Path) -> None:
    out = tmp_path / "out"
    script = f"trap '' TERM; echo $$ > {out}; while true; do sleep 0.1; done"
    proc = start_run(served, "--", "sh", "-c", script)
    try:
        child = int(wait_file(out))
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        # A forwarded SIGTERM is the job's to handle: `run` kills nothing of its own accord.
        assert alive(child) and proc.poll() is None
        # The scheduler's SIGKILL, which `run` cannot pass on: the job dies with it.
        proc.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 15
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child)
    finally:
        proc.kill()
        proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child, signal.SIGKILL)


def test_the_job_outlives_its_sidecar_and_is_reported_to_the_next_one(
    start: Callable[..., Served], tmp_path: Path
) -> None:
    served = start("--no-mdns")
    gate = tmp_path / "gate"
    script = f"while [ ! -e {gate} ]; do sleep 0.1; done; exit 5"
    proc = start_run(served, "--", "sh", "-c", script)
    try:
        wait_running(served.local_port)
        served.proc.send_signal(signal.SIGTERM)
        served.proc.wait(15)
        time.sleep(2.0)
        assert proc.poll() is None  # the sidecar is not the job
        # `run` reconnects and reports its job to the new sidecar.
        wait_running(start("--no-mdns", local_port=served.local_port).local_port)
        gate.touch()
        status = proc.wait(30)
        _, err = proc.communicate()
    finally:
        proc.kill()
    assert status == 5
    assert err.count("the job keeps running") == 1, err
    assert "the sidecar answers again" in err, err


def test_an_outside_stop_the_sidecar_takes_late_is_still_named_first(
    served: Served, tmp_path: Path
) -> None:
    """The stop's report reaches the sidecar only after the job's end that followed it (the
    sidecar starved of CPU): `run` said it again before the end, so the outside stop is
    still the first failure, not the exit it caused."""
    proxy = HoldingProxy(served.local_port, b'"terminated"', hold_s=4.0)
    late = Served(served.proc, proxy.port, served.peer_port, served.master_port, served.tf_port)
    try:
        status = stopped_from_outside(late, tmp_path)
        assert proxy.held.is_set(), "the stop was never reported"
        time.sleep(4.5)  # the held report has reached the sidecar by now
    finally:
        proxy.close()
    assert status == 9
    seen = job(served)
    assert seen["first"]["what"] == "stopped from outside by SIGTERM", seen  # type: ignore[index]
