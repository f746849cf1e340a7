"""Attempts: `rallypoint run` on every node of an in-process cluster, through its entry point.

A failed attempt stops every node's run; the same command started again on every node (the
sidecars stay up) is the next attempt and runs to its end; `--restarts N` starts the next
attempt on every node by itself; a stop from outside is never restarted; bad flags exit 2
at once. The real-framework cases are the multi-host tier's (tests/multihost/test_run.py).
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from rallypoint.wire.jobstates import JobView
from tests.support.cluster.inprocess import Cluster, ready_cluster, until
from tests.support.commands import start_rallypoint

#: Starts the product's processes: no machine-measuring test runs beside it (conftest.py).
pytestmark = pytest.mark.starts_processes

TOKEN = "attempts-test-secret"
#: A keep-alive every 0.3 s: a failure reaches every node within a moment.
FAST = {"keepalive_s": 0.3}
#: Each node's child: prints its attempt and rank, then runs SCRIPT (sh).
SAY = 'echo "ATTEMPT $RALLYPOINT_ATTEMPT RESTARTS $TORCHELASTIC_RESTART_COUNT NODE $RP_NODE"; '


async def run_everywhere(
    c: Cluster, scripts: dict[int, str], *run_args: str
) -> dict[int, asyncio.subprocess.Process]:
    """`rallypoint run [ARGS] -- sh -c SCRIPT` for each rank, in the background."""
    procs = {}
    for rank, script in scripts.items():
        port = c.local_url(rank, "").rsplit(":", 1)[1]
        procs[rank] = await start_rallypoint(
            "run", "--local-port", port, "--timeout", "60", "--quiet", "--grace", "2", *run_args,
            "--", "sh", "-c", SAY + script,
            env={**c.run_env(), "RP_NODE": str(rank)},
        )  # fmt: skip
    return procs


async def ends(procs: dict[int, asyncio.subprocess.Process]) -> dict[int, tuple[int, str, str]]:
    """rank -> (status, stdout, stderr) once every run ended (a hung run fails the test)."""
    out = {}
    async with asyncio.timeout(90.0):
        for rank, proc in procs.items():
            stdout, stderr = await proc.communicate()
            assert proc.returncode is not None
            out[rank] = (proc.returncode, stdout.decode(), stderr.decode())
    return out


def attempts_seen(stdout: str) -> list[int]:
    return [int(line.split()[1]) for line in stdout.splitlines() if line.startswith("ATTEMPT ")]


def job_view(c: Cluster, rank: int) -> JobView:
    """Node ``rank``'s job view (its node list is known: the cluster is ready)."""
    shown = c.nodes[rank].node.job_status()
    assert isinstance(shown, JobView), shown
    return shown


def own_state(c: Cluster, rank: int) -> str | None:
    own = job_view(c, rank).own
    return None if own is None else own.state


def starting(c: Cluster, rank: int, attempt: int) -> bool:
    own = job_view(c, rank).own
    return own is not None and own.state == "starting" and own.attempt == attempt


def ready(n: int):  # type: ignore[no-untyped-def]
    return ready_cluster(n, token=TOKEN, per_node={r: dict(FAST) for r in range(n)})


async def test_the_same_command_run_again_after_a_failure_is_the_next_attempt() -> None:
    async with ready(3) as c:
        # Attempt 0: node1 fails, the others are stopped with its status.
        first = await ends(
            await run_everywhere(c, {0: "sleep 60", 1: "sleep 0.5; exit 4", 2: "sleep 60"})
        )
        assert {r: s for r, (s, _, _) in first.items()} == {0: 4, 1: 4, 2: 4}, first
        assert "first failure: node1 (rank 1) exited 4" in first[0][2], first[0][2]
        # The user runs the same command again on every node, with no fault: it runs.
        again = await ends(await run_everywhere(c, dict.fromkeys(range(3), "sleep 0.2")))
        assert {r: s for r, (s, _, _) in again.items()} == dict.fromkeys(range(3), 0), again
        for rank, (_, stdout, _) in again.items():
            assert f"ATTEMPT 1 RESTARTS 1 NODE {rank}" in stdout, stdout
        view = job_view(c, 0)
        assert view.attempt == 1 and view.first is None, view
        earlier = view.attempts
        assert len(earlier) == 1, earlier
        assert (earlier[0].attempt, earlier[0].host, earlier[0].code) == (0, "node1", 4)
        restarts = c.nodes[2].metrics.value("rallypoint_job_restarts_total", cause="exited")
        assert restarts == 1
        assert c.nodes[2].metrics.value("rallypoint_job_attempt") == 1


