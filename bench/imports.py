"""Import cost of the sidecar beyond a bare aiohttp server (`python -X importtime`), A/B
against another checkout: the part of the start-up gap that imports make.

Each round runs, in fresh interpreters and for each checkout (this one and, with --against,
another one's src/ first on PYTHONPATH), `import rallypoint.cli, rallypoint.sidecar` and
`import aiohttp.web`; the gap is the best of the first minus the best of the second. A third
interpreter imports aiohttp.web and then the sidecar: of the round where what came after
aiohttp.web took least, the modules with the most import time of their own are listed.

    python -m bench.imports --against ../old      # 7 rounds
    python -m bench.imports --mdns                # with what mDNS imports (the default)
    python -m bench.imports --threaded            # aiohttp.web on a thread meanwhile
    python -m bench.imports --per-module          # what one module more costs to import

--per-module measures what merging modules could save: a generated package of as many small
modules as `serve` imports of its own, against one module holding the same code.

Beside the heaviest own modules, the libraries first imported after aiohttp.web are listed
with their cumulative import time (msgspec; zeroconf with --mdns).

--threaded measures an idea instead (section 4, round 7 of docs/performance.md): while a
thread imports aiohttp.web (whose import loads the system's CA certificates for its client,
in OpenSSL, without the GIL), the main thread imports the sidecar's modules that do not
need aiohttp (zeroconf included); then the rest. Wall time in fresh interpreters, against
the same modules imported one after the other, interleaved.
"""

from __future__ import annotations

import compileall
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import common

SIDE = "import rallypoint.cli, rallypoint.sidecar"
MDNS = ", rallypoint.mdns.announce, rallypoint.mdns.loop"
BARE = "import aiohttp.web"
TOP = 15


