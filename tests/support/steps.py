"""A training loop for supervised-launch tests: compute, then a training-sized all-reduce, again.

Each step sleeps ``--compute-s`` (the forward and backward pass), then all-reduces ``--mib``
MiB of float32 over gloo and checks every element. The env comes from `rallypoint run` (or
exec): ``init_method="env://"``. Lines, one write() each, with wall-clock stamps so a test
can time what happened across nodes (they share one clock):

    STEP {"rank": 0, "step": 3, "at": ...}       after each step's all-reduce
    FAIL {"rank": 2, "code": 3, "at": ...}       --fail-rank exits --fail-code after --fail-step
                                                 (or as --fail ATTEMPT:RANK:STEP:CODE says)
    ERROR {"rank": 1, "error": "...", "at": ...} a collective failed (a peer is gone): exit 1
    SIGTERM {"rank": 1, "at": ...}               the stop reached this process (--ignore-term:
                                                 and it goes on, until SIGKILL)
    DONE {"rank": 0, "steps": 5, "at": ...}      every step done (after --linger-s)
    RAISE {"rank": 2, "step": 4, "at": ...}      --raise RANK:STEP: that rank raises
                                                 RuntimeError, its cause in torch's error file
    LAUNCH {"attempt": 1, "at": ...}             the process started (before torch's import)
    START {"rank": 0, "attempt": 1, "from": 3, "at": ...}  set up, resuming after step
                                                 ``from`` of --checkpoint (-1: from scratch)
    STALL {"rank": 2, "step": 3, "at": ...}      --stall RANK:STEP: that rank hangs in its data
                                                 phase of STEP (a loader that stopped answering)

With --progress each step marks RALLYPOINT_PROGRESS_FILE twice, as docs/run.md advises:
"STEP data" once its batch is loaded, "STEP collective" just before the all-reduce; with
--slow-save STEP:SECONDS every rank marks "STEP checkpoint" after that step and saves for
SECONDS (a long checkpoint, which --stall-timeout-checkpoint must not take for a hang).

Run as a script; it needs only the standard library and torch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from datetime import timedelta


def say(kind: str, **fields: object) -> None:
    fields["at"] = round(time.time(), 4)
    os.write(1, f"{kind} {json.dumps(fields, sort_keys=True)}\n".encode())


def stopped(rank: int, ignore: bool) -> None:
    """The stop reached this process: say when, and end as SIGTERM's default would."""
    signal.sigwait({signal.SIGTERM})
    say("SIGTERM", rank=rank)
    if not ignore:
        os._exit(128 + signal.SIGTERM)


