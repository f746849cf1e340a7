"""The campaign's hang rounds (supervised.py job_stall, job_checkpoint), checked from
synthetic `run` logs as steps.py and `rallypoint run` write them."""

from __future__ import annotations

from tests.multihost import supervised

#: The hung rank's STALL line; its last mark came a moment before.
STALL_AT = 103.0
BOUND_S = 6.0 + supervised.STOP_BOUND_S
FAULT = supervised.JobFault("job_stall", "sub2", 2, bound_s=BOUND_S)
STALLED = "stalled at step 2 (collective), no progress for 6 s"


def log(
    node: str,
    status: int | None,
    *,
    stall: bool = False,
    sigterm: float | None = None,
    named: tuple[str, int] = ("sub2", 2),
    stopping: bool = True,
    behind: str = "sub2 (rank 2)",
) -> supervised.RunLog:
    lines = [f'STEP {{"at": {100.0 + s}, "rank": 0, "step": {s}}}' for s in range(3)]
    if stall:
        lines.append(f'STALL {{"at": {STALL_AT}, "rank": 2, "step": 3}}')
    if sigterm is not None:
        lines.append(f'SIGTERM {{"at": {sigterm}, "rank": 0}}')
    first = f"first failure: {named[0]} (rank {named[1]}) {STALLED}, 6.1 s before this node's stop"
    if stopping:
        lines.append(f"rallypoint: stopping the job: {first}")
    lines.append(f"rallypoint: {first}; exit {status}")
    lines.append(f"rallypoint: {behind} is behind: its last progress was step 2 (collective)")
    return supervised.parse_run(node, status, "\n".join(lines))


def test_a_hang_named_everywhere_and_stopped_in_time_is_no_violation() -> None:
    runs = {
        "sub2": log("sub2", 1, stall=True, sigterm=109.2),
        "main1": log("main1", 1, sigterm=109.3),
        "sub1": log("sub1", 1, sigterm=109.4),
    }
    verdict = supervised.check(FAULT, runs)
    assert verdict.violations == []
    assert runs["sub2"].stall_at == STALL_AT
    assert set(verdict.latencies) == {"main1", "sub1"}


def test_the_wrong_node_named_a_late_stop_and_a_wrong_status_are_violations() -> None:
    runs = {
        "sub2": log("sub2", 1, stall=True, sigterm=109.2),
        "main1": log("main1", 1, sigterm=109.3, named=("sub1", 1)),
        "sub1": log("sub1", 75, sigterm=STALL_AT + BOUND_S + 1.0),
    }
    found = "\n".join(f"{v.node}: {v.detail}" for v in supervised.check(FAULT, runs).violations)
    assert "main1: job_stall: names sub1 (rank 1) first, not sub2 (rank 2)" in found, found
    assert "sub1: job_stall: its run exited 75, not 1" in found, found
    assert "sub1: job_stall: its job was stopped 12.00 s after the failure of sub2" in found, found


def test_the_hung_rank_must_say_so_exit_1_and_name_itself() -> None:
    others = {"main1": log("main1", 1, sigterm=109.3), "sub1": log("sub1", 1, sigterm=109.3)}
    silent = supervised.check(FAULT, {"sub2": log("sub2", 1), **others})
    assert [v.detail for v in silent.violations] == [
        "job_stall: no STALL line from the rank told to hang"
    ]
    wrong = supervised.check(FAULT, {"sub2": log("sub2", 143, stall=True), **others})
    assert [v.invariant for v in wrong.violations] == ["stop"], wrong.violations
    blames = supervised.check(
        FAULT, {"sub2": log("sub2", 1, stall=True, named=("main1", 0)), **others}
    )
    assert any("hung, but names another" in v.detail for v in blames.violations), blames


def test_a_checkpoint_round_stopped_by_a_stall_is_a_false_stop() -> None:
    fault = supervised.JobFault("job_checkpoint")
    done = "\n".join(
        ['STEP {"at": 100.0, "rank": 0, "step": 0}', 'DONE {"at": 120.0, "rank": 0, "steps": 6}']
    )
    runs = {
        "main1": supervised.parse_run("main1", 0, done),
        "sub1": log("sub1", 1, sigterm=109.0, named=("sub1", 1)),
    }
    verdict = supervised.check(fault, runs)
    assert verdict.false_stops == 1
    assert [v.invariant for v in verdict.violations] == ["false_stop"], verdict.violations


def test_every_node_must_say_the_hung_rank_is_behind() -> None:
    runs = {
        "sub2": log("sub2", 1, stall=True, sigterm=109.2),
        "main1": log("main1", 1, sigterm=109.3, behind="sub1 (rank 1)"),
        "sub1": log("sub1", 1, sigterm=109.4),
    }
    found = [f"{v.node}: {v.detail}" for v in supervised.check(FAULT, runs).violations]
    assert found == ["main1: job_stall: says sub1 is behind, not sub2"], found
