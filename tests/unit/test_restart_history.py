"""The campaign's restart-round invariants (tests/multihost/restarted.py) over synthetic logs."""

from __future__ import annotations

import json
from collections.abc import Iterable

from tests.multihost import restarted
from tests.multihost.restarted import NodeRun, RestartFault

NODES = ("main1", "sub1", "sub2")


def say(kind: str, **fields: object) -> str:
    return f"{kind} {json.dumps(fields)}"


def attempt(number: int, at: float, *, end: str = "DONE", resumed: int = -1) -> list[str]:
    """One attempt's child: launched at ``at``, joined, two steps, then ``end``."""
    out = [
        say("LAUNCH", attempt=number, at=at),
        say("START", rank=0, attempt=number, **{"from": resumed}, at=at + 1),
        say("STEP", rank=0, step=resumed + 1, at=at + 2),
    ]
    if end:
        out.append(say(end, rank=0, at=at + 3))
    return out


def crash_then_done(first: str, *, base: int = 0) -> list[str]:
    """Attempt ``base`` stopped by ``first``, the next one done (as cli/jobview.py says it)."""
    said = f"first failure{f' in attempt {base}' if base else ''}: {first}"
    return [
        *attempt(base, 10.0, end="SIGTERM"),
        f"rallypoint: stopping the job: {said}, 0.1 s before this node's stop",
        f"rallypoint: {said}, 0.1 s before this node's stop; exit 3",
        "rallypoint: restarting: attempt 1 on every node (1 of --restarts 2)",
        *attempt(base + 1, 20.0, resumed=1),
    ]


def parsed(texts: dict[str, Iterable[str]], status: int | None = 0) -> dict[str, NodeRun]:
    return {n: restarted.parse(n, status, ["\n".join(lines)]) for n, lines in texts.items()}


def crash_fault(**kw: object) -> RestartFault:
    return RestartFault(**{"kind": "restart_crash", "target": "sub2", "rank": 2, "budget": 2, **kw})  # type: ignore[arg-type]


def kinds(found: list[object]) -> list[str]:
    return sorted(v.invariant for v in found)  # type: ignore[attr-defined]


GOOD_VIEW = [(0, "sub2", "exited", 3)]


def test_a_crash_restarted_once_and_completed_keeps_every_invariant() -> None:
    runs = parsed({n: crash_then_done("sub2 (rank 2) exited 3") for n in NODES})
    assert [a.number for a in runs["sub1"].attempts] == [0, 1]
    assert runs["sub1"].firsts == {0: "sub2 (rank 2) exited 3"}
    assert runs["sub1"].restarting == [1]
    assert restarted.check(crash_fault(), runs, dict.fromkeys(NODES, GOOD_VIEW), 0.0) == []


def test_a_job_that_did_not_complete_within_its_budget_is_a_violation() -> None:
    runs = parsed({n: crash_then_done("sub2 (rank 2) exited 3") for n in NODES})
    runs["sub1"].status = 3
    found = restarted.check(crash_fault(), runs, dict.fromkeys(NODES, GOOD_VIEW), 0.0)
    assert kinds(found) == ["complete"]
    assert "sub1" in str(found[0])


def test_more_faults_than_the_budget_need_not_complete() -> None:
    runs = parsed({n: attempt(0, 10.0, end="SIGTERM") for n in NODES}, status=3)
    fault = RestartFault("restart_crash_twice", "sub2", 2, 1, second="sub1")
    assert kinds(restarted.check(fault, runs, {}, 0.0)) == []


def test_an_attempt_launched_before_the_last_one_ended_everywhere_overlaps() -> None:
    texts = {n: crash_then_done("sub2 (rank 2) exited 3") for n in NODES}
    # main1's attempt 0 still said something at 21.5: attempt 1 launched at 20 elsewhere.
    texts["main1"].insert(3, say("STEP", rank=0, step=9, at=21.5))
    found = restarted.check(crash_fault(), parsed(texts), dict.fromkeys(NODES, GOOD_VIEW), 0.0)
    assert kinds(found) == ["overlap"]
    assert "1.500 s before attempt 0 ended on main1" in str(found[0])


def test_an_attempt_on_fewer_nodes_than_the_world_is_a_violation() -> None:
    texts = {n: crash_then_done("sub2 (rank 2) exited 3") for n in NODES}
    texts["sub1"] = [*attempt(0, 10.0, end="SIGTERM")]
    runs = parsed(texts)
    runs["sub1"].status = 3
    found = restarted.check(crash_fault(), runs, dict.fromkeys(NODES, GOOD_VIEW), 0.0)
    assert "world" in kinds(found)
    assert "attempt 1 launched on 2 of 3 nodes" in " ".join(map(str, found))