async def test_restarts_start_the_next_attempt_on_every_node_until_it_completes() -> None:
    async with ready(3) as c:
        # node2 crashes in attempt 0 only; every node runs attempt 1 to its end.
        waits = 'if [ "$RALLYPOINT_ATTEMPT" = 0 ]; then sleep 60; fi'
        crash = 'if [ "$RALLYPOINT_ATTEMPT" = 0 ]; then sleep 0.5; exit 7; fi; sleep 0.3'
        scripts = {0: waits, 1: waits, 2: crash}
        done = await ends(await run_everywhere(c, scripts, "--restarts", "2"))
        assert {r: s for r, (s, _, _) in done.items()} == dict.fromkeys(range(3), 0), done
        for _, stdout, stderr in done.values():
            assert attempts_seen(stdout) == [0, 1], (stdout, stderr)
            assert "restarting: attempt 1 on every node (1 of --restarts 2)" in stderr, stderr


async def test_a_failure_past_the_budget_ends_every_node_with_its_status() -> None:
    async with ready(2) as c:
        scripts = {0: "sleep 60", 1: "sleep 0.3; exit 5"}
        done = await ends(await run_everywhere(c, scripts, "--restarts", "1"))
        assert {r: s for r, (s, _, _) in done.items()} == {0: 5, 1: 5}, done
        for _, stdout, _ in done.values():
            assert attempts_seen(stdout) == [0, 1], stdout


async def test_a_stop_from_outside_is_never_restarted() -> None:
    async with ready(2) as c:
        procs = await run_everywhere(c, {0: "sleep 60", 1: "sleep 60"}, "--restarts", "3")
        await until(lambda: own_state(c, 1) == "running")
        await until(lambda: own_state(c, 0) == "running")
        procs[1].send_signal(signal.SIGTERM)
        done = await ends(procs)
        assert done[1][0] == 143 and done[0][0] == 75, done
        for _, stdout, _ in done.values():
            assert attempts_seen(stdout) == [0], stdout


async def held_until_the_other_runs(c: Cluster, alone: int, other: int, script: str) -> None:
    """``alone``'s run is starting and must not start attempt 0 until ``other``'s runs too;
    then both run attempt 0 to its end."""
    procs = await run_everywhere(c, {alone: script})
    await until(lambda: starting(c, alone, 0))
    await asyncio.sleep(1.0)  # a moment in which it must not start alone
    assert job_view(c, alone).attempt == -1
    assert procs[alone].returncode is None
    procs |= await run_everywhere(c, {other: script})
    done = await ends(procs)
    assert {r: s for r, (s, _, _) in done.items()} == {0: 0, 1: 0}, done
    assert all(attempts_seen(stdout) == [0] for _, stdout, _ in done.values()), done


async def test_no_attempt_starts_until_every_node_is_starting() -> None:
    async with ready(2) as c:
        await held_until_the_other_runs(c, 0, 1, "sleep 0.1")


async def test_a_run_killed_mid_attempt_and_started_again_restarts_the_job_everywhere() -> None:
    """node1's `run` is SIGKILLed (its child dies with it: nothing reports the end), and a new
    `run` starts there, as a container restarted on failure would. The others' jobs, which
    would wait on it for ever (a collective on a peer that is gone), are stopped at once
    naming node1, and every node runs the next attempt together."""
    async with ready(3) as c:
        # exec: the child is the sleep itself, which dies with its run (no orphan).
        waits = 'if [ "$RALLYPOINT_ATTEMPT" = 0 ]; then exec sleep 60; fi; exec sleep 0.2'
        procs = await run_everywhere(c, dict.fromkeys(range(3), waits), "--restarts", "1")
        for rank in range(3):
            await until(lambda r=rank: own_state(c, r) == "running")  # type: ignore[misc]
        procs[1].kill()
        await procs[1].wait()  # and its pipes: its child (exec'd sleep) died with it
        procs |= await run_everywhere(c, {1: waits}, "--restarts", "1")
        done = await ends(procs)
        assert {r: s for r, (s, _, _) in done.items()} == dict.fromkeys(range(3), 0), done
        for rank in (0, 2):
            stdout, stderr = done[rank][1:]
            assert attempts_seen(stdout) == [0, 1], (stdout, stderr)
            assert "first failure: node1 (rank 1) lost: its run ended without a report" in stderr
        assert attempts_seen(done[1][1]) == [1], done[1]
        view = job_view(c, 2)
        assert [(f.host, f.state) for f in view.attempts] == [("node1", "lost")], view


