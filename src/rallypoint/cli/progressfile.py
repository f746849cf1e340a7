"""The job's progress, as it marks it in the file `run` names in its env (docs/run.md).

Each attempt's child gets ``RALLYPOINT_PROGRESS_FILE``, a path of `run`'s own. The job
touches it once per step (``os.utime(path)``, ``touch "$RALLYPOINT_PROGRESS_FILE"``) or
writes its step into it, optionally with one word of phase (``1234 step``, ``1234
checkpoint``). The file's modification time is the progress's time: the job's own moment,
on this node's clock, whatever `run` polls at.

With ``--stall-timeout S`` a job that made no progress for S seconds while its child is alive
has stalled; with ``--stall-timeout-first S`` one that has not marked its first progress S
seconds after it started has too; after a mark whose phase is ``checkpoint`` the bound is
``--stall-timeout-checkpoint`` when set. A job that never marks progress is not watched
(unless ``--stall-timeout-first`` says it must).

The file is the job's, so it is untrusted: opened without following a symlink, only as a
regular file, at most MAX_READ bytes. Anything else (a directory, a link, a file that grew
past MAX_READ, text that is not a step) reads as "no progress written", said once.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from rallypoint.cli import errorfile
from rallypoint.core.progress import PHASE_PATTERN, spot

#: The env name the child gets.
RALLYPOINT_PROGRESS_FILE = "RALLYPOINT_PROGRESS_FILE"
#: Bytes read at most: a step and a word fit in a few dozen.
MAX_READ = 256
#: Seconds between two looks at the file.
POLL_S = 0.25
#: The phase whose bound is --stall-timeout-checkpoint.
CHECKPOINT = "checkpoint"
#: A step number, then optionally one word of phase (letters, digits, "_", "-", ".").
_LINE = re.compile(rf"\A\s*(\d{{1,18}})(?:[ \t]+({PHASE_PATTERN}))?\s*\Z")
#: Most local ranks' files read (a node has a few GPUs; a bound against a flood of files).
MAX_LOCAL_RANKS = 1024


class Mark(NamedTuple):
    """One progress mark: when (the file's mtime, Unix seconds), the step, the phase, and
    the local rank whose file it is (None: the file itself)."""

    at: float
    step: int | None = None
    phase: str = ""
    local_rank: int | None = None


class Unreadable(Exception):
    """The file is there but holds no progress (what is wrong, for the one warning)."""


def read(path: str) -> Mark | None:
    """The mark in ``path`` (None while the job has not created it); Unreadable when the
    file is not a regular file or its text is not a step."""
    try:
        data, info = errorfile.read_regular(path, MAX_READ + 1)  # one more: parse() refuses it
    except FileNotFoundError:
        return None
    except errorfile.NotRegular:
        raise Unreadable("is not a regular file") from None
    except OSError as exc:
        why = exc.strerror or exc
        raise Unreadable(f"cannot be opened or read ({why}): a symlink or no access?") from None
    return parse(data, info.st_mtime)


def read_node(path: str) -> Mark | None:
    """The node's mark: the oldest of ``path`` and its local ranks' files (``path.N``);
    Unreadable when one of them is there but holds no progress."""
    marks = []
    mark = read(path)
    if mark is not None:
        marks.append(mark)
    for local_rank in local_ranks(path):
        mark = read(f"{path}.{local_rank}")
        if mark is not None:
            marks.append(mark._replace(local_rank=local_rank))
    return min(marks, key=lambda m: m.at, default=None)


def local_ranks(path: str) -> list[int]:
    """The local ranks that have a file beside ``path`` (``path.0``, ``path.1``...)."""
    folder, name = os.path.split(path)
    prefix = name + "."
    found = []
    try:
        with os.scandir(folder or ".") as entries:
            for entry in entries:
                rest = entry.name[len(prefix) :] if entry.name.startswith(prefix) else ""
                if (
                    rest.isascii()
                    and rest.isdigit()
                    and len(rest) <= 4
                    and int(rest) < MAX_LOCAL_RANKS
                ):
                    found.append(int(rest))
    except OSError:
        return []
    return sorted(found)


def parse(data: bytes, at: float) -> Mark:
    """A mark from the file's bytes: empty (touched), or a step and an optional phase."""
    if len(data) > MAX_READ:
        raise Unreadable(f"holds more than {MAX_READ} bytes: write one step, not a log")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise Unreadable("is not a step number (ASCII text like '1234 step')") from None
    if not text.strip():
        return Mark(at)
    found = _LINE.match(text)
    if found is None:
        raise Unreadable("is not a step number, optionally with a word of phase ('1234 step')")
    return Mark(at, int(found.group(1)), found.group(2) or "")


def where(mark: Mark | None) -> str:
    """Where the job was: "at step 1234 (checkpoint)", "at step 12, local rank 3", or ""."""
    if mark is None:
        return ""
    said = spot(mark.step, mark.phase, mark.local_rank)
    return f"at {said}" if mark.step is not None else said


class Bounds(NamedTuple):
    """The stall bounds, seconds (None: off): after a mark, before the first one, and after
    a mark whose phase is ``checkpoint`` (a long save is not a hang)."""

    every_s: float | None = None
    first_s: float | None = None
    checkpoint_s: float | None = None

    @property
    def watching(self) -> bool:
        return any(bound is not None for bound in self)

    def after(self, mark: Mark) -> float | None:
        """The bound after ``mark``: its phase's own, if it has one."""
        if mark.phase == CHECKPOINT and self.checkpoint_s is not None:
            return self.checkpoint_s
        return self.every_s


#: No bound at all: the default.
UNWATCHED = Bounds()


class Stall(NamedTuple):
    """A stall: the last mark (None: none since the start), how long, the line's cause, and
    when the attempt began (the stall's start when there was no mark)."""

    last: Mark | None
    silent_s: float
    detail: str
    began: float


class Watch:
    """One attempt's progress file, against the stall bounds."""

    def __init__(self, path: str, began: float, bounds: Bounds, say: Callable[[str], None]) -> None:
        self.path = path
        self.began = began
        self.bounds = bounds
        self.say = say
        #: The last mark read (None: no progress yet).
        self.last: Mark | None = None
        #: Seconds between the last two marks read (None: fewer than two): the job's phase.
        self.period_s: float | None = None
        self._warned = False

    def look(self, now: float | None = None) -> Stall | None:
        """Read the file once; the stall, if the job has stalled by ``now`` (wall clock)."""
        now = time.time() if now is None else now
        try:
            mark = read_node(self.path)
        except Unreadable as exc:
            if not self._warned:
                self._warned = True
                self.say(f"rallypoint: warning: {RALLYPOINT_PROGRESS_FILE} {self.path} {exc}")
            mark = None
        if mark is not None and mark != self.last:
            if self.last is not None and mark.at > self.last.at:
                self.period_s = mark.at - self.last.at
            self.last = mark
        return self.stalled(now)

    def stalled(self, now: float) -> Stall | None:
        """The stall by ``now`` given the marks seen so far, if any."""
        last = self.last
        if last is None:
            first_s = self.bounds.first_s
            if first_s is None or now - self.began < first_s:
                return None
            # The line names the bound that ran out, not the age the poll found: every node
            # that reads it says the same, however late its look came.
            silent = now - self.began
            detail = f"before its first progress, {first_s:g} s after the start"
            return Stall(None, silent, detail, self.began)
        bound = self.bounds.after(last)
        silent = now - last.at
        if bound is None or silent < bound:
            return None
        at = where(last)
        detail = f"{at + ', ' if at else ''}no progress for {bound:g} s"
        return Stall(last, silent, detail, self.began)

    def follow(
        self,
        stalled: Callable[[Stall], None],
        over: threading.Event,
        marked: Callable[[Mark, float | None], None] = lambda mark, period_s: None,
    ) -> None:
        """Look at the file every POLL_S until ``over`` is set or the job stalled (then
        ``stalled`` hears of it, once); ``marked`` hears of each new mark."""
        while not over.wait(POLL_S):
            before = self.last
            stall = self.look()
            if self.last is not None and self.last != before:
                marked(self.last, self.period_s)
            if stall is not None:
                stalled(stall)
                return
