"""Short runs of the fault campaign (campaign.py): every fault kind once, invariants at 0.

The long run (200 rounds and more, figures in docs/reliability.md) is the same code:
``python -m tests.multihost.campaign --rounds 200``.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import require
from tests.multihost import campaign

#: One of each fault but the relay's, in the order given (--cycle), with a job every third.
EVERY_FAULT = tuple(f for f in campaign.FAULTS if f != "kill_relay")


def run(netns_session: str | None, options: campaign.Options) -> dict[str, object]:
    require(netns_session is None, f"multi-host tier: {netns_session}")
    lines: list[str] = []
    summary = campaign.execute(options, out=lines.append)
    assert lines[0].startswith("seed "), lines[:1]  # a run can always be replayed
    violations = summary["violations"]
    assert isinstance(violations, dict)
    assert sum(violations.values()) == 0, "\n".join(lines)
    return summary


def test_every_fault_once_on_five_nodes_keeps_every_invariant(
    tmp_path: Path, netns_session: str | None
) -> None:
    options = campaign.Options(
        rounds=len(EVERY_FAULT), seed=22, faults=EVERY_FAULT, cycle=True, keep=tmp_path / "run"
    )
    summary = run(netns_session, options)
    assert summary["rounds"] == len(EVERY_FAULT)
    assert summary["faults"] == dict.fromkeys(EVERY_FAULT, 1)
    assert summary["jobs"] == {"run": 4, "completed": 4}
    detected = summary["liveness_detection_s"]
    assert isinstance(detected, dict) and detected["n"] > 0  # liveness was really checked


def test_a_killed_relay_is_named_and_its_group_recovers(
    tmp_path: Path, netns_session: str | None
) -> None:
    options = campaign.Options(
        rounds=2,
        seed=7,
        faults=("kill_relay", "kill_worker"),
        relay_group=2,
        job_every=2,
        cycle=True,
        keep=tmp_path / "run",
    )
    summary = run(netns_session, options)
    assert summary["faults"] == {"kill_relay": 1, "kill_worker": 1}
    assert summary["jobs"] == {"run": 1, "completed": 1}
