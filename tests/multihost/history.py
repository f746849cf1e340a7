"""Pure: the invariants of a fault campaign, checked over what the nodes' local APIs said.

The campaign (campaign.py) polls every node's ``/env`` and ``/status`` for the whole run and
feeds each answer here as a `Sample`; nothing in this module touches a namespace, a socket
or a clock, so every check is unit-tested from synthetic histories
(tests/unit/test_campaign_history.py).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: What the campaign meant a sidecar to be doing when a poll started or ended: running and
#: answering, just (re)started and not answered yet, killed or stopped, or SIGSTOPped.
UP, STARTING, DOWN, PAUSED = "up", "starting", "down", "paused"
#: The served values every node of one generation must agree on (TF_CONFIG: its cluster).
AGREED = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")
#: Lines of a sidecar log that mean it crashed or hid an internal error.
CRASH_MARKERS = ("Traceback", "rendezvous_crashed", "internal_error")
#: Growth over a sidecar's life that counts as a leak (fds: absolute; RSS: relative to the
#: sample after WARMUP_SAMPLES, when imports and caches have settled).
FD_GROWTH = 20
RSS_GROWTH = 0.5
WARMUP_SAMPLES = 10

_GENERATION = re.compile(r"^(?P<epoch>[^.]+)\.(?P<counter>\d+)$")


@dataclass(frozen=True)
class Sample:
    """One poll of a node's local API."""

    t: float
    node: str
    #: The campaign's intent for the sidecar when the poll started and when it ended.
    state: str
    state_after: str
    #: Whether both /env and /status answered (any HTTP status).
    answered: bool
    ready: bool = False
    env: Mapping[str, str] | None = None
    #: /status's liveness section; None when /status did not answer or had none.
    liveness: Mapping[str, Any] | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "t": round(self.t, 3),
            "node": self.node,
            "state": self.state,
            "state_after": self.state_after,
            "answered": self.answered,
            "ready": self.ready,
            "env": None if self.env is None else dict(self.env),
            "liveness": None if self.liveness is None else dict(self.liveness),
            "error": self.error,
        }

    @property
    def down_hosts(self) -> frozenset[str]:
        """The hosts this node names down (empty without a liveness section)."""
        downs = (self.liveness or {}).get("down") or []
        return frozenset(str(d.get("host")) for d in downs if isinstance(d, Mapping))


@dataclass(frozen=True)
class Violation:
    """One broken invariant: which, when (monotonic), on which node, and what was seen."""

    invariant: str
    t: float
    node: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.node}: {self.detail}"


def parse_generation(generation: str) -> tuple[str, int] | None:
    """``"<epoch>.<counter>"`` (masterbook.py) as (epoch, counter); None when malformed."""
    match = _GENERATION.match(generation)
    return None if match is None else (match["epoch"], int(match["counter"]))


def agreed_values(env: Mapping[str, str]) -> tuple[str | None, ...]:
    """What nodes of one generation must serve alike; TF_CONFIG reduced to its cluster."""
    tf_cluster: str | None = None
    raw = env.get("TF_CONFIG")
    if raw is not None:
        try:
            tf_cluster = json.dumps(json.loads(raw).get("cluster"), sort_keys=True)
        except (ValueError, AttributeError):
            tf_cluster = f"unparsable: {raw}"
    return (*(env.get(key) for key in AGREED), tf_cluster)


class AgreementCheck:
    """No two nodes ever ready on one generation with different agreed values."""

    def __init__(self) -> None:
        self._first: dict[str, tuple[str, tuple[str | None, ...]]] = {}

    def feed(self, sample: Sample) -> list[Violation]:
        if not sample.ready or sample.env is None:
            return []
        generation = sample.env.get("RALLYPOINT_GENERATION")
        if generation is None:
            return [Violation("agreement", sample.t, sample.node, "ready without a generation")]
        values = agreed_values(sample.env)
        seen = self._first.setdefault(generation, (sample.node, values))
        if seen[1] == values:
            return []
        names = (*AGREED, "TF_CONFIG.cluster")
        differ = {n: (a, b) for n, a, b in zip(names, seen[1], values, strict=True) if a != b}
        return [
            Violation(
                "agreement", sample.t, sample.node,
                f"generation {generation}: {differ} (first: {seen[0]}, then: {sample.node})",
            )
        ]  # fmt: skip


class MonotonicCheck:
    """Per node, generations never go back: no older counter of an epoch, no older epoch."""

    def __init__(self) -> None:
        #: node -> epochs in the order served, and the highest counter of the current one.
        self._epochs: dict[str, list[str]] = {}
        self._counter: dict[str, int] = {}

    def feed(self, sample: Sample) -> list[Violation]:
        if not sample.ready or sample.env is None:
            return []
        raw = sample.env.get("RALLYPOINT_GENERATION", "")
        parsed = parse_generation(raw)
        if parsed is None:
            return [Violation("monotonic", sample.t, sample.node, f"malformed generation {raw!r}")]
        epoch, counter = parsed
        epochs = self._epochs.setdefault(sample.node, [])
        if not epochs or epochs[-1] != epoch:
            if epoch in epochs:
                return [
                    Violation(
                        "monotonic", sample.t, sample.node,
                        f"served {raw} of epoch {epoch} again after epoch {epochs[-1]}",
                    )
                ]  # fmt: skip
            epochs.append(epoch)
            self._counter[sample.node] = counter
            return []
        last = self._counter[sample.node]
        if counter < last:
            return [
                Violation(
                    "monotonic", sample.t, sample.node,
                    f"served {raw} after {epoch}.{last}",
                )
            ]  # fmt: skip
        self._counter[sample.node] = counter
        return []


