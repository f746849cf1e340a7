"""Stand-in trainer: prove the env served by rallypoint is usable, without torch.

Run under `rallypoint run -- python3 trainer.py` (which hands it the served env),
or after `rallypoint wait --out /rp/env.sh --format sh` with that file sourced
(`set -a; . /rp/env.sh`). It does what a torch job does with the env, minus the
tensors:

* the master node (NODE_RANK 0) listens on MASTER_PORT with SO_REUSEADDR, as
  torch's TCPStore does, while the sidecar in the same network namespace still
  holds the port;
* every other node connects to MASTER_ADDR:MASTER_PORT and exchanges a message;
* every node checks that TF_CONFIG parses and that its task names this host.

It prints one line `rallypoint-trainer {json}` with the env it used and exits
0 on success, 1 with a one-line `error:` otherwise.

With TRAINER_HOLD_S > 0 it then "trains" that long before the summary: a job that is
still running when a node goes away. Like a collective waiting on a dead peer, it does
not notice by itself; `rallypoint run` stops it (SIGTERM, logged as a `stopped` line).
With TRAINER_CRASH_HOST set to this host's name it exits 3 after its first exchange in
attempt 0 (RALLYPOINT_ATTEMPT): a crash for `rallypoint run --restarts` to restart.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time

SUMMARY_PREFIX = "rallypoint-trainer "
#: Printed after the first exchange with the master: from here on the job is "mid-job".
TRAINING_PREFIX = "rallypoint-trainer-training "
#: Printed when the trainer is stopped by a signal (what `rallypoint run` sends).
STOPPED_PREFIX = "rallypoint-trainer-stopped "
#: Printed when TRAINER_CRASH_HOST makes it crash; it then exits CRASH_CODE.
CRASHED_PREFIX = "rallypoint-trainer-crashed "
CRASH_CODE = 3
CONNECT_DEADLINE_S = float(os.environ.get("TRAINER_DEADLINE_S", "120"))
ENV_KEYS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "NNODES",
    "NODE_RANK",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "RALLYPOINT_GENERATION",
    "TF_CONFIG",
)


class TrainerError(Exception):
    """The served env is unusable; the message names the variable and what was found."""


def require_env(name: str) -> str:
    """Return the variable or raise naming it."""
    value = os.environ.get(name)
    if not value:
        raise TrainerError(f"{name} is not set; was the env file sourced with `set -a`?")
    return value


def require_int(name: str) -> int:
    """Return the variable as an int or raise naming it."""
    value = require_env(name)
    try:
        return int(value)
    except ValueError as exc:
        raise TrainerError(f"{name}={value!r} is not an integer") from exc


def split_address(address: str) -> tuple[str, int]:
    """Split `host:port` or `[v6]:port`."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise TrainerError(f"TF_CONFIG address {address!r} is not host:port")
    return host.strip("[]"), int(port)


def check_tf_config(hostname: str) -> dict[str, object]:
    """Parse TF_CONFIG and check that the task's own address names this host."""
    raw = require_env("TF_CONFIG")
    try:
        config = json.loads(raw)
        cluster = config["cluster"]
        task_type = config["task"]["type"]
        index = int(config["task"]["index"])
    except (ValueError, KeyError, TypeError) as exc:
        raise TrainerError(f"TF_CONFIG does not parse as a TF_CONFIG: {exc!r}: {raw}") from exc
    addresses = cluster.get(task_type, [])
    if not 0 <= index < len(addresses):
        raise TrainerError(f"TF_CONFIG task {task_type}:{index} is not in cluster {cluster}")
    host, _port = split_address(addresses[index])
    short = hostname.split(".", 1)[0]
    if host.split(".", 1)[0] != short:
        raise TrainerError(f"TF_CONFIG task {task_type}:{index} is {host}, not this host {short}")
    return dict(cluster)


def listen_reuseaddr(port: int) -> socket.socket:
    """Listen on the master port beside the sidecar's held socket, as TCPStore does."""
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        address: tuple[str, int] = ("::", port)
    except OSError:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        address = ("0.0.0.0", port)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(64)
    except OSError as exc:
        sock.close()
        raise TrainerError(f"cannot listen on MASTER_PORT={port}: {exc}") from exc
    return sock


