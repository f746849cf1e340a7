"""What `wait` and `exec` say on stderr while they wait: a line per change, a live line on a tty.

The lines come from what the local API already answers: the reasons of each not-ready /env
answer, and, when they change, one GET /status for the counts (joined, checks pending).
Stdout is never written here: it carries the env (or, after exec, the command's output).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from rallypoint.cli.client import first_reason
from rallypoint.errors import NotReady, SidecarUnreachable

log = logging.getLogger(__name__)

#: Seconds between long-polls while progress is shown: how often the live line moves and a
#: change is seen. Each poll is one small request to loopback.
POLL_S = 1.0
#: Seconds after which the counts are fetched again though the reasons did not change.
STATUS_EVERY_S = 10.0
PREFIX = "rallypoint: "


def elapsed(seconds: float) -> str:
    """Seconds as a person reads them: 3.2s, 2m05s, 1h02m."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def counts(doc: Mapping[str, Any] | None) -> str:
    """How far the rendezvous is, from a /status document: joined and checks, or ""."""
    if not doc:
        return ""
    spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
    nnodes = spec.get("nnodes") if isinstance(spec, dict) else None
    if not isinstance(nnodes, int) or doc.get("role") == "discovering":
        return ""
    parts = []
    peers = [p for p in doc.get("peers") or () if isinstance(p, dict)]
    if nnodes > 1 and peers:
        parts.append(f"joined {sum(bool(p.get('joined')) for p in peers)}/{nnodes}")
    checks = doc.get("checks") if isinstance(doc.get("checks"), dict) else {}
    verdict = checks.get("verdict") if isinstance(checks, dict) else None
    if isinstance(verdict, dict):
        pending, failed = verdict.get("pending_count"), verdict.get("failure_count")
        if isinstance(pending, int):
            parts.append(f"checks {pending}/{nnodes} pending")
        if isinstance(failed, int) and failed:
            parts.append(f"{failed} failed")
    return ", ".join(parts)


def summary(error: NotReady | SidecarUnreachable, doc: Mapping[str, Any] | None) -> str:
    """One round of a wait in one line: what is awaited or failing, then the counts."""
    if isinstance(error, SidecarUnreachable):
        return str(error)
    said = counts(doc)
    return first_reason(error.reasons) + (f"; {said}" if said else "")


class Screen(Protocol):
    """Where progress goes: lines that stay, and a live line that is redrawn in place."""

    def line(self, text: str) -> None: ...
    def live(self, text: str) -> None: ...
    def clear(self) -> None: ...


class Lines:
    """Progress for a file or pipe: the lines that stay, no live line."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self._write = write

    def line(self, text: str) -> None:
        self._write(text + "\n")

    def live(self, text: str) -> None:
        pass

    def clear(self) -> None:
        pass


class Terminal:
    """Progress for a terminal: lines that stay above one live line redrawn with `\\r`.

    The live line is cut to the terminal's width so it never wraps (a wrapped line cannot be
    redrawn with a carriage return) and is overwritten with blanks, not escape sequences.
    """

    def __init__(self, write: Callable[[str], None], width: Callable[[], int]) -> None:
        self._write, self._width = write, width
        self._shown = ""

    def line(self, text: str) -> None:
        shown = self._shown
        self.clear()
        self._write(text + "\n")
        if shown:
            self.live(shown)

    def live(self, text: str) -> None:
        text = text[: max(self._width() - 1, 10)]
        pad = " " * max(len(self._shown) - len(text), 0)
        self._write("\r" + text + pad)
        self._shown = text

    def clear(self) -> None:
        if self._shown:
            self._write("\r" + " " * len(self._shown) + "\r")
            self._shown = ""


class Events:
    """Progress as log events (--log-format json): one `wait.progress` event per line."""

    def line(self, text: str) -> None:
        log.info("wait.progress", extra={"state": text.removeprefix(PREFIX)})

    def live(self, text: str) -> None:
        pass

    def clear(self) -> None:
        pass


class Progress:
    """Watches a wait (client.wait_env's ``watch``): says each change, keeps the live line."""

    #: The long-poll a watched wait uses, so that changes are seen within it.
    poll_s = POLL_S

    def __init__(
        self,
        screen: Screen,
        fetch_status: Callable[[], Mapping[str, Any] | None],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._screen, self._fetch_status, self._clock = screen, fetch_status, clock
        self._started = clock()
        self._key: object = None
        self._doc: Mapping[str, Any] | None = None
        self._fetched = -STATUS_EVERY_S
        self._said = ""

    def __call__(self, error: NotReady | SidecarUnreachable) -> None:
        now = self._clock()
        if isinstance(error, NotReady):
            key: object = tuple((r.get("code"), r.get("message")) for r in error.reasons)
        else:
            key = str(error)
        if isinstance(error, NotReady) and (
            key != self._key or now - self._fetched >= STATUS_EVERY_S
        ):
            self._doc, self._fetched = self._fetch_status(), now
        self._key = key
        said = summary(error, self._doc if isinstance(error, NotReady) else None)
        took = elapsed(now - self._started)
        if said != self._said:
            self._said = said
            self._screen.line(f"{PREFIX}[{took}] {said}")
        self._screen.live(f"{PREFIX}waiting {took}: {said}")

    def ready(self) -> None:
        """The last line: the wait is over, and how long it took."""
        self._screen.clear()
        self._screen.line(f"{PREFIX}ready after {elapsed(self._clock() - self._started)}")

    def stop(self) -> None:
        """The wait failed: take the live line away so the `error:` line stands alone."""
        self._screen.clear()