def fail_spec(text: str) -> tuple[int, int, int, int]:
    """--fail's ATTEMPT:RANK:STEP:CODE."""
    try:
        attempt, rank, step, code = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected ATTEMPT:RANK:STEP:CODE") from None
    return attempt, rank, step, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--mib", type=float, default=4.0)
    parser.add_argument("--compute-s", type=float, default=0.0)
    parser.add_argument("--timeout", type=float, default=1800.0, help="gloo's own timeout, s")
    parser.add_argument("--fail-rank", type=int, default=None)
    parser.add_argument("--fail-step", type=int, default=2)
    parser.add_argument("--fail-code", type=int, default=3)
    parser.add_argument("--fail-attempt", type=int, default=None, help="fail only in this attempt")
    parser.add_argument(
        "--fail",
        action="append",
        default=[],
        type=fail_spec,
        metavar="ATTEMPT:RANK:STEP:CODE",
        help="in that attempt, that rank exits CODE after STEP (-1: as it launches, before it "
        "joins the process group); repeatable",
    )
    parser.add_argument(
        "--checkpoint", default=None, help="a file per rank ({rank} in it): resume after its step"
    )
    parser.add_argument("--linger-rank", type=int, default=None, help="this rank writes on")
    parser.add_argument("--linger-s", type=float, default=0.0, help="after its last step")
    parser.add_argument("--ignore-term", action="store_true", help="go on after SIGTERM")
    parser.add_argument(
        "--raise",
        dest="raise_at",
        default=None,
        type=lambda text: tuple(int(x) for x in text.split(":")),
        metavar="RANK:STEP",
        help="that rank raises RuntimeError after STEP (main runs under torch's @record)",
    )
    parser.add_argument("--progress", action="store_true", help="mark RALLYPOINT_PROGRESS_FILE")
    parser.add_argument(
        "--stall",
        default=None,
        type=lambda text: tuple(-1 if x == "all" else int(x) for x in text.split(":")),
        metavar="RANK:STEP",
        help="that rank (all: every rank) hangs in the data phase of STEP",
    )
    parser.add_argument(
        "--slow-save",
        default=None,
        type=lambda text: (int(text.split(":")[0]), float(text.split(":")[1])),
        metavar="STEP:SECONDS",
        help="every rank saves a checkpoint for SECONDS after STEP",
    )
    args = parser.parse_args()
    progress = os.environ.get("RALLYPOINT_PROGRESS_FILE") if args.progress else None

    def mark(step: int, phase: str) -> None:
        if progress:
            with open(progress, "w") as marking:
                marking.write(f"{step} {phase}\n")

    # The attempt: rallypoint run's, else torchrun's own restart count (torchrun overwrites
    # TORCHELASTIC_RESTART_COUNT for its workers; RALLYPOINT_ATTEMPT passes through it).
    attempt = int(
        os.environ.get("RALLYPOINT_ATTEMPT", os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    )
    say("LAUNCH", attempt=attempt)
    fails = [f for f in args.fail if f[0] == attempt]
    if args.fail_rank is not None and args.fail_attempt in (None, attempt):
        fails.append((attempt, args.fail_rank, args.fail_step, args.fail_code))
    for _, fail_rank, fail_step, code in fails:
        if fail_step == -1 and fail_rank == int(os.environ.get("RANK", "-1")):
            say("FAIL", rank=fail_rank, code=code)
            os._exit(code)

    # SIGTERM is taken by a thread of its own: a Python handler runs only between bytecodes
    # of the main thread, which may be blocked in a collective whose peer is gone. Blocked
    # before torch starts its threads, so that they inherit the mask and sigwait gets it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    rank = int(os.environ.get("RANK", "-1"))
    threading.Thread(target=stopped, args=(rank, args.ignore_term), daemon=True).start()

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    checkpoint = args.checkpoint.format(rank=rank) if args.checkpoint else None
    done = -1
    if checkpoint and os.path.exists(checkpoint):
        with open(checkpoint) as saved:
            done = int(saved.read().strip() or -1)
    if checkpoint:
        # Resume after the last step every rank finished: a rank stopped mid-step saved
        # one step fewer than a rank that had finished it (a real job's checkpoint is one).
        agreed = torch.tensor([done], dtype=torch.int64)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
        done = int(agreed.item())
    say("START", rank=rank, attempt=attempt, **{"from": done})
    failing = {step: code for _, fail_rank, step, code in fails if fail_rank == rank}
    expected = world * (world + 1) / 2
    tensor = torch.empty(max(1, int(args.mib * 2**20) // 4), dtype=torch.float32)
    for step in range(done + 1, args.steps):
        if args.stall in ((rank, step), (-1, step)):
            say("STALL", rank=rank, step=step)
            time.sleep(args.timeout)  # the batch never comes
        mark(step, "data")
        time.sleep(args.compute_s)
        tensor.fill_(float(rank + 1))
        mark(step, "collective")
        try:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        except RuntimeError as exc:
            say("ERROR", rank=rank, error=str(exc).splitlines()[0][:200])
            return 1
        if not bool(torch.all(tensor == expected)):
            say("WRONG", rank=rank, step=step)
            return 1
        say("STEP", rank=rank, step=step)
        if args.slow_save is not None and args.slow_save[0] == step:
            mark(step, "checkpoint")
            time.sleep(args.slow_save[1])
        if checkpoint:
            with open(checkpoint + ".tmp", "w") as saving:
                saving.write(str(step))
            os.replace(checkpoint + ".tmp", checkpoint)  # a reader never sees half of it
        if step in failing:
            say("FAIL", rank=rank, code=failing[step])
            os._exit(failing[step])
        if args.raise_at == (rank, step):
            say("RAISE", rank=rank, step=step)
            raise RuntimeError(f"planted failure at step {step}")
    if rank == args.linger_rank:
        time.sleep(args.linger_s)  # a checkpoint written after the last collective
    say("DONE", rank=rank, steps=args.steps)
    # Out at once: torch's teardown of a process group that was not destroyed can abort at
    # exit ("terminate called without an active exception"), and the job is done.
    os._exit(0)


def recorded() -> int:
    """main under torch's @record: an exception's type and message go to
    TORCHELASTIC_ERROR_FILE, then it exits 1 without torch's teardown (which may abort)."""
    from torch.distributed.elastic.multiprocessing.errors import record

    try:
        return int(record(main)())
    except Exception:
        os._exit(1)


if __name__ == "__main__":
    sys.exit(recorded() if "--raise" in sys.argv else main())