def run(src: Path, code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter with ``src`` first on the path."""
    return subprocess.run(
        [sys.executable, *flags, "-c", code],
        env=dict(os.environ, PYTHONPATH=str(src)),
        capture_output=True,
        text=True,
        check=True,
    )


def importtime(src: Path, statement: str) -> list[tuple[int, int, str]]:
    """(self us, cumulative us, indented name) of every module the statement imported."""
    rows = []
    for line in run(src, statement, "-X", "importtime").stderr.splitlines():
        if line.startswith("import time:") and "cumulative" not in line:
            own, cumulative, name = line.removeprefix("import time:").split("|")
            rows.append((int(own), int(cumulative), name[1:]))
    return rows


#: Everything `serve` imports before its listeners, mDNS on.
SERVE = ("rallypoint.cli.commands", "rallypoint.sidecar", "rallypoint.mdns.announce",
         "rallypoint.mdns.loop")  # fmt: skip

#: A child that prints the wall ms of ``body``; ``setup`` runs before the clock starts.
TIMED = """\
import importlib, time{setup}
started = time.perf_counter()
{body}
print((time.perf_counter() - started) * 1000)
"""
SERIAL = """\
import asyncio, threading, aiohttp.web
for name in {free!r} + {rest!r}: importlib.import_module(name)"""
THREADED = """\
import asyncio, threading
loader = threading.Thread(target=importlib.import_module, args=("aiohttp.web",))
loader.start()
for name in {free!r}: importlib.import_module(name)
loader.join()
for name in {rest!r}: importlib.import_module(name)"""


def child(src: Path, code: str) -> str:
    """What ``code`` printed, run as run() does."""
    return run(src, code).stdout.strip()


def own_modules(src: Path) -> list[str]:
    """The rallypoint modules `serve` imports before its listeners (mDNS on), in order."""
    names = child(src, f"import sys; import {', '.join(SERVE)}; print(*sys.modules)").split()
    return [n for n in names if n.startswith("rallypoint")]


def aiohttp_free(src: Path) -> list[str]:
    """The rallypoint modules `serve` imports whose own imports need no aiohttp, in order."""
    ours = own_modules(src)
    check = "import sys, {}; print('aiohttp' in sys.modules)"
    return [n for n in ours if child(src, check.format(n)) == "False"]


def threaded(src: Path, rounds: int) -> dict[str, object]:
    """Serial against threaded imports of the same modules, wall ms, interleaved."""
    free = aiohttp_free(src)
    variants = {
        "serial": TIMED.format(setup="", body=SERIAL.format(free=free, rest=list(SERVE))),
        "threaded": TIMED.format(setup="", body=THREADED.format(free=free, rest=list(SERVE))),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, code in variants.items():
            times[name].append(float(child(src, code)))
    serial, thread = statistics.median(times["serial"]), statistics.median(times["threaded"])
    print(
        f"{len(free)} aiohttp-free modules on the main thread; wall p50: serial {serial:.1f} ms,"
        f" threaded {thread:.1f} ms ({thread / serial:.2f}x)"
    )
    return {
        "aiohttp_free_modules": len(free),
        "serial_ms": common.summary(times["serial"]),
        "threaded_ms": common.summary(times["threaded"]),
        "threaded_over_serial_p50": round(thread / serial, 3),
    }


SMALL_MODULE = """\
import logging
log = logging.getLogger(__name__)
class Thing{i}:
    def __init__(self, a, b):
        self.a, self.b = a, b
    def total(self):
        return self.a + self.b
def helper{i}(x):
    return [Thing{i}(x, y) for y in range(3)]
CONST{i} = {{"a": 1, "b": 2}}
"""


def per_module(rounds: int) -> dict[str, object]:
    """N small modules against one module with their code: import wall ms, interleaved."""
    count = len(own_modules(common.REPO / "src"))
    with tempfile.TemporaryDirectory(prefix="rp-modules-") as tmp:
        roots = {"many": Path(tmp, "many"), "one": Path(tmp, "one")}
        for root in roots.values():
            (root / "pk").mkdir(parents=True)
            (root / "pk" / "__init__.py").write_text("")
        codes = [SMALL_MODULE.format(i=i) for i in range(count)]
        for i, code in enumerate(codes):
            (roots["many"] / "pk" / f"m{i}.py").write_text(code)
        (roots["one"] / "pk" / "m.py").write_text("\n".join(codes))
        names = {"many": [f"pk.m{i}" for i in range(count)], "one": ["pk.m"]}
        compileall.compile_dir(tmp, quiet=1)
        times: dict[str, list[float]] = {"many": [], "one": []}
        for _ in range(rounds):
            for kind, root in roots.items():
                body = f"for name in {names[kind]!r}: importlib.import_module(name)"
                code = TIMED.format(setup=", logging", body=body)
                times[kind].append(float(child(root, code)))
    many, one = statistics.median(times["many"]), statistics.median(times["one"])
    print(
        f"{count} modules: p50 {many:.1f} ms; the same code in one module: {one:.1f} ms;"
        f" {(many - one) / count * 1000:.0f} us per module"
    )
    return {
        "modules": count,
        "many_ms": common.summary(times["many"]),
        "one_ms": common.summary(times["one"]),
        "per_module_us_p50": round((many - one) / count * 1000),
    }


def total_ms(rows: list[tuple[int, int, str]]) -> float:
    """The cumulative time of the top-level imports."""
    return sum(cumulative for _, cumulative, name in rows if not name.startswith(" ")) / 1000


def main() -> None:
    p = common.ab_parser(__doc__, rounds=7)
    p.add_argument("--threaded", action="store_true", help="measure imports on two threads")
    p.add_argument("--mdns", action="store_true", help="the sidecar's imports with mDNS on")
    p.add_argument("--per-module", action="store_true", help="the cost of one module more")
    args = p.parse_args()
    rounds = 2 if args.quick else args.rounds
    if args.threaded or args.per_module:
        mode = "threaded" if args.threaded else "per-module"
        load = [os.getloadavg()[0]]
        if args.threaded:
            report = threaded(common.REPO / "src", 3 * rounds)
        else:
            report = per_module(3 * rounds)
        load.append(os.getloadavg()[0])
        options = "--quick" if args.quick else f"--rounds {rounds}"
        common.write_summary(
            f"imports-{mode}" + ("-quick" if args.quick else ""),
            {
                "command": f"python -m bench.imports --{mode} {options}",
                "rounds": 3 * rounds,
                "load_avg_1m": [round(x, 1) for x in load],
                **report,
            },
        )
        return
    side_statement = SIDE + (MDNS if args.mdns else "")
    variants = common.checkouts(args.against)
    times: dict[tuple[str, str], list[float]] = {}
    fastest: dict[str, list[tuple[int, int, str]]] = {}
    load = [os.getloadavg()[0]]
    for _ in range(rounds):
        for name, src in variants.items():
            for kind, statement in (("side", side_statement), ("bare", BARE)):
                times.setdefault((name, kind), []).append(total_ms(importtime(src, statement)))
            rows = importtime(src, f"{BARE}; {side_statement}")
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
            "libraries_ms": {
                row[2].strip(): round(row[1] / 1000, 2)
                for row in after
                if "." not in row[2] and row[2].strip()[0] != "_" and "rallypoint" not in row[2]
            },
        }
        print(
            f"{name}: sidecar imports best {min(side):.1f} ms, aiohttp.web best {min(bare):.1f}"
            f" ms, gap {min(side) - min(bare):.1f} ms; after aiohttp.web in one interpreter, best:"
            f" {total_ms(after):.1f} ms"
        )
    name = "imports-mdns" if args.mdns else "imports"
    options = "--quick" if args.quick else f"--rounds {rounds}"
    options += (" --mdns" if args.mdns else "") + (" --against CHECKOUT" if args.against else "")
    common.write_summary(
        name + ("-quick" if args.quick else ""),
        {
            "command": f"python -m bench.imports {options}",
            "rounds": rounds,
            "load_avg_1m": [round(x, 1) for x in load],
            **report,
        },
    )


if __name__ == "__main__":
    main()
