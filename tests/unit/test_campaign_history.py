"""The fault campaign's invariants (tests/multihost/history.py) over synthetic histories."""

from __future__ import annotations

import json

from tests.multihost import history
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
