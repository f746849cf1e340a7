"""Import cost of the sidecar beyond a bare aiohttp server (`python -X importtime`), A/B
against another checkout: the part of the start-up gap that imports make.

Each round runs, in fresh interpreters and for each checkout (this one and, with --against,
another one's src/ first on PYTHONPATH), `import rallypoint.cli, rallypoint.sidecar` and
`import aiohttp.web`; the gap is the best of the first minus the best of the second. A third
interpreter imports aiohttp.web and then the sidecar: of the round where what came after
aiohttp.web took least, the modules with the most import time of their own are listed.

    python bench/imports.py --against /tmp/old    # 7 rounds
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import common

SIDE = "import rallypoint.cli, rallypoint.sidecar"
BARE = "import aiohttp.web"
TOP = 15


def importtime(src: Path, statement: str) -> list[tuple[int, int, str]]:
    """(self us, cumulative us, indented name) of every module the statement imported."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement],
        env=dict(os.environ, PYTHONPATH=str(src)),
        capture_output=True,
        text=True,
        check=True,
    )
    rows = []
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "cumulative" not in line:
            own, cumulative, name = line.removeprefix("import time:").split("|")
            rows.append((int(own), int(cumulative), name[1:]))
    return rows


def total_ms(rows: list[tuple[int, int, str]]) -> float:
    """The cumulative time of the top-level imports."""
    return sum(cumulative for _, cumulative, name in rows if not name.startswith(" ")) / 1000


def main() -> None:
    args = common.ab_parser(__doc__, rounds=7).parse_args()
    rounds = 2 if args.quick else args.rounds
    variants = common.checkouts(args.against)
    times: dict[tuple[str, str], list[float]] = {}
    fastest: dict[str, list[tuple[int, int, str]]] = {}
    load = [os.getloadavg()[0]]
    for _ in range(rounds):
        for name, src in variants.items():
            for kind, statement in (("side", SIDE), ("bare", BARE)):
                times.setdefault((name, kind), []).append(total_ms(importtime(src, statement)))
            rows = importtime(src, f"{BARE}; {SIDE}")
            after = rows[next(i for i, row in enumerate(rows) if row[2] == "aiohttp.web") + 1 :]
            if name not in fastest or total_ms(after) < total_ms(fastest[name]):
                fastest[name] = after
    load.append(os.getloadavg()[0])

    report: dict[str, object] = {}
    for name, src in variants.items():
        side, bare = times[(name, "side")], times[(name, "bare")]
        after = fastest[name]
        heaviest = sorted(after, reverse=True)[:TOP]
        report[name] = {
            "checkout": common.checkout_name(src.parent),
            "side_ms": common.summary(side),
            "bare_ms": common.summary(bare),
            "gap_of_bests_ms": round(min(side) - min(bare), 1),
            "after_aiohttp_web_best_ms": round(total_ms(after), 1),
            "heaviest_own_ms": {row[2].strip(): round(row[0] / 1000, 2) for row in heaviest},
        }
        print(
            f"{name}: sidecar imports best {min(side):.1f} ms, aiohttp.web best {min(bare):.1f}"
            f" ms, gap {min(side) - min(bare):.1f} ms; after aiohttp.web in one interpreter, best:"
            f" {total_ms(after):.1f} ms"
        )
    common.write_run_summary(
        "imports",
        args,
        f"--rounds {rounds}" + (" --against CHECKOUT" if args.against else ""),
        {"rounds": rounds, "load_avg_1m": [round(x, 1) for x in load], **report},
    )


if __name__ == "__main__":
    main()
