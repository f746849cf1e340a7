"""Drive docker and docker-compose for the compose tier: images, sessions, logs, teardown."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.support.commands import run

REPO = Path(__file__).resolve().parents[2]
DOCKER_DIR = REPO / "docker"
BUILD_SCRIPT = REPO / "scripts" / "build-images.sh"
BUILD_LOCK = REPO / "dist" / "build-images.lock"
IMAGE = os.environ.get("RALLYPOINT_IMAGE", "rallypoint:local")
SUMMARY_PREFIX = "rallypoint-trainer "

BUILD_TIMEOUT_S = 900.0
UP_TIMEOUT_S = 300.0
TRAINER_TIMEOUT_S = 300.0
DOWN_TIMEOUT_S = 120.0


def docker_cli() -> str | None:
    """The docker client to use: Debian's packaged one first (it matches Debian's engine)."""
    if Path("/usr/bin/docker").is_file():
        return "/usr/bin/docker"
    return shutil.which("docker")


def compose_cli(docker: str | None) -> list[str] | None:
    """docker-compose 1.x if installed, else the `docker compose` v2 plugin, else None."""
    legacy = shutil.which("docker-compose")
    if legacy:
        return [legacy]
    if docker and run([docker, "compose", "version"], timeout_s=30, check=False).returncode == 0:
        return [docker, "compose"]
    return None


def engine_answers(docker: str | None) -> bool:
    """True when a Docker engine answers `docker info`."""
    if docker is None:
        return False
    try:
        return run([docker, "info"], timeout_s=30, check=False).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def build_images() -> None:
    """Build (or refresh, cached) the rallypoint image with scripts/build-images.sh.

    One build at a time: tests side by side each call this once, the first builds (unless
    scripts/test.sh did), the others wait for it and find everything cached.
    """
    BUILD_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with BUILD_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run(
            ["bash", str(BUILD_SCRIPT)],
            timeout_s=BUILD_TIMEOUT_S,
            check=True,
            env={**os.environ, "IMAGE": IMAGE},
        )


@dataclass
class TrainerResult:
    """What one trainer container did."""

    service: str
    exit_code: int
    logs: str
    summary: dict[str, Any] | None


@dataclass
class ComposeSession:
    """One `docker-compose -p <unique> -f <file>` project, torn down with `down -v`."""

    docker: str
    compose: list[str]
    file: Path
    project: str = field(default_factory=lambda: f"rptest{uuid.uuid4().hex[:10]}")
    #: Variables the compose file interpolates (TRAINER_HOLD_S, say), over the caller's.
    variables: dict[str, str] = field(default_factory=dict)

    def _env(self) -> dict[str, str]:
        return {**os.environ, "RALLYPOINT_IMAGE": IMAGE, **self.variables}

    def _compose(
        self, *args: str, timeout_s: float, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        argv = [*self.compose, "--ansi", "never", "-p", self.project, "-f", str(self.file), *args]
        return run(argv, timeout_s=timeout_s, check=check, env=self._env())

    def up(self) -> None:
        """Start every service detached; returns once the trainers have been started.

        Detached because docker-compose 1.29's --abort-on-container-exit also fires
        when an init container exits 0.
        """
        self._compose("up", "-d", timeout_s=UP_TIMEOUT_S)

    def container_id(self, service: str) -> str:
        """The container of a service (its only replica)."""
        out = self._compose("ps", "-q", service, timeout_s=60, check=True).stdout.split()
        if len(out) != 1:
            raise AssertionError(f"service {service} has containers {out}, expected one")
        return out[0]

    def sidecar_status(self, service: str) -> dict[str, Any]:
        """The sidecar's /status, read inside its container with `rallypoint status --json`."""
        cid = self.container_id(service)
        out = run(
            [self.docker, "exec", cid, "rallypoint", "status", "--json"], timeout_s=60, check=True
        )
        status = json.loads(out.stdout)
        assert isinstance(status, dict), out.stdout
        return status

    def container_logs(self, service: str) -> str:
        """One container's stdout and stderr so far."""
        done = run([self.docker, "logs", self.container_id(service)], timeout_s=60, check=True)
        return done.stdout + done.stderr

    def stop(self, services: Sequence[str], *, grace_s: int) -> None:
        """`docker stop` each service's container in turn: SIGTERM, SIGKILL after grace_s."""
        for service in services:
            cid = self.container_id(service)
            run([self.docker, "stop", "-t", str(grace_s), cid], timeout_s=grace_s + 60, check=True)

    def kill(self, services: Sequence[str]) -> None:
        """`docker kill -s KILL` the services' containers at once: no signal to handle."""
        ids = [self.container_id(service) for service in services]
        run([self.docker, "kill", "-s", "KILL", *ids], timeout_s=60, check=True)

    def finished_at(self, service: str) -> float:
        """When the service's container exited, as seconds since the epoch."""
        return epoch(self._state(self.container_id(service))["FinishedAt"])

    def wait_trainers(self, services: Sequence[str]) -> list[TrainerResult]:
        """Wait until every trainer exited; return their exit codes, logs and summaries."""
        ids = {service: self.container_id(service) for service in services}
        run([self.docker, "wait", *ids.values()], timeout_s=TRAINER_TIMEOUT_S, check=True)
        results = []
        for service, cid in ids.items():
            code = run(
                [self.docker, "inspect", "-f", "{{.State.ExitCode}}", cid], timeout_s=60, check=True
            ).stdout.strip()
            logs = run([self.docker, "logs", cid], timeout_s=60, check=True)
            text = logs.stdout + logs.stderr
            results.append(TrainerResult(service, int(code), text, parse_summary(text)))
        return results

    @contextlib.contextmanager
    def logs_on_failure(self) -> Iterator[None]:
        """Print every service's logs (pytest shows them) when the block raises."""
        try:
            yield
        except BaseException:
            print(f"--- docker-compose logs of project {self.project}\n{self.logs()}")
            raise

    def started_after_init(self, node: str) -> tuple[bool, str]:
        """Whether the node's trainer started only after its init exited 0 (and the times)."""
        init = self._state(self.container_id(f"{node}-init"))
        trainer = self._state(self.container_id(f"{node}-trainer"))
        detail = (
            f"{node}-init exit {init['ExitCode']} finished {init['FinishedAt']}, "
            f"{node}-trainer started {trainer['StartedAt']}"
        )
        ok = init["ExitCode"] == 0 and timestamp(init["FinishedAt"]) <= timestamp(
            trainer["StartedAt"]
        )
        return ok, detail

    def state(self, service: str) -> dict[str, Any]:
        """The service's container's State (Status, ExitCode, Pid, Restarting, ...)."""
        return self._state(self.container_id(service))

    def restarts(self, service: str) -> int:
        """How often Docker restarted the service's container (its restart policy)."""
        cid = self.container_id(service)
        out = run(
            [self.docker, "inspect", "-f", "{{.RestartCount}}", cid], timeout_s=60, check=True
        ).stdout
        return int(out.strip())

    def _state(self, cid: str) -> dict[str, Any]:
        out = run(
            [self.docker, "inspect", "-f", "{{json .State}}", cid], timeout_s=60, check=True
        ).stdout
        state = json.loads(out)
        assert isinstance(state, dict)
        return state

    def logs(self) -> str:
        """Every service's logs, for a failure report."""
        done = self._compose("logs", "--no-color", "--timestamps", timeout_s=120, check=False)
        return done.stdout + done.stderr

    def down(self) -> None:
        """Remove containers, networks and volumes of this project (safe to call twice)."""
        self._compose(
            "down", "-v", "--remove-orphans", "-t", "5", timeout_s=DOWN_TIMEOUT_S, check=False
        )


def parse_summary(logs: str) -> dict[str, Any] | None:
    """The trainer's `rallypoint-trainer {json}` line, or None when it printed none."""
    for line in logs.splitlines():
        _, sep, payload = line.partition(SUMMARY_PREFIX)
        if sep and payload.startswith("{"):
            value = json.loads(payload)
            if isinstance(value, dict):
                return value
    return None


def timestamp(value: str) -> tuple[str, int]:
    """Docker's RFC 3339 time (nanoseconds, trailing zeros trimmed) as a sortable pair."""
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z", value)
    if match is None:
        raise AssertionError(f"unexpected docker timestamp {value!r}")
    return match.group(1), int((match.group(2) or "").ljust(9, "0"))


def epoch(value: str) -> float:
    """Docker's RFC 3339 UTC time as seconds since the epoch (microseconds kept)."""
    seconds, nanos = timestamp(value)
    return datetime.fromisoformat(seconds + "+00:00").timestamp() + nanos / 1e9


def wait_until(what: str, check: Callable[[], str | None], timeout_s: float) -> None:
    """Poll ``check`` (None: done, else what is still missing) until done or timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = check()
        if missing is None:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not within {timeout_s:.0f} s: {missing}")
        time.sleep(1.0)