async def test_a_run_that_gave_up_waiting_is_not_counted_as_starting() -> None:
    """node0's run gives up waiting for node1 (its --timeout). node1's run, started later,
    must still wait for a node0 that starts: had node0's withdrawn run been counted, node1
    would have started attempt 0 alone, and node0's next run been taken for one that
    vanished in it."""
    async with ready(2) as c:
        gave_up = await ends(await run_everywhere(c, {0: "exec sleep 0.1"}, "--timeout", "2"))
        assert gave_up[0][0] == 75, gave_up
        assert own_state(c, 0) == "stopped"
        await held_until_the_other_runs(c, 1, 0, "exec sleep 0.1")
        assert job_view(c, 1).attempts == ()  # nobody failed


async def test_a_master_back_with_a_new_address_is_checked_before_the_next_attempt(
    tmp_path: Path,
) -> None:
    """The master's pod is recreated: its run and sidecar killed, both started again with a
    new address, which the workers do not resolve to yet. node1's job fails on the loss (as
    a collective would). The next attempt waits while the new address fails its check; once
    it passes, it runs everywhere with the new MASTER_ADDR (the env of the new generation,
    not the one the workers' runs began with)."""
    new, flag = "198.51.100.99", tmp_path / "peer-gone"
    fast_ip = {**FAST, "master_addr_mode": "ip"}
    async with ready_cluster(3, token=TOKEN, per_node={r: dict(fast_ip) for r in range(3)}) as c:
        script = (
            'if [ "$RALLYPOINT_ATTEMPT" = 0 ]; then if [ "$RP_NODE" = 1 ]; then '
            f"while [ ! -e {flag} ]; do sleep 0.05; done; exit 1; fi; exec sleep 60; fi; "
            'echo "AT $MASTER_ADDR"'
        )
        procs = await run_everywhere(c, dict.fromkeys(range(3), script), "--restarts", "1")
        for rank in range(3):
            await until(lambda r=rank: own_state(c, r) == "running")  # type: ignore[misc]
        procs[0].kill()
        await procs[0].wait()  # its child (exec'd sleep) died with it
        await c.stop(0)
        c.addresses[0] = [new]
        await c.start(0)
        procs |= await run_everywhere(c, {0: script}, "--restarts", "1")
        flag.touch()
        await until(lambda: all(starting(c, r, 1) for r in (1, 2)))
        await asyncio.sleep(1.0)  # a moment in which attempt 1 must not start
        master = c.nodes[0].node
        assert not master.readiness.ready
        assert all(job_view(c, r).start is None for r in range(3))
        assert all(p.returncode is None for p in procs.values())
        for rank in (1, 2):
            c.resolvers[rank].set("node0", [new])
        done = await ends(procs)
        assert {r: s for r, (s, _, _) in done.items()} == dict.fromkeys(range(3), 0), done
        for rank, (_, stdout, stderr) in done.items():
            assert attempts_seen(stdout) == ([1] if rank == 0 else [0, 1]), (stdout, stderr)
            assert f"AT {new}" in stdout, (stdout, stderr)


async def test_the_cause_a_failed_job_left_in_its_error_file_is_named_on_every_node(
    tmp_path: Path,
) -> None:
    """node1's job writes its reason into RALLYPOINT_ERROR_FILE (torch's @record writes
    TORCHELASTIC_ERROR_FILE, the same path) and exits 1: every node names it with the cause."""
    async with ready(2) as c:
        script = (
            'if [ "$RP_NODE" = 1 ]; then [ "$RALLYPOINT_ERROR_FILE" = "$TORCHELASTIC_ERROR_FILE" ]'
            ' && printf "RuntimeError: planted\\nfailure at step 4\\n" > "$RALLYPOINT_ERROR_FILE";'
            " exit 1; fi; exec sleep 30"
        )
        # node0's container keeps a termination message (Kubernetes shows it in the pod).
        message = tmp_path / "termination-log"
        procs = await run_everywhere(c, {0: script}, "--termination-log", str(message))
        procs |= await run_everywhere(c, {1: script})
        done = await ends(procs)
        assert {r: s for r, (s, _, _) in done.items()} == {0: 1, 1: 1}, done
        named = "first failure: node1 (rank 1) exited 1: RuntimeError: planted"
        for _, _, stderr in done.values():
            assert named in stderr, stderr
        assert message.read_text().startswith(named.removeprefix("rallypoint: ")), done[0]
        first = job_view(c, 0).first
        assert first is not None and first.what == "exited 1: RuntimeError: planted", first


