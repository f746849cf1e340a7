"""`rallypoint run`'s supervision: the job as a child in its own process group, stopped when
the cluster says so, started again on every node with restarts (docs/run.md).

Each start of the child is an attempt of the cluster's job: `run` reports that it is
starting and waits until its sidecar says the attempt started on every node (GET /job's
"start"), so no two attempts overlap and none starts on fewer nodes than the world size.

The child runs in a new session (its own process group), so the whole job, data-loader
workers included, is signalled as one and nothing of it is left behind. Three threads: the
main one waits for events and handles the forwarded signals, one reaps the child, one
reports to the local sidecar and long-polls GET /job for a stop. The sidecar is not the job:
when it is gone the child keeps running, and `run` says so once and reports again when it
is back.
"""

from __future__ import annotations

import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType

from rallypoint.cli import (
    childgroup,
    childproc,
    client,
    errorfile,
    jobview,
    progressfile,
    progresspost,
)
from rallypoint.core import jobs
from rallypoint.core.jobs import JobStatus
from rallypoint.errors import RallypointError
from rallypoint.wire import jobstates
from rallypoint.wire.jobstates import JobView, ShownState

#: The signals `run` passes on to the job's process group.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
#: Longest wait for the sidecar's answer to a report (it waits for the report to go on).
REPORT_TIMEOUT_S = 8.0
#: How long a run that gives up waiting to start may take to say so to its sidecar.
WITHDRAW_TIMEOUT_S = 2.0
#: How long a stalled job has to leave its stacks after --stall-signal, before the stop.
DUMP_S = 3.0
#: Beyond --grace and --rejoin-timeout, how long the next attempt's start may take after a
#: failed one: each node's stop reported and the count pushed, a few round trips.
START_MARGIN_S = 5.0


class Outcome:
    """How one attempt ended here: the status, and whether a restart may follow."""

    def __init__(self, status: int, restartable: bool) -> None:
        self.status = status
        self.restartable = restartable


