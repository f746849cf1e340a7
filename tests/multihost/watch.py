"""The fault campaign's sidecars: what the campaign means each to be doing, and every poll.

`Watch` starts, kills, pauses and resumes the sidecars of a campaign's cluster, noting each
intent (history.py's UP, STARTING, DOWN, PAUSED); one `Watcher` thread per node polls its
``/env`` and ``/status`` every POLL_S for the whole run and hands each answer to the
`Watch` as a `Sample`, which history.py's invariants are checked over.
"""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time
from pathlib import Path

from tests.multihost import history
from tests.multihost.history import DOWN, PAUSED, STARTING, UP, Sample
from tests.support.cluster.build import Cluster
from tests.support.cluster.layout import LOCAL_PORT
from tests.support.cluster.netio import http_get
from tests.support.cluster.nodes import Node

POLL_S = 0.25
#: Generous for one local request: two cores are shared with torch jobs and other work.
POLL_TIMEOUT_S = 5.0


class Watch:
    """Every sidecar's intended state (with a version per change) and every poll of it."""

    def __init__(self, cluster: Cluster, history_path: Path) -> None:
        self.cluster = cluster
        self.hosts = cluster.hosts
        self.lock = threading.Lock()
        self.samples: list[Sample] = []
        self.history_file = open(history_path, "a")  # noqa: SIM115 (closed in close_history)
        self._state: dict[str, tuple[str, int]] = {name: (DOWN, 0) for name in self.hosts}
        self._checked = 0
        self.killed: set[int] = set()  # id() of every sidecar Proc the campaign ended
        self.watchers: list[Watcher] = []

    # sidecar states -----------------------------------------------------------------------

    def state_of(self, name: str) -> tuple[str, int]:
        with self.lock:
            return self._state[name]

    def set_state(self, name: str, state: str) -> None:
        with self.lock:
            self._state[name] = (state, self._state[name][1] + 1)

    def record(self, sample: Sample, version: int) -> None:
        """Keep a poll; a first answer after a (re)start marks the sidecar up."""
        with self.lock:
            state, now_version = self._state[sample.node]
            if sample.answered and state == STARTING and now_version == version:
                self._state[sample.node] = (UP, version + 1)
            self.samples.append(sample)
            self.history_file.write(json.dumps(sample.to_json()) + "\n")

    def start(self, name: str) -> None:
        self.set_state(name, STARTING)
        self.cluster[name].start_sidecar()

    def kill(self, name: str) -> None:
        self.set_state(name, DOWN)
        sidecar = self.cluster[name].sidecar
        if sidecar is not None:
            self.killed.add(id(sidecar))
            sidecar.kill()

    def pause(self, name: str) -> None:
        self.set_state(name, PAUSED)
        sidecar = self.cluster[name].sidecar
        if sidecar is not None:
            sidecar.signal(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        sidecar = self.cluster[name].sidecar
        if sidecar is not None:
            sidecar.signal(signal.SIGCONT)
        self.set_state(name, STARTING)

    # samples -------------------------------------------------------------------------------

    def since(self, t: float) -> list[Sample]:
        with self.lock:
            index = len(self.samples)
            while index > 0 and self.samples[index - 1].t >= t - 2 * POLL_TIMEOUT_S:
                index -= 1
            return [s for s in self.samples[index:] if s.t >= t]

    def latest(self) -> dict[str, Sample]:
        with self.lock:
            found: dict[str, Sample] = {}
            for sample in reversed(self.samples):
                found.setdefault(sample.node, sample)
                if len(found) == len(self.hosts):
                    break
            return found

    def unchecked(self) -> list[Sample]:
        """The samples taken since the last call."""
        with self.lock:
            fresh = self.samples[self._checked :]
            self._checked = len(self.samples)
        return fresh

    def wait_converged(self, after_t: float, timeout_s: float) -> float | None:
        """Seconds from after_t until every node is ready on one generation; None if never."""
        deadline = after_t + timeout_s
        while True:
            at = history.converged_at(self.since(after_t), self.hosts, after_t)
            if at is not None:
                return at - after_t
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S)

    # watchers ------------------------------------------------------------------------------

    def start_watchers(self) -> None:
        self.watchers = [Watcher(self, node) for node in self.cluster]
        for watcher in self.watchers:
            watcher.start()

    def stop_watchers(self) -> None:
        for watcher in self.watchers:
            watcher.stopping.set()
        for watcher in self.watchers:
            watcher.join(timeout=2 * POLL_TIMEOUT_S + 1)

    def close_history(self) -> None:
        with self.lock:
            self.history_file.close()


class Watcher(threading.Thread):
    """Polls one node's /env and /status every POLL_S until stopped; every answer a Sample."""

    def __init__(self, watch: Watch, node: Node) -> None:
        super().__init__(name=f"watch-{node.name}", daemon=True)
        self.watch = watch
        self.node = node
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            started = time.monotonic()
            state, version = self.watch.state_of(self.node.name)
            sample = self.poll(state)
            self.watch.record(sample, version)
            self.stopping.wait(max(0.0, POLL_S - (time.monotonic() - started)))

    def poll(self, state: str) -> Sample:
        ns, name = self.node.ns, self.node.name
        try:
            env_reply = http_get(ns, "127.0.0.1", LOCAL_PORT, "/env?format=json",
                                 timeout_s=POLL_TIMEOUT_S)  # fmt: skip
            status_reply = http_get(ns, "127.0.0.1", LOCAL_PORT, "/status",
                                    timeout_s=POLL_TIMEOUT_S)  # fmt: skip
            status = status_reply.json()
            env = env_reply.json() if env_reply.status == 200 else None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            after, _ = self.watch.state_of(name)
            return Sample(time.monotonic(), name, state, after, False,
                          error=f"{type(exc).__name__}: {exc}")  # fmt: skip
        after, _ = self.watch.state_of(name)
        liveness = status.get("liveness") if isinstance(status, dict) else None
        return Sample(time.monotonic(), name, state, after, True, env is not None, env,
                      liveness if isinstance(liveness, dict) else None)  # fmt: skip
