"""Shared helpers for the benchmarks: statistics, process accounting, sidecar launch, output.

Every benchmark reports medians and p99 (never means) and takes its ratios from figures
measured side by side in the same run, because the reference machine has two cores and
other work running on it.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
IMG_DIR = REPO / "docs" / "img"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- statistics -------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summary(values: Sequence[float], scale: float = 1.0) -> dict[str, float | int]:
    """n, p50, p99, min and max of values, each multiplied by scale (e.g. 1000 for ms)."""
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": round(percentile(values, 50) * scale, 3),
        "p99": round(percentile(values, 99) * scale, 3),
        "min": round(min(values) * scale, 3),
        "max": round(max(values) * scale, 3),
    }


# --- process accounting (no psutil) -----------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of pid so far (its own threads, not its children)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    # The command name may contain spaces and parentheses: fields start after the last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of pid in KiB."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


# --- local sidecars ---------------------------------------------------------------------------


@contextmanager
def workdir(prefix: str) -> Iterator[Path]:
    """A fresh temporary directory for a run's logs: removed when the run ends well, kept
    (and its path printed) when it raises, so that a failed run's logs can be read."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    except BaseException:
        print(f"logs kept in {path}", file=sys.stderr)
        raise
    shutil.rmtree(path, ignore_errors=True)


def free_port() -> int:
    """A currently unused loopback TCP port (for a listener the benchmark starts right away)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def quiet_environ(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment without any RALLYPOINT_*/orchestrator variables, plus extra."""
    drop = ("RALLYPOINT_", "BACKENDAI_", "SLURM_", "JOB_COMPLETION_INDEX", "MASTER_", "TF_CONFIG")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(extra or {})
    return env


def serve_argv(local_port: int, peer_port: int, *extra: str) -> list[str]:
    """`rallypoint serve` for a single node on loopback: no mDNS (no multicast off this host)."""
    return [
        sys.executable, "-m", "rallypoint", "serve",
        "--no-mdns",
        "--local-host", "127.0.0.1",
        "--local-port", str(local_port),
        "--peer-host", "127.0.0.1",
        "--peer-port", str(peer_port),
        *extra,
    ]  # fmt: skip


def spawn(
    argv: Sequence[str],
    *,
    cpus: str | None = None,
    env: Mapping[str, str] | None = None,
    log: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start argv (pinned to cpus with taskset when given); output to log or /dev/null."""
    full = ["taskset", "-c", cpus, *argv] if cpus else list(argv)
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            full,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env or quiet_environ()),
        )
    finally:
        if log:
            out.close()  # type: ignore[union-attr]


def stop(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after grace_s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def get(
    port: int, path: str, *, host: str = "127.0.0.1", timeout_s: float = 2.0
) -> tuple[int, bytes]:
    """One GET on a fresh connection: (status, body); OSError when nothing listens."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def wait_status(
    port: int, path: str, status: int = 200, *, timeout_s: float = 30.0, interval_s: float = 0.002
) -> float:
    """Poll GET path until it answers status; time.monotonic() of that answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            code, _ = get(port, path)
            if code == status:
                return time.monotonic()
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"127.0.0.1:{port}{path} did not answer {status} in {timeout_s}s")
        time.sleep(interval_s)


# --- arguments and output ---------------------------------------------------------------------


def own_code() -> str | None:
    """Why ``rallypoint`` would not be this checkout's src/ here, or None when it is.

    A benchmark and every process it starts import the interpreter's ``rallypoint``: an
    editable install of this checkout (``pip install -e .``), or another checkout's src/
    first on PYTHONPATH when an A/B runs that checkout's benchmark (against.py). Any other
    install would be measured under this checkout's name.
    """
    spec = importlib.util.find_spec("rallypoint")
    if spec is None or spec.origin is None:
        return "rallypoint is not installed"
    origin = Path(spec.origin).resolve()
    if origin.is_relative_to((REPO / "src").resolve()):
        return None
    return f"rallypoint is imported from {origin.parent}, not from this checkout's src/"


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An ArgumentParser with the flags every benchmark has: --quick and --no-plot.

    It stops the benchmark at once when ``rallypoint`` is not this checkout's (`own_code`).
    """
    why = own_code()
    if why is not None:
        raise SystemExit(f"{why}: pip install -e '.[bench]' in this checkout")
    prog = f"python -m bench.{Path(sys.argv[0]).stem}"
    p = argparse.ArgumentParser(prog=prog, description=(doc or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: few, short rounds")
    p.add_argument("--no-plot", action="store_true", help="skip the matplotlib figure")
    return p


def ab_parser(doc: str | None, rounds: int) -> argparse.ArgumentParser:
    """parser() plus --rounds and --against CHECKOUT, for an A/B of two checkouts."""
    p = parser(doc)
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--against", type=Path, help="another checkout, measured in the same rounds")
    return p


def checkouts(against: Path | None) -> dict[str, Path]:
    """The src/ directories to measure: this checkout's ("this") and --against's ("against")."""
    found = {"this": REPO / "src"}
    if against is not None:
        found["against"] = against.resolve() / "src"
    return found


def checkout_name(path: Path) -> str:
    """The commit a checkout is at (its path would name this machine's directories)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "another checkout"
    return f"commit {out.stdout.strip()}"


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "python": platform.python_version(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def write_summary(name: str, data: Mapping[str, Any]) -> Path:
    """Write bench/results/<name>.json (small: figures, not raw samples) and return its path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **data}, indent=2, sort_keys=False) + "\n")
    print(f"wrote {path.relative_to(REPO)}")
    return path


def can_plot(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Stop at once, not after the run, when the figure asked for cannot be drawn."""
    if args.no_plot:
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        p.error("matplotlib is not installed: pip install -e '.[bench]', or pass --no-plot")


def pyplot() -> Any:
    """matplotlib.pyplot with the file-only backend (installed by the `bench` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, name: str) -> None:
    """Save fig as docs/img/<name>.png."""
    IMG_DIR.mkdir(parents=True, exist_ok=True)
    path = IMG_DIR / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path.relative_to(REPO)}")


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def target(value: Any, want: str, met: bool) -> dict[str, Any]:
    """One target in a summary: the figure, what it should be (e.g. "<= 50") and met/MISSED."""
    return {"value": value, "target": want, "verdict": verdict(met)}


def print_targets(targets: Mapping[str, Mapping[str, Any]]) -> None:
    """One `target NAME: VALUE (want WANT): met|MISSED` line per target."""
    for name, t in targets.items():
        print(f"target {name}: {t['value']} (want {t['target']}): {t['verdict']}")


def write_run_summary(
    name: str, args: argparse.Namespace, options: str, data: Mapping[str, Any]
) -> Path:
    """Write <name>.json, or <name>-quick.json for --quick, with the command that made it.

    ``options`` are the flags a full run was given (ignored with --quick).
    """
    command = f"python -m bench.{name} " + ("--quick" if args.quick else options)
    return write_summary(f"{name}-quick" if args.quick else name, {"command": command, **data})
