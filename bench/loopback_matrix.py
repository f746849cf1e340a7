"""Which own-name-on-loopback patterns break gloo and torchrun, with and without an interface.

Three network namespaces (tests/support/cluster/), no sidecars: the env is written by
hand. For each launcher (plain gloo ``env://``, torchrun static, torchrun c10d), each pin
pattern (which nodes see their OWN name as ``127.0.1.1`` in their own hosts file, while the
other nodes map that name to its real address: Debian's ``127.0.1.1 <hostname>`` line)
and with or without ``GLOO_SOCKET_IFNAME`` set to the namespace's veth on every node, one
3-node all-reduce is run and recorded as completed or failed with its first error line.

    sudo python -m bench.loopback_matrix [--timeout 40] [--launchers gloo static c10d]
        [--patterns ...] [--subnets 10.213.0 192.168.213]

Needs root. Runs one job at a time; a job stops as soon as one process fails.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import common
from tests.support.cluster.build import Cluster
from tests.support.cluster.runs import prerequisites, sweep_stale
from tests.support.netns import IFNAME

HOSTS = ("main1", "sub1", "sub2")  # rank order: main1 is rank 0 and MASTER_ADDR
MASTER = HOSTS[0]
LOOPBACK_SELF = "127.0.1.1"
SCRIPT = common.REPO / "tests" / "support" / "allreduce.py"
#: pattern name -> the nodes whose own name is pinned to 127.0.1.1 in their own hosts file
PATTERNS: dict[str, tuple[str, ...]] = {
    "none": (),
    "master": ("main1",),
    "worker": ("sub1",),
    "master+worker": ("main1", "sub1"),
    "two-workers": ("sub1", "sub2"),
    "all-three": HOSTS,
}
LAUNCHERS = ("gloo", "static", "c10d")
IFNAMES: tuple[str | None, ...] = (None, IFNAME)
#: Node subnets on either side of 127.0.1.1: gloo's TCP pair dials from the larger address to
#: the smaller one, so where the real addresses sort relative to loopback decides who listens.
SUBNETS = ("10.213.0", "192.168.213")
# A failing rank makes its peers wait for it; give them this long to report their own error.
GRACE_S = 3.0
_ERROR_LINE = re.compile(r"\b[A-Za-z_.]*(?:Error|Exception)\b: .+")


def job_argv(launcher: str, rank: int, port: int, run_id: str, pg_timeout_s: float) -> list[str]:
    """The command one node runs for launcher (torchrun as `python -m torch.distributed.run`)."""
    client = [str(SCRIPT), "--timeout", f"{pg_timeout_s:g}", "--env-json"]
    if launcher == "gloo":
        return [sys.executable, *client, "{}"]
    run = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "3", "--nproc-per-node", "1"]
    if launcher == "static":
        run += [
            "--rdzv-backend", "static", "--node-rank", str(rank),
            "--master-addr", MASTER, "--master-port", str(port),
        ]  # fmt: skip
    elif launcher == "c10d":
        run += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{MASTER}:{port}"]
        run += ["--rdzv-id", run_id]
    else:
        raise ValueError(f"unknown launcher {launcher!r}: use one of {', '.join(LAUNCHERS)}")
    return [*run, *client, "{}"]


def job_env(launcher: str, rank: int, port: int, ifname: str | None) -> dict[str, str]:
    """The hand-written env of one node: torchrun derives the rest itself."""
    env: dict[str, str] = {"OMP_NUM_THREADS": "1"}
    if launcher == "gloo":
        env.update(
            MASTER_ADDR=MASTER,
            MASTER_PORT=str(port),
            WORLD_SIZE=str(len(HOSTS)),
            RANK=str(rank),
            LOCAL_RANK="0",
        )
    if ifname is not None:
        env["GLOO_SOCKET_IFNAME"] = ifname
    return env


def first_error(log: str) -> str | None:
    """The first `SomethingError: message` line of a log, else None."""
    for line in log.splitlines():
        found = _ERROR_LINE.search(line)
        if found:
            return found.group(0).strip()[:300]
    return None


def resolved_self(cluster: Cluster) -> dict[str, str]:
    """What each node's own name resolves to inside its own namespace (getent hosts)."""
    seen: dict[str, str] = {}
    for node in cluster:
        done = node.run(["getent", "hosts", node.name], timeout_s=10)
        seen[node.name] = (done.stdout.split() or ["unresolved"])[0]
    return seen