async def test_a_restarted_master_learns_the_earlier_attempts_from_the_workers() -> None:
    """Attempt 0 failed on node1, attempt 1 completed; then the master's sidecar restarts.
    Its list of earlier attempts comes back from the workers' next keep-alives (a master has
    no upstream to learn it from), so every node shows the same history."""
    async with ready(3) as c:
        script = (
            'if [ "$RALLYPOINT_ATTEMPT" = 0 ]; then [ "$RP_NODE" = 1 ] && exit 3; exec sleep 30; fi'
        )
        done = await ends(
            await run_everywhere(c, dict.fromkeys(range(3), script), "--restarts", "1")
        )
        assert {r: s for r, (s, _, _) in done.items()} == dict.fromkeys(range(3), 0), done

        def history(rank: int) -> list[tuple[int, str, str]]:
            view = c.nodes[rank].node.job_status()
            return [(f.attempt, f.host, f.state) for f in view.attempts]

        assert history(2) == [(0, "node1", "exited")]
        await c.stop(0)
        await c.start(0)
        await until(lambda: history(0) == [(0, "node1", "exited")])
        assert job_view(c, 0).attempt == 1


@pytest.mark.parametrize(
    "args, env, named",
    [
        (["--restarts", "-1"], {}, "--restarts"),
        (["--restarts", "two"], {}, "--restarts"),
        ([], {"RALLYPOINT_RESTARTS": "1.5"}, "RALLYPOINT_RESTARTS"),
        (["--rejoin-timeout", "-5"], {}, "--rejoin-timeout"),
        ([], {"RALLYPOINT_REJOIN_TIMEOUT": "soon"}, "RALLYPOINT_REJOIN_TIMEOUT"),
        (["--restart", "2"], {}, "--restart"),
        (["--stall-timeout", "soon"], {}, "--stall-timeout"),
        ([], {"RALLYPOINT_STALL_TIMEOUT_FIRST": "-1"}, "RALLYPOINT_STALL_TIMEOUT_FIRST"),
        (["--stall-timeout-checkpoint", "0"], {}, "--stall-timeout-checkpoint"),
        (["--stall-signal", "KILL"], {}, "--stall-signal"),
        ([], {"RALLYPOINT_STALL_SIGNAL": "wake"}, "RALLYPOINT_STALL_SIGNAL"),
    ],
)
async def test_bad_flags_exit_2_at_once_naming_the_flag(
    args: list[str], env: dict[str, str], named: str
) -> None:
    # No sidecar listens on this port: a bad flag must be refused before any wait.
    proc = await start_rallypoint(
        "run", "--local-port", "9", "--timeout", "300", *args, "--", "true", env=env
    )
    async with asyncio.timeout(30.0):
        _, stderr = await proc.communicate()
    text = stderr.decode()
    assert proc.returncode == 2, text
    assert len(text.strip().splitlines()) == 1 and named in text, text


async def test_a_run_that_never_started_its_child_exits_with_the_try_again_status() -> None:
    proc = await start_rallypoint(
        "run", "--local-port", "9", "--timeout", "1", "--quiet", "--", "true"
    )
    async with asyncio.timeout(30.0):
        _, stderr = await proc.communicate()
    assert proc.returncode == 75, stderr
    assert "the job was not started: exit 75" in stderr.decode()
    assert os.environ.get("RALLYPOINT_ATTEMPT") is None


#: A job that marks its progress every 0.2 s, step after step, for ``$1`` steps.
MARKS = 'i=0; while [ "$i" -lt "$1" ]; do i=$((i+1)); echo "$i step" > "$RALLYPOINT_PROGRESS_FILE"; sleep 0.2; done'  # noqa: E501


