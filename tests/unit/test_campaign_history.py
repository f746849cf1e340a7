"""The fault campaign's invariants (tests/multihost/history.py) over synthetic histories."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from tests.multihost import history, supervised
from tests.multihost.history import DOWN, STARTING, UP, Sample, Usage


def ready(t: float, node: str, generation: str, **env: str) -> Sample:
    served = {
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "WORLD_SIZE": "3",
        "RALLYPOINT_GENERATION": generation,
    }
    served.update(env)
    return Sample(t, node, UP, UP, True, True, served, {"down": []})


def waiting(t: float, node: str, down: tuple[str, ...] = ()) -> Sample:
    liveness = {"down": [{"host": host, "rank": 0} for host in down]}
    return Sample(t, node, UP, UP, True, False, None, liveness)


def test_nodes_ready_on_one_generation_with_the_same_values_agree() -> None:
    check = history.AgreementCheck()
    found = [check.feed(ready(t, n, "e1.1")) for t, n in enumerate(["a", "b", "c"])]
    assert found == [[], [], []]


def test_two_masters_on_one_generation_break_agreement() -> None:
    check = history.AgreementCheck()
    assert check.feed(ready(1.0, "a", "e1.1")) == []
    [violation] = check.feed(ready(2.0, "b", "e1.1", MASTER_ADDR="10.0.0.9"))
    assert violation.invariant == "agreement"
    assert "MASTER_ADDR" in violation.detail and "first: a" in violation.detail


def test_a_different_tf_cluster_on_one_generation_breaks_agreement() -> None:
    check = history.AgreementCheck()
    one = json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"index": 0}})
    other = json.dumps({"cluster": {"worker": ["b:1", "a:1"]}, "task": {"index": 1}})
    same = json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"index": 1}})
    assert check.feed(ready(1.0, "a", "e1.2", TF_CONFIG=one)) == []
    assert check.feed(ready(2.0, "b", "e1.2", TF_CONFIG=same)) == []
    [violation] = check.feed(ready(3.0, "c", "e1.2", TF_CONFIG=other))
    assert "TF_CONFIG.cluster" in violation.detail


def test_a_new_generation_may_change_the_master() -> None:
    check = history.AgreementCheck()
    assert check.feed(ready(1.0, "a", "e1.1")) == []
    assert check.feed(ready(2.0, "a", "e1.2", MASTER_ADDR="10.0.0.9")) == []


def test_not_ready_answers_are_not_checked_for_agreement() -> None:
    check = history.AgreementCheck()
    assert check.feed(ready(1.0, "a", "e1.1")) == []
    assert check.feed(waiting(2.0, "b")) == []


def test_a_generation_going_back_on_a_node_is_a_violation() -> None:
    check = history.MonotonicCheck()
    assert check.feed(ready(1.0, "a", "e1.3")) == []
    assert check.feed(ready(2.0, "a", "e1.3")) == []
    [violation] = check.feed(ready(3.0, "a", "e1.2"))
    assert violation.invariant == "monotonic" and "e1.2 after e1.3" in violation.detail


def test_a_new_epoch_is_forward_but_an_old_one_again_is_not() -> None:
    check = history.MonotonicCheck()
    assert check.feed(ready(1.0, "a", "e1.7")) == []
    assert check.feed(ready(2.0, "a", "e2.1")) == []
    [violation] = check.feed(ready(3.0, "a", "e1.8"))
    assert "epoch e1 again" in violation.detail


def test_generations_are_tracked_per_node() -> None:
    check = history.MonotonicCheck()
    assert check.feed(ready(1.0, "a", "e1.5")) == []
    assert check.feed(ready(2.0, "b", "e1.2")) == []


def test_a_malformed_generation_is_a_violation() -> None:
    [violation] = history.MonotonicCheck().feed(ready(1.0, "a", "seven"))
    assert "malformed" in violation.detail


def test_unanswered_polls_count_only_while_the_sidecar_was_meant_up() -> None:
    samples = [
        Sample(1.0, "a", UP, UP, False, error="timeout"),
        Sample(2.0, "a", UP, DOWN, False, error="refused"),
        Sample(3.0, "a", STARTING, UP, False, error="refused"),
        Sample(4.0, "a", UP, UP, True),
    ]
    [violation] = history.api_failures(samples)
    assert violation.t == 1.0 and "timeout" in violation.detail


def test_convergence_is_when_every_node_is_ready_on_one_generation() -> None:
    samples = [
        ready(1.0, "a", "e1.2"),
        ready(1.5, "b", "e1.1"),  # an older generation: not yet
        waiting(2.0, "c"),
        ready(2.5, "b", "e1.2"),
        ready(3.0, "c", "e1.2"),
    ]
    assert history.converged_at(samples, ["a", "b", "c"], 0.0) == 3.0
    assert history.converged_at(samples[:4], ["a", "b", "c"], 0.0) is None
    # Answers before the heal do not count.
    assert history.converged_at(samples, ["a", "b", "c"], 1.2) is None


def test_detection_measures_each_observer_and_names_the_late_ones() -> None:
    samples = [
        waiting(1.0, "a"),
        waiting(2.0, "a", down=("c",)),
        waiting(3.0, "b"),
        waiting(20.0, "b", down=("c",)),  # past the bound
    ]
    found = history.detection(samples, [("a", "c"), ("b", "c")], fault_t=0.5, bound_s=10.0)
    assert found.delays == {("a", "c"): 1.5}
    [late] = found.violations
    assert late.node == "b" and "did not name c down within 10 s" in late.detail


def test_an_observer_without_a_liveness_section_is_one_violation() -> None:
    samples = [Sample(1.0, "a", UP, UP, True, False, None, None)] * 3
    found = history.detection(samples, [("a", "c")], fault_t=0.0, bound_s=5.0)
    [violation] = found.violations
    assert "no liveness section" in violation.detail


def test_cleared_is_when_no_node_names_anyone_down() -> None:
    samples = [waiting(1.0, "a", down=("c",)), waiting(2.0, "b"), waiting(3.0, "a")]
    assert history.cleared_at(samples, ["a", "b"], 0.0) == 3.0
    assert history.cleared_at(samples[:2], ["a", "b"], 0.0) is None


def test_crash_lines_find_tracebacks_and_internal_errors() -> None:
    log = "\n".join(
        [
            '{"event": "ready"}',
            "Traceback (most recent call last):",
            '{"event": "rendezvous_crashed"}',
            '{"reason": "internal_error"}',
        ]
    )
    assert len(history.crash_lines(log)) == 3
    assert history.crash_lines('{"event": "peer_down"}\n') == []


def test_growth_names_an_fd_leak_and_an_rss_leak_after_warm_up() -> None:
    flat = [Usage(r, 30, 50_000) for r in range(1, 30)]
    assert history.growth({"a:1": flat}) == []
    fds = [Usage(r, 30 + r, 50_000) for r in range(1, 30)]
    [fd_leak] = history.growth({"a:1": fds})
    assert "fds 31" in fd_leak.detail
    warm = [Usage(r, 30, 20_000 if r < 5 else 50_000) for r in range(1, 20)]
    assert history.growth({"a:1": warm}) == []  # growth before warm-up is imports, not a leak
    rss = [*flat, Usage(40, 30, 80_000)]
    [rss_leak] = history.growth({"a:1": rss})
    assert "RSS 50000 KiB" in rss_leak.detail


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert history.percentile(values, 50) == 50.0
    assert history.percentile(values, 99) == 99.0
    assert history.percentile([3.0], 99) == 3.0
    assert history.percentile([], 50) is None


# supervised-job rounds (tests/multihost/supervised.py) ------------------------------------


def run_log(
    node: str,
    status: int | None,
    *,
    steps: int = 2,
    fail: tuple[float, int] | None = None,
    sigterm: float | None = None,
    done: bool = False,
    first: str | None = None,
) -> str:
    """A `run` log as steps.py and `run` write it (stamps from 100.0, one a second)."""
    lines = [f'STEP {{"at": {100.0 + s}, "rank": 0, "step": {s}}}' for s in range(steps)]
    if fail is not None:
        lines.append(f'FAIL {{"at": {fail[0]}, "code": {fail[1]}, "rank": 2}}')
    if sigterm is not None:
        lines.append(f'SIGTERM {{"at": {sigterm}, "rank": 0}}')
    if done:
        lines.append(f'DONE {{"at": 120.0, "rank": 0, "steps": {steps}}}')
    if first is not None:
        lines.append(f"rallypoint: stopping the job: {first}")
        lines.append(f"rallypoint: {first}; exit {status}")
    return "\n".join(["[W gloo] a torch warning", *lines, ""])


def stopped_by(what: str, status: int, sigterm: float, host: str = "sub2", rank: int = 2) -> str:
    first = f"first failure: {host} (rank {rank}) {what}, 0.4 s before this node's stop"
    return run_log("x", status, sigterm=sigterm, first=first)


def logs(texts: Mapping[str, tuple[int | None, str]]) -> dict[str, supervised.RunLog]:
    return {n: supervised.parse_run(n, status, text) for n, (status, text) in texts.items()}


def test_a_run_log_gives_steps_fail_sigterm_done_and_the_first_failure() -> None:
    first = "first failure: sub3 (rank 3) lost: nothing heard for 6 s (timed out: 10.213.0.13:7781: TimeoutError), 7.2 s before this node's stop"  # noqa: E501
    log = supervised.parse_run("a", 75, run_log("a", 75, steps=3, sigterm=110.5, first=first))
    assert log.steps == (100.0, 101.0, 102.0) and log.sigterm_at == 110.5
    assert log.first is not None and log.stopped
    assert (log.first.host, log.first.rank, log.first.status) == ("sub3", 3, 75)
    assert log.first.what.startswith("lost: nothing heard for 6 s (timed out")
    healthy = supervised.parse_run("b", 0, run_log("b", 0, done=True))
    assert healthy.done_at == 120.0 and healthy.first is None and not healthy.stopped


def test_first_failure_of_a_run_whose_own_job_failed_has_no_status() -> None:
    own = "rallypoint: first failure: sub2 (rank 2) exited 7, 0.0 s before this node's stop"
    parsed = supervised.parse_first(own)
    assert parsed is not None and (parsed.host, parsed.what, parsed.status) == (
        "sub2", "exited 7", None,
    )  # fmt: skip
    assert (
        supervised.parse_first("rallypoint: stopping the job: first failure: x (rank 1) y") is None
    )


def failure_round(others: dict[str, tuple[int | None, str]]) -> supervised.JobVerdict:
    fault = supervised.JobFault("job_fail", "sub2", 2, code=7)
    culprit = (7, run_log("sub2", 7, fail=(103.0, 7)))
    return supervised.check(fault, logs({"sub2": culprit, **others}))


def test_a_failure_stopping_every_other_node_in_time_is_no_violation() -> None:
    verdict = failure_round({
        "main1": (7, stopped_by("exited 7", 7, 103.4)),
        "sub1": (7, stopped_by("exited 7", 7, 104.5)),
    })  # fmt: skip
    assert verdict.violations == []
    assert verdict.latencies == {"main1": pytest.approx(0.4), "sub1": pytest.approx(1.5)}


def test_a_late_stop_a_wrong_status_and_a_missed_stop_are_violations() -> None:
    verdict = failure_round({
        "main1": (7, stopped_by("exited 7", 7, 109.0)),   # 6 s after the FAIL line
        "sub1": (1, run_log("sub1", 1)),                  # its collective failed by itself
        "sub3": (75, stopped_by("exited 7", 75, 103.2)),  # the wrong status
    })  # fmt: skip
    found = sorted((v.invariant, v.node, v.detail) for v in verdict.violations)
    assert all(invariant == "stop" for invariant, _, _ in found)
    details = "\n".join(f"{node}: {detail}" for _, node, detail in found)
    assert "main1: job_fail: its job was stopped 6.00 s after the failure of sub2" in details
    assert "sub1: job_fail: its run exited 1, not 7" in details
    assert "sub1: job_fail: its job was never signalled" in details
    assert "sub1: job_fail: its run named no first failure" in details
    assert "sub3: job_fail: its run exited 75, not 7" in details


def test_stopped_nodes_naming_another_first_failure_are_violations() -> None:
    verdict = failure_round({
        "main1": (7, stopped_by("exited 7", 7, 103.4)),
        "sub1": (7, stopped_by("exited 7", 7, 103.5, host="sub4", rank=4)),
    })  # fmt: skip
    details = [v.detail for v in verdict.violations]
    assert any("names sub4 (rank 4) first, not sub2 (rank 2)" in d for d in details)
    assert any("different first failures" in d for d in details)


def test_the_rank_told_to_fail_must_fail_and_exit_its_code() -> None:
    fault = supervised.JobFault("job_fail", "sub2", 2, code=7)
    verdict = supervised.check(fault, logs({"sub2": (0, run_log("sub2", 0, done=True))}))
    assert [v.invariant for v in verdict.violations] == ["job"]


def test_a_lost_node_is_timed_from_the_kill_against_its_own_bound() -> None:
    fault = supervised.JobFault("job_lost", "sub3", 3, at=101.5, bound_s=11.5)
    lost = "lost: nothing heard for 6 s (timed out)"
    verdict = supervised.check(fault, logs({
        "sub3": (-9, run_log("sub3", -9)),  # the vanished node: not judged
        "main1": (75, stopped_by(lost, 75, 109.0, host="sub3", rank=3)),
        "sub1": (75, stopped_by(lost, 75, 113.5, host="sub3", rank=3)),
    }))  # fmt: skip
    assert verdict.latencies == {"main1": 7.5, "sub1": 12.0}
    [late] = verdict.violations
    assert late.node == "sub1" and "bound 11.5 s" in late.detail


def test_a_node_stopped_from_outside_exits_143_and_the_others_75() -> None:
    fault = supervised.JobFault("job_outside", "sub1", 1, at=102.0)
    outside = "stopped from outside by SIGTERM"
    texts = {
        "sub1": (143, run_log("sub1", 143, sigterm=102.1)),
        "main1": (75, stopped_by(outside, 75, 102.6, host="sub1", rank=1)),
    }
    verdict = supervised.check(fault, logs(texts))
    assert verdict.violations == [] and verdict.latencies == {"main1": pytest.approx(0.6)}
    texts["sub1"] = (0, run_log("sub1", 0, done=True))
    [violation] = supervised.check(fault, logs(texts)).violations
    assert violation.node == "sub1" and "exited 0, not 143" in violation.detail


def test_healthy_rounds_count_every_stopped_job_as_a_false_stop() -> None:
    fault = supervised.JobFault("job_sidecar_restart", "sub1", 1)
    texts = {
        "main1": (0, run_log("main1", 0, done=True)),
        "sub1": (0, run_log("sub1", 0, done=True)),
        "sub2": (75, stopped_by("lost: nothing heard for 6 s", 75, 108.0, "sub1", 1)),
        "sub3": (None, run_log("sub3", None)),  # still running at the deadline
        "sub4": (1, run_log("sub4", 1)),  # ended 1 by itself: the job failed, no stop
    }
    verdict = supervised.check(fault, logs(texts))
    assert verdict.false_stops == 1
    found = {v.node: v.invariant for v in verdict.violations}
    assert found == {"sub2": "false_stop", "sub3": "job", "sub4": "job"}
    healthy = supervised.JobFault("job_healthy")
    clean = {n: (0, run_log(n, 0, done=True)) for n in ("main1", "sub1")}
    assert supervised.check(healthy, logs(clean)) == supervised.JobVerdict()


def test_ranks_past_needs_every_run_at_that_step() -> None:
    runs = logs(
        {"a": (None, run_log("a", None, steps=2)), "b": (None, run_log("b", None, steps=1))}
    )
    assert supervised.ranks_past(runs.values(), 0)
    assert not supervised.ranks_past(runs.values(), 1)


def test_a_job_failing_on_a_stopped_peer_is_timed_by_its_error_line() -> None:
    fault = supervised.JobFault("job_lost", "sub3", 3, at=101.5, bound_s=11.5)
    lost = "lost: nothing heard for 7 s (timed out)"
    error = 'ERROR {"at": 107.2, "error": "Connection closed by peer", "rank": 0}\n'
    first = f"first failure: sub3 (rank 3) {lost}, 6.1 s before this node's stop"
    cascaded = error + run_log("main1", 75, first=first)  # exits as stopped, no SIGTERM
    runs = {
        "sub4": supervised.parse_run("sub4", 75, stopped_by(lost, 75, 107.0, "sub3", 3)),
        "main1": supervised.parse_run("main1", 75, cascaded),
    }
    verdict = supervised.check(fault, runs)
    assert verdict.violations == [] and verdict.cascaded == ["main1"]
    assert verdict.latencies == {"sub4": 5.5, "main1": pytest.approx(5.7)}
    # The same job's run exiting with the job's own 1: the wrong status.
    runs["main1"] = supervised.parse_run("main1", 1, error + run_log("main1", 1))
    found = [v.detail for v in supervised.check(fault, runs).violations]
    assert any("exited 1, not 75" in d and "peer's closed connection" in d for d in found)


def test_not_done_names_every_sidecar_still_showing_a_job_that_ended() -> None:
    def view(*states: tuple[str, str, int | None]) -> dict[str, object]:
        return {"nodes": [{"host": h, "state": s, "code": c, "what": s} for h, s, c in states]}

    done = view(("main1", "exited", 0), ("sub4", "exited", 0))
    assert supervised.not_done({"main1": done, "sub4": done}) == []
    stale = view(("main1", "exited", 0), ("sub4", "running", None))
    assert supervised.not_done({"main1": stale, "sub4": done, "sub1": None}) == [
        "main1 shows sub4's job as running",
        "main1 shows sub1's job as nothing",
        "sub4 shows sub1's job as nothing",
        "sub1: no answer from GET /job",
    ]


def test_a_healthy_round_whose_job_crashed_by_itself_stops_the_others_rightly() -> None:
    crashed = "first failure: sub4 (rank 4) killed by SIGABRT, 0.5 s before this node's stop"
    texts = {
        "sub4": (134, run_log("sub4", 134, done=True, first=crashed).replace(
            "rallypoint: stopping the job: " + crashed + "\n", "")),
        "main1": (134, stopped_by("killed by SIGABRT", 134, 110.0, "sub4", 4)),
    }  # fmt: skip
    verdict = supervised.check(supervised.JobFault("job_healthy"), logs(texts))
    assert verdict.false_stops == 0
    [violation] = verdict.violations
    assert (violation.invariant, violation.node) == ("job", "sub4")
