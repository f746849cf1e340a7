"""Whether this node is ready, why not, its env and warnings, and the waiters for a change."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from rallypoint.metrics import Metrics
from rallypoint.model import Env
from rallypoint.reasons import Reason

# The rendezvous logs under one name, whichever module of it speaks.
log = logging.getLogger("rallypoint.rendezvous")


class Readiness:
    """One node's readiness: ready with an env, or not ready for Reasons (docs/readiness.md)."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        deadline_s: float,
        clock: Callable[[], float],
        phase: Reason,
    ) -> None:
        self.metrics = metrics
        self.deadline_s = deadline_s
        self._clock = clock
        self.env: Env | None = None
        #: Warnings fixed at start (no token ...) and from the last verification.
        self.static_warnings: list[str] = []
        self.verify_warnings: list[str] = []
        #: Warnings read as they stand at each read (warn_from).
        self._sources: list[Callable[[], Sequence[str]]] = []
        #: Set while a ready worker cannot reach its master (ready stays: see readiness.md).
        self.master_problem: Reason | None = None
        self._ready = False
        self._phase: list[Reason] = [phase]
        self._shutting_down = False
        self._waiters = 0
        self._changed = asyncio.Event()
        self._started = clock()
        self._deadline = self._started + deadline_s
        self._ready_after_s: float | None = None

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def phase(self) -> list[Reason]:
        """The reasons last given to not_ready (empty when ready)."""
        return self._phase

    @property
    def deadline(self) -> float:
        """The clock reading by which the node should be ready."""
        return self._deadline

    def restart_deadline(self) -> None:
        """A new generation gets the whole deadline again."""
        self._deadline = self._clock() + self.deadline_s

    @property
    def ready_after_s(self) -> float | None:
        """Seconds from start to the first ready, None before."""
        return self._ready_after_s

    @property
    def uptime_s(self) -> float:
        return self._clock() - self._started

    def reasons(self) -> list[Reason]:
        """Why the node is not ready (empty when ready)."""
        if self._ready:
            return []
        reasons = list(self._phase)
        if not self._shutting_down and self._clock() > self._deadline:
            reasons.append(
                Reason(
                    "deadline_exceeded",
                    f"not ready within the deadline of {self.deadline_s:g}s; "
                    "the other reasons say what is still missing (still retrying)",
                )
            )
        return reasons

    def warn_from(self, source: Callable[[], Sequence[str]]) -> None:
        """Show ``source``'s warnings as they stand at each read: the master's verdict (a
        node's clock measured again in a report after the verdict still moves its warning),
        the nodes named down after ready (the env stays served meanwhile)."""
        self._sources.append(source)

    def warnings(self) -> list[str]:
        env_warnings = list(self.env.warnings) if self.env is not None else []
        live = [warning for source in self._sources for warning in source()]
        return [*self.static_warnings, *self.verify_warnings, *env_warnings, *live]

    @property
    def env_waiters(self) -> int:
        """How many wait_ready calls (GET /env?wait) are waiting right now."""
        return self._waiters

    @property
    def shutting_down(self) -> bool:
        """True once begin_shutdown ran: the node will not turn ready again."""
        return self._shutting_down

    async def wait_ready(self, timeout_s: float, *, client: bool = True) -> bool:
        """Wait until ready, shutting down or ``timeout_s`` passed; whether the node is ready.

        A ``client`` wait (GET /env?wait) counts in env_waiters; the sidecar's own do not.
        """
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        counted = 1 if client else 0
        self._waiters += counted
        try:
            while not self._ready and not self._shutting_down:
                remaining = end - loop.time()
                if remaining <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), remaining)
        finally:
            self._waiters -= counted
        return self._ready

    async def changed(self) -> None:
        """Return at the next change of readiness (or of its reasons)."""
        await self._changed.wait()

    def begin_shutdown(self) -> None:
        """Turn not ready for good (SIGTERM): /readyz answers 503 from now on."""
        self.not_ready(Reason("shutting_down", "the sidecar is shutting down"))
        self._shutting_down = True  # after: not_ready ignores calls once shutting down
        self._notify()  # wait_ready returns: a long-poll in flight gets the 503 verdict

    def not_ready(self, *reasons: Reason) -> None:
        """Turn (or stay) not ready for ``reasons``; ignored once shutting down."""
        if self._shutting_down:
            return
        self._phase = list(reasons)
        self.env = None
        if self._ready:
            self._ready = False
            self.metrics.ready_transitions.labels("not_ready").inc()
            quiet = any(r.code == "shutting_down" for r in reasons)
            level = logging.INFO if quiet else logging.WARNING
            log.log(level, "not_ready", extra={"reasons": ",".join(r.code for r in reasons)})
        self._notify()

    def become_ready(self, env: Env, generation: str | None) -> None:
        """Turn ready with ``env`` for ``generation``; ignored once shutting down."""
        if self._shutting_down:
            return
        self.env = env
        self._phase = []
        if not self._ready:
            self._ready = True
            if self._ready_after_s is None:
                self._ready_after_s = self.uptime_s
            self.metrics.ready_transitions.labels("ready").inc()
            log.info("ready", extra={"generation": generation})
        self._notify()

    def _notify(self) -> None:
        self.metrics.ready.set(1 if self._ready else 0)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