def serve_master(port: int, nnodes: int, hostname: str) -> list[str]:
    """Accept one hello from every other node and answer it; return the peers' greetings."""
    greetings: list[str] = []
    with listen_reuseaddr(port) as server:
        server.settimeout(CONNECT_DEADLINE_S)
        while len(greetings) < nnodes - 1:
            try:
                conn, _peer = server.accept()
            except TimeoutError as exc:
                raise TrainerError(
                    f"only {len(greetings)} of {nnodes - 1} workers connected to port {port} "
                    f"within {CONNECT_DEADLINE_S:.0f}s"
                ) from exc
            with conn:
                conn.settimeout(10)
                line = conn.makefile("r").readline().strip()
                if not line.startswith("hello "):
                    continue  # not one of ours (a probe); keep waiting for the workers
                greetings.append(line)
                conn.sendall(f"welcome from {hostname}\n".encode())
    return greetings


def greet_master(addr: str, port: int, rank: int, hostname: str) -> str:
    """Connect to the master (it may start after us), say hello, return its answer."""
    deadline = time.monotonic() + CONNECT_DEADLINE_S
    delay_s = 0.1
    while True:
        try:
            with socket.create_connection((addr, port), timeout=5) as conn:
                conn.sendall(f"hello rank={rank} host={hostname}\n".encode())
                answer = conn.makefile("r").readline().strip()
                if answer.startswith("welcome"):
                    return answer
                last_error = f"unexpected answer {answer!r}"
        except OSError as exc:
            last_error = str(exc)
        if time.monotonic() >= deadline:
            raise TrainerError(
                f"cannot exchange a message with MASTER_ADDR={addr} MASTER_PORT={port} "
                f"within {CONNECT_DEADLINE_S:.0f}s: {last_error}"
            )
        time.sleep(delay_s)
        delay_s = min(delay_s * 2, 2.0)


def hold(hostname: str, exchanged: list[str]) -> None:
    """Stay "mid-job" for TRAINER_HOLD_S seconds; a SIGTERM ends it with 128+15."""
    raw = os.environ.get("TRAINER_HOLD_S") or "0"
    try:
        hold_s = float(raw)
    except ValueError as exc:
        raise TrainerError(f"TRAINER_HOLD_S={raw!r} is not a number of seconds") from exc
    if hold_s <= 0:
        return

    def stopped(signum: int, _frame: object) -> None:
        # Say so, so that a reader (and the compose tier) can tell a stop from a crash.
        # os.write, not print: the signal may land inside a print, and sys.stdout is
        # not reentrant.
        name = signal.Signals(signum).name
        os.write(sys.stdout.fileno(), f"{STOPPED_PREFIX}{hostname} by {name}\n".encode())
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stopped)
    attempt = int(os.environ.get("RALLYPOINT_ATTEMPT", "0"))
    info = {"host": hostname, "exchanged": len(exchanged), "hold_s": hold_s, "attempt": attempt}
    print(TRAINING_PREFIX + json.dumps(info, sort_keys=True), flush=True)
    time.sleep(hold_s)


def main() -> int:
    """Check the env, talk to the master, (hold,) print the summary line."""
    hostname = socket.gethostname()
    try:
        addr = require_env("MASTER_ADDR")
        port = require_int("MASTER_PORT")
        nnodes = require_int("NNODES")
        rank = require_int("NODE_RANK")
        world_size = require_int("WORLD_SIZE")
        if not 0 <= rank < nnodes:
            raise TrainerError(f"NODE_RANK={rank} is out of range for NNODES={nnodes}")
        cluster = check_tf_config(hostname)
        if rank == 0:
            exchanged = serve_master(port, nnodes, hostname)
        else:
            exchanged = [greet_master(addr, port, rank, hostname)]
        crash = os.environ.get("TRAINER_CRASH_HOST") == hostname
        if crash and os.environ.get("RALLYPOINT_ATTEMPT", "0") == "0":
            print(f"{CRASHED_PREFIX}{hostname} with {CRASH_CODE}", flush=True)
            return CRASH_CODE
        hold(hostname, exchanged)
    except TrainerError as exc:
        print(f"error: {hostname}: {exc}", file=sys.stderr, flush=True)
        return 1
    summary = {
        "host": hostname,
        "ok": True,
        "exchanged": exchanged,
        "world_size": world_size,
        "tf_cluster": cluster,
        "env": {key: os.environ[key] for key in ENV_KEYS if key in os.environ},
    }
    print(SUMMARY_PREFIX + json.dumps(summary, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