def one_job(
    cluster: Cluster,
    launcher: str,
    pinned: Sequence[str],
    ifname: str | None,
    port: int,
    timeout_s: float,
) -> dict[str, Any]:
    """Pin, start one process per node, wait for all to exit or one to fail; return the cell."""
    for node in cluster:
        if node.name in pinned:
            node.pin(node.name, LOOPBACK_SELF)
        else:
            node.unpin()
    self_addr = resolved_self(cluster)
    run_id = f"lb{port}"
    pg_timeout_s = max(5.0, timeout_s - 10)
    procs = {
        node.name: node.spawn(
            job_argv(launcher, rank, port, run_id, pg_timeout_s),
            env=job_env(launcher, rank, port, ifname),
            label=f"{launcher}-{port}",
        )
        for rank, node in enumerate(cluster)
    }
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    failed_at: float | None = None
    exited_at: dict[str, float] = {}
    while time.monotonic() < deadline:
        for name, proc in procs.items():
            if name not in exited_at and proc.returncode is not None:
                exited_at[name] = time.monotonic()
        codes = [p.returncode for p in procs.values()]
        if all(code is not None for code in codes):
            break
        if failed_at is None and any(code not in (None, 0) for code in codes):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
            break
        time.sleep(0.1)
    elapsed = time.monotonic() - t0
    codes_by_node = {name: proc.returncode for name, proc in procs.items()}
    for proc in procs.values():
        proc.kill()
    completed = all(code == 0 for code in codes_by_node.values())
    errors = {name: first_error(proc.log()) for name, proc in procs.items()}
    error, error_node = None, None
    if not completed:
        # Prefer the first node that exited non-zero: the others only saw it go.
        order = sorted(
            procs,
            key=lambda n: (codes_by_node[n] in (None, 0), exited_at.get(n, deadline)),
        )
        error_node = next((name for name in order if errors[name]), None)
        error = errors[error_node] if error_node else None
        if error is None:
            error = "timeout" if failed_at is None else "exited non-zero without an error line"
    for node in cluster:
        node.procs.clear()
    return {
        "launcher": launcher,
        "pinned": list(pinned),
        "gloo_socket_ifname": ifname,
        "self_resolves_to": self_addr,
        "outcome": "completed" if completed else "failed",
        "timed_out": not completed and failed_at is None,
        "exit_codes": codes_by_node,
        "seconds": round(elapsed, 1),
        "error_node": error_node,
        "first_error": error,
        "errors_by_node": errors,
    }


def subnet_cluster(subnet: str, workdir: Path) -> Cluster:
    """A cluster of HOSTS whose nodes take addresses in subnet (x.y.z) instead of the default."""
    cluster = Cluster(HOSTS, workdir)
    # Node addresses are plain fields read by up() and hosts_text(); setting them before up()
    # moves the whole cluster. The addresses exist only inside the namespaces, unrouted.
    for node in cluster:
        node.address = f"{subnet}.{node.index + 10}"
    return cluster


def print_table(cells: Sequence[dict[str, Any]], subnets: Sequence[str]) -> None:
    """One row per (subnet, pattern), one column per launcher: no ifname / with ifname."""
    launchers = list(dict.fromkeys(c["launcher"] for c in cells))
    patterns = list(dict.fromkeys(c["pattern"] for c in cells))
    print(f"\ncell = without GLOO_SOCKET_IFNAME / with GLOO_SOCKET_IFNAME={IFNAME}")
    print(
        f"{'subnet':16s} {'own name -> 127.0.1.1 on':28s}" + "".join(f"{x:>22s}" for x in launchers)
    )
    for subnet in subnets:
        for pattern in patterns:
            row = f"{subnet + '.0/24':16s} {pattern + ' (' + ','.join(PATTERNS[pattern]) + ')':28s}"
            for launcher in launchers:
                pair = [
                    c["outcome"]
                    for c in cells
                    if (c["launcher"], c["pattern"], c["subnet"]) == (launcher, pattern, subnet)
                ]
                row += f"{' / '.join(pair):>22s}"
            print(row)


def main() -> None:
    p = common.parser(__doc__)
    p.add_argument("--timeout", type=float, default=40.0, help="seconds per job")
    p.add_argument("--launchers", nargs="+", default=list(LAUNCHERS), choices=LAUNCHERS)
    p.add_argument("--patterns", nargs="+", default=list(PATTERNS), choices=list(PATTERNS))
    p.add_argument(
        "--subnets",
        nargs="+",
        default=list(SUBNETS),
        help="node subnets (x.y.z): gloo's dial direction follows address order vs 127.0.1.1",
    )
    args = p.parse_args()
    if args.quick:
        args.patterns = ["none", "all-three"]
    reason = prerequisites()
    if reason is not None:
        raise SystemExit(f"loopback matrix needs network namespaces: {reason}")
    import torch  # the version is part of the result; also warms the page cache

    sweep_stale()
    cells: list[dict[str, Any]] = []
    port = 29600
    for subnet in args.subnets:
        with common.workdir("rp-loopback-") as workdir, subnet_cluster(subnet, workdir) as cluster:
            for launcher in args.launchers:
                for pattern in args.patterns:
                    for ifname in IFNAMES:
                        port += 1
                        pinned = PATTERNS[pattern]
                        cell = one_job(cluster, launcher, pinned, ifname, port, args.timeout)
                        cell.update(pattern=pattern, subnet=subnet)
                        cells.append(cell)
                        shown = cell["outcome"] + ("" if cell["first_error"] is None else ": ")
                        print(
                            f"{subnet:13s} {launcher:6s} {pattern:13s} ifname={ifname or '-':4s} "
                            f"{cell['seconds']:5.1f} s {shown}{(cell['first_error'] or '')[:160]}",
                            flush=True,
                        )

    print(f"\ntorch {torch.__version__}")
    print_table(cells, args.subnets)
    argv = " ".join(sys.argv[1:])
    common.write_summary(
        "loopback_matrix",
        {
            "torch": torch.__version__,
            "command": f"python -m bench.loopback_matrix {argv}".strip(),
            "timeout_s": args.timeout,
            "hosts": list(HOSTS),
            "master": MASTER,
            "subnets": args.subnets,
            "patterns": {name: list(PATTERNS[name]) for name in args.patterns},
            "cells": cells,
        },
    )


if __name__ == "__main__":
    main()