async def test_a_job_that_stops_making_progress_is_named_stalled_on_every_node() -> None:
    """node2 marks 3 steps and hangs while the others keep marking: under --stall-timeout 3,
    every node stops, names node2 stalled at step 3 and behind, and exits 1."""
    async with ready(3) as c:
        hang = f"set -- 3; {MARKS}; exec sleep 60"
        steady = f"set -- 1000; {MARKS}"
        # 3 s: node2's last mark reaches every node (post, keep-alives) well within the bound.
        procs = await run_everywhere(c, {0: steady, 1: steady, 2: hang}, "--stall-timeout", "3")
        done = await ends(procs)
        assert {r: s for r, (s, _, _) in done.items()} == {0: 1, 1: 1, 2: 1}, done
        named = "first failure: node2 (rank 2) stalled at step 3 (step), no progress for 3 s"
        behind = "node2 (rank 2) is behind: its last progress was step 3 (step), every other"
        for _, _, stderr in done.values():
            assert named in stderr and behind in stderr, stderr
        assert "rallypoint: stopping the job: this node stalled: at step 3" in done[2][2]
        first = job_view(c, 1).first
        assert first is not None and (first.host, first.state) == ("node2", "stalled"), first


async def test_under_torchrun_each_local_rank_marks_its_own_and_the_oldest_is_the_nodes() -> None:
    """node1's local rank 1 hangs while its local rank 0 marks on: every node names it."""
    async with ready(2) as c:
        ranks = 'for r in 0 1; do (P="$RALLYPOINT_PROGRESS_FILE.$r"; {MARKS}) & done; wait'
        marks = (
            'i=0; while [ "$i" -lt "$N" ]; do i=$((i+1)); echo "$i step" > "$P"; sleep 0.2; done'
        )
        steady, hangs = (
            ranks.format(MARKS=f"N=1000; {marks}"),
            ranks.format(MARKS=f'N=$((r == 1 ? 3 : 1000)); {marks}; [ "$r" = 1 ] && sleep 60'),
        )
        done = await ends(await run_everywhere(c, {0: steady, 1: hangs}, "--stall-timeout", "2"))
        assert {r: s for r, (s, _, _) in done.items()} == {0: 1, 1: 1}, done
        for _, _, stderr in done.values():
            assert "node1 (rank 1) stalled at step 3 (step), local rank 1" in stderr, stderr


async def test_a_job_that_keeps_progressing_or_never_marks_is_never_stalled() -> None:
    """Marks every 0.2 s under --stall-timeout 1, and a job that never marks (not watched
    without --stall-timeout-first), both run to their end."""
    async with ready(2) as c:
        marks = f"set -- 15; {MARKS}"
        procs = await run_everywhere(c, {0: marks, 1: "sleep 3"}, "--stall-timeout", "1")
        done = await ends(procs)
        assert {r: s for r, (s, _, _) in done.items()} == {0: 0, 1: 0}, done


async def test_no_first_progress_within_the_first_bound_is_a_stall() -> None:
    async with ready(2) as c:
        late = f"sleep 30; set -- 3; {MARKS}"
        procs = await run_everywhere(c, {0: late, 1: late}, "--stall-timeout-first", "1")
        done = await ends(procs)
        assert {r: s for r, (s, _, _) in done.items()} == {0: 1, 1: 1}, done
        for _, _, stderr in done.values():
            assert "stalled before its first progress, 1 s after the start" in stderr, stderr


async def test_a_long_checkpoint_within_its_bound_is_no_stall_and_the_dump_signal_comes_first() -> (
    None
):
    """Both nodes save a 3 s checkpoint under --stall-timeout 1 --stall-timeout-checkpoint 10
    and run to their end. Then, in the next attempt, node1 hangs after its marks and gets
    --stall-signal USR1 (its stacks) before its stop."""
    async with ready(2) as c:
        save = 'echo "3 checkpoint" > "$RALLYPOINT_PROGRESS_FILE"; sleep 3'
        saves = f"set -- 3; {MARKS}; {save}; set -- 6; {MARKS}"
        args = ("--stall-timeout", "1", "--stall-timeout-checkpoint", "10")
        done = await ends(await run_everywhere(c, {0: saves, 1: saves}, *args))
        assert {r: s for r, (s, _, _) in done.items()} == {0: 0, 1: 0}, done
        hangs = f"trap 'echo STACKS; exit 7' USR1; set -- 2; {MARKS}; sleep 60 & wait"
        procs = await run_everywhere(c, {0: f"set -- 1000; {MARKS}"}, *args)
        procs |= await run_everywhere(c, {1: hangs}, *args, "--stall-signal", "USR1")
        done = await ends(procs)
        assert {r: s for r, (s, _, _) in done.items()} == {0: 1, 1: 1}, done
        assert "node1 (rank 1) stalled at step 2 (step)" in done[0][2], done[0]
        assert "sent SIGUSR1 to the stalled job; stopping it in 3 s" in done[1][2], done[1]
        assert "STACKS" in done[1][1], done[1]