def test_a_node_stopped_in_an_attempt_before_its_child_said_a_word_took_part_in_it() -> None:
    """A peer failed as attempt 1 launched: one node's child was stopped before its LAUNCH
    line, and its run said it stopped in attempt 1; then attempt 2 ran everywhere."""
    crash = crash_then_done("sub2 (rank 2) exited 3")
    second = "first failure in attempt 1: main1 (rank 0) exited 5"
    texts = {n: [*crash[:-4], *attempt(1, 20.0, end="SIGTERM"), *attempt(2, 30.0)] for n in NODES}
    texts["sub1"] = [
        *crash[:-4],
        f"rallypoint: stopping the job: {second}",
        *attempt(2, 30.0),
    ]
    fault = crash_fault(kind="restart_crash_twice", budget=3, second="main1")
    runs = parsed(texts)
    assert "world" not in kinds(restarted.check(fault, runs, {}, 0.0))
    texts["sub1"].remove(f"rallypoint: stopping the job: {second}")
    found = restarted.check(fault, parsed(texts), {}, 0.0)
    assert "attempt 1 launched on 2 of 3 nodes" in " ".join(map(str, found))


def test_nodes_naming_different_first_failures_disagree() -> None:
    texts = {n: crash_then_done("sub2 (rank 2) exited 3") for n in NODES}
    texts["sub1"] = crash_then_done("main1 (rank 0) exited 1")
    found = restarted.check(crash_fault(), parsed(texts), dict.fromkeys(NODES, GOOD_VIEW), 0.0)
    assert kinds(found) == ["attempt_agreement", "attempt_agreement"]  # differs; names main1


def test_sidecars_whose_earlier_attempts_differ_disagree() -> None:
    runs = parsed({n: crash_then_done("sub2 (rank 2) exited 3") for n in NODES})
    views = {"main1": GOOD_VIEW, "sub1": GOOD_VIEW, "sub2": [(0, "sub1", "exited", 3)]}
    found = restarted.check(crash_fault(), runs, views, 0.0)
    assert kinds(found) == ["attempt_agreement", "attempt_agreement"]


def test_only_the_rounds_own_attempts_are_compared() -> None:
    """A sidecar restarted in an earlier round knows fewer of the attempts before."""
    runs = parsed({n: crash_then_done("sub2 (rank 2) exited 3", base=5) for n in NODES})
    now = [(5, "sub2", "exited", 3)]
    views = {"main1": [(2, "sub1", "lost", None), *now], "sub1": now, "sub2": now}
    assert restarted.check(crash_fault(base=5), runs, views, 0.0) == []


def test_a_run_that_ends_in_the_wrong_attempt_is_a_violation() -> None:
    runs = parsed({n: crash_then_done("sub2 (rank 2) exited 3", base=5) for n in NODES})
    found = restarted.check(crash_fault(base=4), runs, {}, 0.0)
    assert "complete" in kinds(found)


def test_a_node_lost_for_good_ends_every_other_node_with_75_and_starts_nothing() -> None:
    lost = "sub2 (rank 2) lost: nothing heard for 6.0 s"
    texts = {
        n: [
            *attempt(0, 10.0, end="SIGTERM"),
            f"rallypoint: stopping the job: first failure: {lost}",
            f"rallypoint: first failure: {lost}; exit 75",
            "rallypoint: restarting: attempt 1 on every node (1 of --restarts 1)",
            f"{restarted.GAVE_UP} 5s; exit 75",
        ]
        for n in ("main1", "sub1")
    }
    texts["sub2"] = attempt(0, 10.0, end="")
    runs = parsed(texts, status=75)
    runs["sub2"].status = -9
    fault = RestartFault("restart_lost_for_good", "sub2", 2, 1)
    views = {n: [(0, "sub2", "lost", None)] for n in ("main1", "sub1")}
    assert restarted.check(fault, runs, views, 0.0) == []
    runs["main1"].gave_up = False
    assert kinds(restarted.check(fault, runs, views, 0.0)) == ["complete"]


def test_a_restart_without_a_fault_is_a_false_stop() -> None:
    runs = parsed({n: attempt(0, 10.0) for n in NODES})
    fault = RestartFault("restart_sidecar", "sub1", 1, 1)
    assert restarted.check(fault, runs, {}, 0.0) == []
    lost = "sub1 (rank 1) lost: nothing heard for 6.0 s"
    runs = parsed({n: crash_then_done(lost) for n in NODES})
    assert "false_stop" in kinds(restarted.check(fault, runs, {}, 0.0))


def test_a_node_back_from_a_loss_reads_as_one_node_over_its_two_runs() -> None:
    old = attempt(0, 10.0, end="")  # SIGKILLed mid-step: no last word
    again = attempt(1, 25.0, resumed=1)
    run = restarted.parse("sub2", 0, ["\n".join(old), "\n".join(again)])
    assert [(a.number, a.done) for a in run.attempts] == [(0, False), (1, True)]


def test_the_next_attempt_is_timed_to_its_launch_on_the_last_node() -> None:
    texts = {n: crash_then_done("sub2 (rank 2) exited 3") for n in NODES}
    texts["sub2"] = [say("FAIL", rank=2, code=3, at=12.5) if "SIGTERM" in x else x
                     for x in texts["sub2"]]  # fmt: skip
    texts["sub1"][-4] = say("LAUNCH", attempt=1, at=21.25)  # the last node to launch it
    runs = parsed(texts)
    failed_at = runs["sub2"].attempts[0].failed_at
    assert failed_at == 12.5
    assert restarted.relaunched_after(runs, 1, failed_at) == 8.75
    assert restarted.relaunched_after(runs, 2, failed_at) is None  # never launched
