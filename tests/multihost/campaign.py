"""A randomized fault campaign on a namespace cluster: inject, hold, heal, check, repeat.

    python -m tests.multihost.campaign --rounds 200 --seed 12345 \\
        --faults kill_worker,pause_master --nodes 5 --out results.json --keep DIR

The rounds are rounds.py's and the fault kinds injections.py's. Every node's local API is
polled for the whole run (watch.py); the invariants over that history are history.py's.
Every ``--supervised-every``-th round is a supervised-job round (job_rounds.py) instead:
`rallypoint run -- steps.py` on every node, a job fault (supervised.py's kinds), and
supervised.py's checks over what every `run` printed. The seed is printed first and
picks every fault, target and hold, so a run can be replayed. Exit code 1 when any
invariant was violated, 2 when the cluster cannot be built here.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.multihost.injections import FAULTS
from tests.multihost.restarted import RESTART_KINDS
from tests.multihost.rounds import Campaign, Options
from tests.multihost.supervised import JOB_KINDS
from tests.support.cluster.runs import close_all, prerequisites, sweep_stale


def render(summary: dict[str, Any]) -> Iterator[str]:
    """The summary as lines for a terminal."""
    yield f"seed {summary['seed']}: {summary['rounds']} rounds on {','.join(summary['nodes'])}"
    yield "faults: " + ", ".join(f"{k} {n}" for k, n in sorted(summary["faults"].items()))
    total = sum(summary["violations"].values())
    yield f"violations: {total} (" + ", ".join(
        f"{k} {n}" for k, n in summary["violations"].items()) + ")"  # fmt: skip
    for kind, spread in summary["convergence_s"].items():
        yield (f"convergence {kind}: n={spread['n']} p50={spread['p50']}s "
               f"p99={spread['p99']}s max={spread['max']}s")  # fmt: skip
    live = summary["liveness_detection_s"]
    checked = "" if summary["liveness_checked"] else " (not checked)"
    yield f"liveness detection: n={live['n']} p50={live['p50']}s p99={live['p99']}s{checked}"
    jobs = summary["jobs"]
    yield f"jobs: {jobs['completed']}/{jobs['run']} completed"
    job_rounds = summary["supervised"]
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(job_rounds["rounds"].items())) or "none"
    yield (f"supervised rounds: {kinds}; false stops: {job_rounds['false_stops']}; "
           f"jobs failing on a peer before their stop: {job_rounds['cascaded']}; "
           f"restart rounds completed: {job_rounds['restarts_completed']}")  # fmt: skip
    for kind, spread in job_rounds["stop_latency_s"].items():
        yield (f"stop latency {kind}: n={spread['n']} p50={spread['p50']}s "
               f"p99={spread['p99']}s max={spread['max']}s")  # fmt: skip
    for kind, spread in job_rounds["relaunched_s"].items():
        yield (f"next attempt launched everywhere {kind}: n={spread['n']} p50={spread['p50']}s "
               f"p99={spread['p99']}s max={spread['max']}s")  # fmt: skip
    for key, usage in summary["resources"].items():
        first, last = usage["first"], usage["last"]
        yield (f"resources {key}: fds {first['fds']} -> {last['fds']}, "
               f"RSS {first['rss_kib']} -> {last['rss_kib']} KiB "
               f"(rounds {first['round']}-{last['round']})")  # fmt: skip


def execute(options: Options, out: Callable[[str], None] = print) -> dict[str, Any]:
    """Run a whole campaign and return its summary; the workdir goes unless kept or failed."""
    keep = options.keep is not None
    workdir = Path(options.keep) if options.keep else Path(tempfile.mkdtemp(prefix="rp-campaign-"))
    workdir.mkdir(parents=True, exist_ok=True)
    campaign = Campaign(options, workdir, out)
    out(f"seed {campaign.seed}")
    out(f"nodes {','.join(campaign.hosts)}; faults {','.join(options.faults)}; workdir {workdir}")
    if options.supervised_every:
        out(
            f"supervised-job rounds: every round divisible by {options.supervised_every}; "
            f"jobs {','.join(options.jobs)}"
        )
    try:
        campaign.run()
    finally:
        campaign.close()
    summary = campaign.summary()
    for line in render(summary):
        out(line)
    if options.out is not None:
        Path(options.out).write_text(json.dumps(summary, indent=2) + "\n")
    if campaign.violations:
        out(f"logs and history kept in {workdir}")
    elif not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return summary


def parse(argv: Sequence[str] | None = None) -> Options:
    parser = _parser()
    args = parser.parse_args(argv)
    faults = tuple(f for f in args.faults.split(",") if f)
    unknown = [f for f in faults if f not in FAULTS]
    if unknown or not faults:
        parser.error(f"unknown faults {unknown}; choose from {','.join(FAULTS)}")
    if "kill_relay" in faults and args.relay_group < 2:
        parser.error("kill_relay needs --relay-group 2 or more")
    if args.nodes < 3:
        parser.error("--nodes must be at least 3")
    jobs = tuple(j for j in args.jobs.split(",") if j)
    unknown = [j for j in jobs if j not in JOB_KINDS + RESTART_KINDS]
    if unknown or not jobs:
        parser.error(f"unknown jobs {unknown}; choose from {','.join(JOB_KINDS + RESTART_KINDS)}")
    if args.supervised_every < 0:
        parser.error("--supervised-every must be 0 or more")
    return Options(
        rounds=args.rounds, seed=args.seed, faults=faults, nodes=args.nodes,
        relay_group=args.relay_group, keepalive_s=args.keepalive, job_every=args.job_every,
        convergence_s=args.convergence, liveness_check=args.liveness_check, cycle=args.cycle,
        supervised_every=args.supervised_every, jobs=jobs, out=args.out, keep=args.keep,
    )  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    parser.add_argument("--faults", default=",".join(Options.faults),
                        help=f"comma list out of {','.join(FAULTS)}")  # fmt: skip
    parser.add_argument("--cycle", action="store_true",
                        help="take the faults (and job kinds) in the given order instead of "
                             "at random")  # fmt: skip
    parser.add_argument("--supervised-every", type=int, default=Options.supervised_every,
                        help="every Nth round is a supervised-job round (0: none)")  # fmt: skip
    kinds = ",".join(JOB_KINDS + RESTART_KINDS)
    parser.add_argument("--jobs", default=kinds, help=f"job faults of those rounds: {kinds}")
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--relay-group", type=int, default=0, help="the sidecars' --relay-group")
    parser.add_argument("--keepalive", type=float, default=1.5,
                        help="the sidecars' --keepalive, s (0: flag not passed)")  # fmt: skip
    parser.add_argument("--job-every", type=int, default=3,
                        help="a torch job every N rounds (0: none)")  # fmt: skip
    parser.add_argument("--convergence", type=float, default=30.0, help="bound after a heal, s")
    parser.add_argument("--no-liveness-check", dest="liveness_check", action="store_false")
    parser.add_argument("--out", type=Path, default=None, help="write the summary here (JSON)")
    parser.add_argument("--keep", type=Path, default=None, help="workdir to keep (logs, history)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    options = parse(argv)
    reason = prerequisites()
    if reason is not None:
        print(f"error: namespace clusters cannot run here: {reason}", file=sys.stderr)
        return 2
    sweep_stale()
    try:
        summary = execute(options)
    finally:
        close_all()
    return 1 if sum(summary["violations"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
