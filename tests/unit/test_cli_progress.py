"""The progress of `wait` and `exec`: the lines, the live line on a terminal, the counts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from rallypoint.cli import client, progress
from rallypoint.errors import NotReady, SidecarUnreachable

JOIN = {"code": "waiting_for_join", "message": "1 of 3 nodes have not joined yet: n2"}
CHECK = {"code": "cluster_checking", "message": "this node passed its checks; waiting for n1"}
STATUS = {
    "role": "master",
    "spec": {"nnodes": 3},
    "peers": [{"joined": True}, {"joined": True}, {"joined": False}],
    "checks": {"verdict": {"pending_count": 2, "failure_count": 1}},
}


def not_ready(*reasons: dict[str, object]) -> NotReady:
    return NotReady("not ready", reasons=reasons)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Fetches:
    def __init__(self, doc: Mapping[str, Any] | None) -> None:
        self.doc, self.calls = doc, 0

    def __call__(self) -> Mapping[str, Any] | None:
        self.calls += 1
        return self.doc


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0, "0.0s"), (3.24, "3.2s"), (59.9, "59.9s"), (65, "1m05s"), (3725, "1h02m")],
)
def test_elapsed(seconds: float, text: str) -> None:
    assert progress.elapsed(seconds) == text


@pytest.mark.parametrize(
    ("doc", "text"),
    [
        (STATUS, "joined 2/3, checks 2/3 pending, 1 failed"),
        ({**STATUS, "checks": {"verdict": None}}, "joined 2/3"),
        ({**STATUS, "role": "discovering"}, ""),
        ({"spec": {"nnodes": 1}, "peers": [{"joined": True}]}, ""),
        (None, ""),
        ({"spec": "broken"}, ""),
    ],
)
def test_counts(doc: Mapping[str, Any] | None, text: str) -> None:
    assert progress.counts(doc) == text


def test_summary_names_the_first_reason_and_counts_the_others() -> None:
    said = progress.summary(not_ready(JOIN, CHECK), STATUS)
    assert said == (
        "waiting_for_join: 1 of 3 nodes have not joined yet: n2"
        " (+1 more, see `rallypoint status`); joined 2/3, checks 2/3 pending, 1 failed"
    )
    assert progress.summary(SidecarUnreachable("no sidecar answers"), STATUS) == (
        "no sidecar answers"
    )


def test_lines_say_each_change_once_and_the_time_at_the_end() -> None:
    written: list[str] = []
    clock, fetches = Clock(), Fetches(STATUS)
    watch = progress.Progress(progress.Lines(written.append), fetches, clock=clock)
    watch(SidecarUnreachable("no sidecar answers"))
    clock.now += 1
    watch(not_ready(JOIN))
    clock.now += 1
    watch(not_ready(JOIN))  # no change: no line, no /status
    clock.now += 1.5
    watch(not_ready(CHECK))
    watch.ready()
    assert "".join(written).splitlines() == [
        "rallypoint: [0.0s] no sidecar answers",
        "rallypoint: [1.0s] waiting_for_join: 1 of 3 nodes have not joined yet: n2; "
        "joined 2/3, checks 2/3 pending, 1 failed",
        "rallypoint: [3.5s] cluster_checking: this node passed its checks; waiting for n1; "
        "joined 2/3, checks 2/3 pending, 1 failed",
        "rallypoint: ready after 3.5s",
    ]
    assert fetches.calls == 2  # once per change of reasons


def test_the_counts_are_fetched_again_after_a_while_without_change() -> None:
    clock, fetches = Clock(), Fetches(STATUS)
    watch = progress.Progress(progress.Lines(lambda _text: None), fetches, clock=clock)
    watch(not_ready(JOIN))
    clock.now += progress.STATUS_EVERY_S - 0.1
    watch(not_ready(JOIN))
    assert fetches.calls == 1
    clock.now += 0.1
    watch(not_ready(JOIN))
    assert fetches.calls == 2


def test_a_failed_status_fetch_still_gives_the_reason() -> None:
    written: list[str] = []
    watch = progress.Progress(progress.Lines(written.append), Fetches(None), clock=Clock())
    watch(not_ready(JOIN))
    assert written == ["rallypoint: [0.0s] " + client.first_reason([JOIN]) + "\n"]


def test_the_terminal_redraws_one_live_line_below_the_lines_that_stay() -> None:
    written: list[str] = []
    clock = Clock()
    screen = progress.Terminal(written.append, lambda: 60)
    watch = progress.Progress(screen, Fetches(None), clock=clock)
    watch(not_ready(JOIN))
    clock.now += 1
    watch(not_ready(JOIN))
    watch.ready()
    live0 = "rallypoint: waiting 0.0s: waiting_for_join: 1 of 3 nodes ha"  # cut to 59
    live1 = "rallypoint: waiting 1.0s: waiting_for_join: 1 of 3 nodes ha"
    assert len(live0) == 59
    assert written == [
        "rallypoint: [0.0s] waiting_for_join: 1 of 3 nodes have not joined yet: n2\n",
        "\r" + live0,
        "\r" + live1,  # redrawn in place: a carriage return, no newline
        "\r" + " " * 59 + "\r",  # taken away before the last line
        "rallypoint: ready after 1.0s\n",
    ]
    assert not any("\x1b" in text for text in written)  # no escape sequences


def test_a_shorter_live_line_blanks_the_rest_of_the_longer_one() -> None:
    written: list[str] = []
    screen = progress.Terminal(written.append, lambda: 80)
    screen.live("a long live line")
    screen.live("short")
    assert written[-1] == "\rshort" + " " * (len("a long live line") - len("short"))


def test_stop_clears_the_live_line_so_the_error_stands_alone() -> None:
    written: list[str] = []
    watch = progress.Progress(
        progress.Terminal(written.append, lambda: 80), Fetches(None), clock=Clock()
    )
    watch(SidecarUnreachable("down"))
    watch.stop()
    assert written[-1] == "\r" + " " * len("rallypoint: waiting 0.0s: down") + "\r"


# --- the one-line reasons of the client ---------------------------------------------------


@pytest.mark.parametrize(
    ("body", "docs"),
    [
        ('{"reasons": [{"code": "a", "message": "m"}]}', [{"code": "a", "message": "m"}]),
        ('{"error": "bad"}', [{"message": "bad"}]),
        ("not ready: starting: x\n", [{"message": "starting: x"}]),
        (
            "not ready: verifying: y (+2 more, see /status)\n",
            [{"message": "verifying: y", "more": 2}],
        ),
        ("", [{"message": "no reason given"}]),
    ],
)
def test_reason_docs(body: str, docs: list[dict[str, object]]) -> None:
    assert client.reason_docs(body) == docs


@pytest.mark.parametrize(
    ("reasons", "text"),
    [
        ([JOIN], "waiting_for_join: 1 of 3 nodes have not joined yet: n2"),
        ([JOIN, CHECK, CHECK], f"{JOIN['code']}: {JOIN['message']} "
                               "(+2 more, see `rallypoint status`)"),
        ([{"message": "verifying: y", "more": 2}],
         "verifying: y (+2 more, see `rallypoint status`)"),
        ([], "no reason given"),
    ],
)  # fmt: skip
def test_first_reason_says_one_remedy(reasons: list[dict[str, object]], text: str) -> None:
    assert client.first_reason(reasons) == text
    assert text.count("see ") <= 1