class Supervisor:
    """One supervised run of a command: start, forward, stop, exit status."""

    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        *,
        url: str,
        proof: str | None = None,
        grace_s: float,
        lost_code: int,
        say: Callable[[str], None],
        restarts: int = 0,
        rejoin_timeout_s: float = 60.0,
        start_timeout_s: float | None = None,
        stall: progressfile.Bounds = progressfile.UNWATCHED,
        stall_signal: int | None = None,
    ) -> None:
        self.command = list(command)
        self.env = dict(env)
        self.url = url
        #: Proves the session token on the sidecar's writes (None: the sidecar has none).
        self.proof = proof
        self.grace_s = grace_s
        self.lost_code = lost_code
        self.say = say
        self.restarts = restarts
        self.rejoin_timeout_s = rejoin_timeout_s
        self.start_timeout_s = start_timeout_s
        #: The --stall-timeout bounds, and --stall-signal (sent before a stalled job's stop).
        self.stall = stall
        self.stall_signal = stall_signal
        #: The attempt the child runs in, and the queue its threads report to: new for each.
        self._attempt = 0
        self._events: queue.Queue[tuple[str, object]] = queue.Queue()
        self._group: childgroup.ChildGroup | None = None
        self._started = 0.0
        self._terminated: int | None = None
        self._terminated_at: float | None = None
        #: The outside stop's report got no answer in time: said again before the job's end.
        self._stop_unsaid = False
        self._ended_at: float | None = None
        #: Signals that came before the child was started.
        self._pending: list[int] = []
        #: Each attempt's error file, where the child may leave its cause.
        self._errors = errorfile.ErrorFiles(env)
        #: The attempt's progress file, against the stall bounds.
        self._progress: progressfile.Watch | None = None
        self._publisher: progresspost.Publisher | None = None

    # -- the whole run ------------------------------------------------------------------

    def run(self) -> int:
        """Start the command, supervise it, and return the exit status `run` ends with."""
        self._started = time.time()
        # Taken before the child starts: a signal sent as soon as it runs is `run`'s to pass
        # on, not a default action that kills `run` and leaves the job alone.
        previous = {sig: signal.signal(sig, self._forward) for sig in FORWARDED}
        try:
            return self._attempts()
        finally:
            self._errors.remove()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _attempts(self) -> int:
        """Every attempt this run takes part in: the first, then one per restart."""
        left, bound, last = self.restarts, self.start_timeout_s, None
        while True:
            attempt = jobview.wait_start(
                self.url,
                self._started,
                bound,
                proof=self.proof,
                stopped=lambda: self._terminated is not None,
                say=self.say,
                rejoin_s=None if last is None else self.rejoin_timeout_s,
            )
            if attempt is None:
                # Leaving without starting: the sidecar must not count this run as starting.
                self._report(JobStatus.STOPPED, timeout_s=WITHDRAW_TIMEOUT_S)
                if self._terminated is not None:
                    return 128 + self._terminated
                if last is None:
                    self.say(
                        f"rallypoint: the job did not start on every node within {bound:g} s;"
                        f" exit {self.lost_code}: try again"
                    )
                    return self.lost_code
                self.say(
                    f"rallypoint: not every node came back within --rejoin-timeout "
                    f"{self.rejoin_timeout_s:g}s; exit {last.status}"
                )
                return last.status
            if last is not None:
                self.env.update(jobview.served_env(self.url, attempt, self.say))
            last = self._one_attempt(attempt)
            if not last.restartable or left == 0 or self._terminated is not None:
                return last.status
            left -= 1
            self.say(
                f"rallypoint: restarting: attempt {attempt + 1} on every node"
                f" ({self.restarts - left} of --restarts {self.restarts})"
            )
            # Every node first stops its child (up to --grace) and reports; then the
            # rejoin timeout is for a node that must come back.
            bound = self.grace_s + START_MARGIN_S + self.rejoin_timeout_s

    def _one_attempt(self, attempt: int) -> Outcome:
        """Run the child once, as ``attempt``, until it ends or the cluster stops it."""
        if self._terminated is not None:
            return Outcome(128 + self._terminated, False)  # stopped as the attempt began
        self._attempt = attempt
        self._events = queue.Queue()
        self._ended_at = None
        began = time.time()
        progress = self._progress = progressfile.Watch(
            self._errors.file(f"progress-attempt-{attempt}"), began, self.stall, self.say
        )
        env = {
            **self.env,
            "RALLYPOINT_ATTEMPT": str(attempt),
            "TORCHELASTIC_RESTART_COUNT": str(attempt),
            progressfile.RALLYPOINT_PROGRESS_FILE: progress.path,
            **self._errors.for_attempt(attempt, began),
        }
        try:
            child = subprocess.Popen(
                self.command, env=env, start_new_session=True, preexec_fn=childproc.die_with_parent
            )
        except FileNotFoundError:
            self.say(f"error: {self.command[0]!r} not found: check the command and PATH")
            return Outcome(127, False)
        except OSError as exc:
            self.say(
                f"error: cannot run {self.command[0]!r}: {exc.strerror or exc}:"
                " check that it is an executable file"
            )
            return Outcome(126, False)
        self._group = childgroup.ChildGroup(child)
        pending, self._pending = self._pending, []
        for signum in pending:
            self._group.signal(signum)
        events, over = self._events, threading.Event()
        threading.Thread(target=self._reap, name="rallypoint-reap", daemon=True).start()
        threading.Thread(
            target=jobview.follow_stop,
            args=(self.url, self._running_body, lambda view: events.put(("stop", view)), over),
            kwargs={"proof": self.proof, "say": self.say},
            name="rallypoint-watch",
            daemon=True,
        ).start()
        self._publisher = progresspost.start(
            self.url, attempt, progress, lambda s: events.put(("stall", s)), over, proof=self.proof
        )
        try:
            return self._supervise()
        finally:
            over.set()

    def _supervise(self) -> Outcome:
        while True:
            try:
                kind, value = self._events.get(timeout=1.0)
            except queue.Empty:
                continue
            if kind == "exit":
                assert isinstance(value, int)
                return self._ended(value)
            if kind == "stop":
                assert isinstance(value, JobView)
                return self._stop(value)
            if kind == "stall":
                assert isinstance(value, progressfile.Stall)
                return self._stalled(value)

    # -- the child ----------------------------------------------------------------------

    def _reap(self) -> None:
        group, events = self._group, self._events
        assert group is not None
        returncode = group.child.wait()
        self._ended_at = time.time()
        events.put(("exit", returncode))

    def _forward(self, signum: int, _frame: FrameType | None) -> None:
        """A signal for `run`: an outside stop is reported first, then the group gets it."""
        if signum in jobs.STOP_SIGNALS and self._terminated is None:
            self._terminated = signum
            self._terminated_at = time.time()
            # The others must hear of an outside stop (preempted, evicted, `docker stop`)
            # before their collectives fail on this node's closed connections; waiting to
            # start, no child runs, and the next attempt simply does not start here.
            if self._group is not None and self._group.child.poll() is None:
                said = self._report(
                    JobStatus.TERMINATED, signal=signum, at=self._terminated_at, timeout_s=2.0
                )
                self._stop_unsaid = said is None
        if self._group is None:
            self._pending.append(signum)  # passed on as soon as the child is there
            return
        self._group.signal(signum)

    def _ended(self, returncode: int) -> Outcome:
        """The child ended by itself: report it, clear the group, exit with its status.

        A child that failed after another node's failure reached the cluster failed because
        of it (its collective lost a peer a moment before the stop reached it here): `run`
        then exits as if stopped, with the first failure's status, so that the statuses a
        scheduler sees do not depend on which came first on this node.
        """
        status = returncode if returncode >= 0 else 128 - returncode
        at, cause = self._ended_at, self._errors.cause() if returncode else ""
        if self._publisher is not None and self._progress is not None:
            self._publisher.last(self._progress)
        if self._stop_unsaid:
            # A sidecar that took the stop's report late would drop it behind the end it
            # caused (an older state of the same run) and name the end first: said first.
            self._report(JobStatus.TERMINATED, signal=self._terminated, at=self._terminated_at)
        if returncode >= 0:
            view = self._report(JobStatus.EXITED, code=returncode, at=at, detail=cause)
        else:
            view = self._report(JobStatus.KILLED, signal=-returncode, at=at, detail=cause)
        self._clear()
        if status == 0:
            return Outcome(0, False)
        if view is None:
            return Outcome(status, False)  # no sidecar: no cluster to restart with
        if not view.stop:
            view = jobview.settled(self.url, view)
        first = view.first
        if first is None:
            return Outcome(status, True)
        if view.stop:
            status = jobs.exit_status(first.job, self.lost_code)
        self.say(f"rallypoint: {jobview.line(first)}; exit {status}")
        return Outcome(status, first.state != JobStatus.TERMINATED)

    def _stop(self, view: JobView) -> Outcome:
        """Another node failed first (or this one is lost): stop the job, exit with the status."""
        first = view.first
        assert first is not None
        own = self._progress.look() if self._progress is not None else None
        if own is not None and first.state == JobStatus.STALLED:
            # Stalled here too: the node whose progress stopped first is the one to blame,
            # and the sidecars keep the earliest failure (this one, if its mark is older).
            return self._stalled(own)
        self.say(f"rallypoint: stopping the job: {jobview.line(first)}")
        self._stop_group()
        # The report's answer is the attempt's first failure now: an earlier one may have
        # come in while the job stopped.
        answer = self._report(JobStatus.STOPPED)
        self._clear()
        return self._exit_naming((answer and answer.first) or first, answer or view)

    def _stalled(self, stall: progressfile.Stall) -> Outcome:
        """This node's job made no progress within its bound: a failure like a crash. Said
        to the cluster first (the others stop before their collectives time out), then the
        job is stopped here."""
        # The stall began with the last progress: the node whose progress stopped first is
        # the earliest failure, whichever node's bound ran out first.
        at = stall.last.at if stall.last is not None else stall.began
        self.say(f"rallypoint: stopping the job: this node stalled: {stall.detail}")
        view = self._report(JobStatus.STALLED, at=at, detail=stall.detail)
        assert self._group is not None
        if self.stall_signal is not None and self._group.signal(self.stall_signal):
            # Stacks first (faulthandler.register, a flight recorder), then the stop.
            name = jobs.signal_name(self.stall_signal)
            self.say(f"rallypoint: sent {name} to the stalled job; stopping it in {DUMP_S:g} s")
            self._group.wait(DUMP_S)
        self._stop_group()
        self._clear()
        if view is None:
            return Outcome(jobs.STALLED_EXIT_CODE, False)  # no sidecar: no cluster to restart
        view = jobview.latest(self.url, view)
        first = view.first
        if first is None:
            return Outcome(jobs.STALLED_EXIT_CODE, True)
        return self._exit_naming(first, view)

    def _exit_naming(self, first: ShownState, view: JobView) -> Outcome:
        """Exit with the first failure's status, naming it (and, after a stall, which node's
        progress stopped first); a restart may follow unless it was a stop from outside."""
        status = jobs.exit_status(first.job, self.lost_code)
        self.say(f"rallypoint: {jobview.line(first)}; exit {status}")
        if first.state == JobStatus.STALLED and (behind := jobview.behind(view)):
            self.say(f"rallypoint: {behind}")
        return Outcome(status, first.state != JobStatus.TERMINATED)

    def _stop_group(self) -> None:
        """SIGTERM to the job's group; SIGKILL, said, when the child outlives --grace."""
        assert self._group is not None
        if self._group.stop(self.grace_s):
            self.say(f"rallypoint: the job did not stop within --grace {self.grace_s:g}s: SIGKILL")

    def _clear(self) -> None:
        assert self._group is not None
        self._group.clear(self.grace_s)

    # -- the sidecar --------------------------------------------------------------------

    def _report(
        self,
        state: JobStatus,
        *,
        code: int | None = None,
        signal: int | None = None,
        at: float | None = None,
        timeout_s: float = REPORT_TIMEOUT_S,
        detail: str = "",
    ) -> JobView | None:
        report = jobstates.Report(state, self._started, code, signal, at, self._attempt, detail)
        body = jobstates.encode_report(report)
        try:
            return client.report_job(self.url, body, proof=self.proof, timeout_s=timeout_s)
        except RallypointError:
            return None  # the watcher says once that the sidecar is gone

    def _running_body(self) -> bytes:
        at, signum = self._terminated_at, self._terminated
        state = JobStatus.RUNNING if signum is None else JobStatus.TERMINATED
        report = jobstates.Report(state, self._started, None, signum, at, self._attempt)
        return jobstates.encode_report(report)
