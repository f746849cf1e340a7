"""CPU time of one connection probe, both ends in one process on loopback.

A cluster of N nodes makes about 2 x N x (N-1) probes when TF_CONFIG is served (every node
probes every peer's probe port and TF port, workers the master port too), each answered
by the peer's window. This measures what one costs: the prober's connect, challenge and
check, and the listener's accept, HMAC answer and close, in batches of 50 at once.

    python -m bench.probe_cost               # 10 rounds of 20 batches
    python -m bench.probe_cost --quick
    python -m bench.probe_cost --loops       # asyncio's loop and uvloop (pip install uvloop)
"""

from __future__ import annotations

import asyncio
import time

from bench import common
from rallypoint.auth import Authenticator
from rallypoint.metrics import Metrics
from rallypoint.net import ports, probe

BATCH = 50


async def rounds(count: int, batches: int) -> list[float]:
    held = ports.reserve_ephemeral()
    listener = probe.ProbeListener(
        session="s", rank=1, host="node1", auth=Authenticator("t"), metrics=Metrics()
    )
    await listener.serve(held.listen())
    auth = Authenticator("t")

    async def batch() -> None:
        outcomes = await asyncio.gather(
            *(
                probe.probe(
                    "127.0.0.1", held.port, session="s", auth=auth, rank=1, host="node1",
                    timeout_s=5.0,
                )
                for _ in range(BATCH)
            )
        )  # fmt: skip
        if not all(o.ok for o in outcomes):
            raise SystemExit(f"a probe failed: {[o for o in outcomes if not o.ok][:1]}")

    await batch()  # warm-up
    per_probe_ms = []
    for _ in range(count):
        cpu = time.process_time()
        for _ in range(batches):
            await batch()
        per_probe_ms.append((time.process_time() - cpu) / (batches * BATCH) * 1000)
    await listener.close()
    held.close()
    return per_probe_ms


def loops(count: int, batches: int) -> dict[str, object]:
    """CPU per probe on asyncio's loop and on uvloop, one round of each in turn."""
    try:
        import uvloop
    except ImportError as exc:
        raise SystemExit(f"--loops needs uvloop ({exc}): pip install uvloop") from exc

    runners = {"asyncio": asyncio.run, "uvloop": uvloop.run}
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(count):
        for name, run in runners.items():
            samples[name] += run(rounds(1, batches))
    figures = {name: common.summary(values) for name, values in samples.items()}
    ratio = figures["uvloop"]["p50"] / figures["asyncio"]["p50"]
    print(
        f"CPU per probe, both ends, p50: asyncio {figures['asyncio']['p50']:.3f} ms, uvloop "
        f"{figures['uvloop']['p50']:.3f} ms ({ratio:.2f}x; n={count} rounds each)"
    )
    return {"cpu_per_probe_ms": figures, "uvloop_over_asyncio_p50": round(ratio, 3)}


def main() -> None:
    p = common.parser(__doc__)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--loops", action="store_true", help="asyncio's loop against uvloop")
    args = p.parse_args()
    count, batches = (3, 4) if args.quick else (args.rounds, 20)
    if args.loops:
        name = "probe_cost-loops" + ("-quick" if args.quick else "")
        command = "python -m bench.probe_cost --loops" + (" --quick" if args.quick else "")
        common.write_summary(name, {"command": command, **loops(count, batches)})
        return
    samples = asyncio.run(rounds(count, batches))
    figure = common.summary(samples)
    print(f"CPU per probe, both ends: p50 {figure['p50']:.3f} ms (n={len(samples)} rounds)")
    for n in (8, 16, 64):
        probes = 2 * n * (n - 1) + (n - 1)
        print(
            f"N={n:3d}: {probes} probes in the cluster, about "
            f"{probes * figure['p50'] / n:.1f} ms of CPU per node"
        )
    common.write_summary(
        "probe_cost" if not args.quick else "probe_cost-quick",
        {
            "command": "python -m bench.probe_cost" + (" --quick" if args.quick else ""),
            "cpu_per_probe_ms": figure,
        },
    )


if __name__ == "__main__":
    main()
