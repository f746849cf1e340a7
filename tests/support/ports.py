"""Free ports for tests (plumbing only: production holds the ports it hands out)."""

from __future__ import annotations

import contextlib
import os
import random
import socket
from collections.abc import Iterator

#: Where free_port looks by default: below Linux's ephemeral range (32768-60999), where the
#: outgoing connections of the nodes a test already started cannot take a port handed out
#: for a node it starts later, and above the sidecar's own port range (20000-29999).
DEFAULT_RANGE = (30000, 32700)


class PortPool:
    """Hands out ports nothing is bound to, none twice while most of its range lasts.

    A port is bound only when the node it was handed out for starts. Drawn with
    replacement, two nodes of one test got the same port about once per few hundred
    clusters, so the pool remembers what it handed out. When most of the range has been
    handed out it forgets the older half only: the ports of the test still taking them
    (not yet bound, so the bind check cannot see them) stay handed out.
    """

    def __init__(self) -> None:
        self.handed_out: dict[int, None] = {}  # in the order handed out

    def take(self, host: str, low: int, high: int) -> int:
        size = high - low + 1
        candidates = [port for port in range(low, high + 1) if port not in self.handed_out]
        if len(candidates) < size // 4:
            # Most of the range was handed out: the tests the older ports were for have ended.
            in_range = [port for port in self.handed_out if low <= port <= high]
            for port in in_range[: len(in_range) - size // 2]:
                del self.handed_out[port]
            candidates = [port for port in range(low, high + 1) if port not in self.handed_out]
        random.shuffle(candidates)
        for port in candidates[:200]:
            with socket.socket() as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
            self.handed_out[port] = None
            return port
        raise AssertionError(f"no free port in {low}-{high}")


_POOL = PortPool()


def worker_slice(low: int, high: int, environ: dict[str, str] | None = None) -> tuple[int, int]:
    """This pytest-xdist worker's share of [low, high]: its own slice, so that tests side by
    side never hand out one port twice; the whole range outside xdist."""
    env = os.environ if environ is None else environ
    worker, count = env.get("PYTEST_XDIST_WORKER", ""), env.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit()):
        return low, high
    index, workers = int(worker[2:]), max(int(count), 1)
    size = (high - low + 1) // workers
    if size < 64 or index >= workers:
        return low, high  # too narrow to share out
    start = low + index * size
    return start, start + size - 1


def free_port(host: str = "127.0.0.1", *, low: int = 0, high: int = 0) -> int:
    """A port in [low, high] (default DEFAULT_RANGE) nothing is bound to on ``host`` right
    now, and not handed out before by this process while the range lasts; side by side,
    from this worker's slice of the range alone (worker_slice)."""
    if not high:
        low, high = DEFAULT_RANGE
    return _POOL.take(host, *worker_slice(low, high))


@contextlib.contextmanager
def black_hole(host: str = "127.0.0.1") -> Iterator[tuple[str, int]]:
    """An address whose connects hang, as behind a firewall that drops them: a listener
    whose accept queue is full, so the kernel drops every further SYN."""
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind((host, 0))
        listener.listen(0)
        address = listener.getsockname()[:2]
        for _ in range(3):
            filler = stack.enter_context(socket.socket())
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(address)
        yield address