def api_failures(samples: Iterable[Sample]) -> list[Violation]:
    """Polls that got no answer while the sidecar was meant to be up from start to end."""
    return [
        Violation("api", s.t, s.node, f"local API did not answer: {s.error}")
        for s in samples
        if not s.answered and s.state == UP and s.state_after == UP
    ]


def converged_at(samples: Iterable[Sample], nodes: Sequence[str], after_t: float) -> float | None:
    """The first time at or after ``after_t`` when every node's latest answer is ready, on
    one generation; None if that never happened in ``samples``."""
    latest: dict[str, str | None] = {}
    for sample in sorted((s for s in samples if s.t >= after_t), key=lambda s: s.t):
        env = sample.env if sample.ready else None
        latest[sample.node] = None if env is None else env.get("RALLYPOINT_GENERATION")
        values = [latest.get(node) for node in nodes]
        if None not in values and len(set(values)) == 1:
            return sample.t
    return None


@dataclass
class Detection:
    """How long each observer took to name a faulted host down; the violations found."""

    delays: dict[tuple[str, str], float] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)


def detection(
    samples: Iterable[Sample],
    expected: Iterable[tuple[str, str]],
    fault_t: float,
    bound_s: float,
) -> Detection:
    """Whether each (observer, host) pair saw ``host`` named down by ``observer`` within
    ``bound_s`` of ``fault_t``; an observer answering without a liveness section is a
    violation of its own."""
    pairs = list(expected)
    observers = {observer for observer, _ in pairs}
    found = Detection()
    missing: set[str] = set()
    window = sorted(
        (s for s in samples if fault_t <= s.t <= fault_t + bound_s and s.node in observers),
        key=lambda s: s.t,
    )
    for sample in window:
        if sample.answered and sample.liveness is None and sample.node not in missing:
            missing.add(sample.node)
            found.violations.append(
                Violation("liveness", sample.t, sample.node, "no liveness section in /status")
            )
        for observer, host in pairs:
            key = (observer, host)
            if sample.node == observer and key not in found.delays and host in sample.down_hosts:
                found.delays[key] = sample.t - fault_t
    for observer, host in pairs:
        if (observer, host) not in found.delays and observer not in missing:
            found.violations.append(
                Violation(
                    "liveness", fault_t + bound_s, observer,
                    f"did not name {host} down within {bound_s:g} s of the fault",
                )
            )  # fmt: skip
    return found


def cleared_at(samples: Iterable[Sample], nodes: Sequence[str], after_t: float) -> float | None:
    """The first time at or after ``after_t`` when no node's latest answer names anyone down."""
    latest: dict[str, frozenset[str] | None] = {}
    for sample in sorted((s for s in samples if s.t >= after_t), key=lambda s: s.t):
        if sample.answered and sample.liveness is not None:
            latest[sample.node] = sample.down_hosts
        elif sample.answered:
            latest[sample.node] = None
        values = [latest.get(node) for node in nodes]
        if all(v is not None and not v for v in values):
            return sample.t
    return None


def crash_lines(text: str) -> list[str]:
    """The lines of a sidecar log that show a crash or an internal error."""
    return [line for line in text.splitlines() if any(m in line for m in CRASH_MARKERS)]


@dataclass(frozen=True)
class Usage:
    """One sample of a sidecar process's resources, at the end of a round."""

    round: int
    fds: int
    rss_kib: int


def growth(series: Mapping[str, Sequence[Usage]]) -> list[Violation]:
    """Leaks over each process's life (key: ``node:pid``): fds up by more than FD_GROWTH,
    or RSS more than RSS_GROWTH above its level after WARMUP_SAMPLES samples."""
    out: list[Violation] = []
    for key, usage in series.items():
        if len(usage) < 2:
            continue
        first, last = usage[0], usage[-1]
        if last.fds - first.fds > FD_GROWTH:
            out.append(
                Violation(
                    "resources", float(last.round), key,
                    f"fds {first.fds} (round {first.round}) -> {last.fds} (round {last.round})",
                )
            )  # fmt: skip
        if len(usage) > WARMUP_SAMPLES:
            base = usage[WARMUP_SAMPLES - 1]
            if last.rss_kib > base.rss_kib * (1 + RSS_GROWTH):
                out.append(
                    Violation(
                        "resources", float(last.round), key,
                        f"RSS {base.rss_kib} KiB (round {base.round}) -> {last.rss_kib} KiB "
                        f"(round {last.round})",
                    )
                )  # fmt: skip
    return out


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100, nearest rank) of values; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]
