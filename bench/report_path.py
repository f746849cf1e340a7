"""One job failure's path through the code, measured: modules, returns and hops per process.

Three sidecars (`rallypoint serve`, the explicit provider, a session token) run on loopback:
node N's peer API on 127.0.0.(N+1) at one shared port (Linux routes 127/8 to loopback, and
--allow-loopback accepts the names), node 0 the master, no relays, no connection checks,
keep-alives every 600 s so that no periodic traffic falls in the window. One `rallypoint run`
per node supervises a child that sleeps; once the job runs on every node, node 1's child
exits 3, and the runs of nodes 0 and 2 stop theirs.

Each of the six processes runs under a profiler (sys.setprofile and threading.setprofile,
set before `rallypoint` is imported) that records every call of a function of the package:
time, thread, module (relative to the package), qualified name. From node 1's child's exit
until node 2's child gets its SIGTERM, each process's calls are read in order, by the same
rules for every version: a frame is listed once (a callee returning to it, a coroutine of
the window resuming, do not list it again); a frame that was waiting before the window is
listed where it first resumes (a coroutine) or first calls into the package (a thread back
from I/O or a queue); property reads and comprehensions are not calls; the side work in
EXCLUSIONS is left out with all it calls.

Counted per process and over the path (node 1's run and sidecar, node 0's sidecar, node 2's
sidecar and run; node 0's own run is shown beside): distinct modules, returns (a module
entered again after another one since) and hops; first for the whole window, then for each
process only until the next one on the path takes the failure up (its first hop), which
leaves out the answers going back and what follows. Hops in an equally long window just
before the failure are shown as noise. The modules are the same from run to run; returns and
hops move with how the processes interleave (what else a sidecar does meanwhile).

    python -m bench.report_path                      # this checkout
    python -m bench.report_path --against ../old     # and another checkout's src/, by side
"""

from __future__ import annotations

import fnmatch
import json
import secrets
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import common

#: Side work left out of the path, with everything it calls: (patterns, why), after the
#: rules of the hand count this measures again. A pattern is a glob of a module path relative
#: to the package, or "module:name" with a glob of a qualified name; patterns are separated
#: by spaces. Where a module moved, both layouts match (rendezvous/X, rendezvous/afterready/X).
EXCLUSIONS: tuple[tuple[str, str], ...] = (
    ("auth", "auth: signing, verifying, the local proof"),
    ("core/clock *:*_deadline", "clock code, deadlines"),
    ("rendezvous/node:*<lambda> rendezvous/*room:build.<locals>.<lambda>",
     "lambdas over other state: clock offsets, the attempt, the peer endpoint"),
    ("cli/logs cli/output cli/run:*say cli/supervise:*say", "logging, `run`'s output"),
    ("metrics core/jobs:cause", "metrics, the failure's cause label"),
    ("core/liveness", "liveness watch"),
    ("core/progress rendezvous/*progresswatch cli/progress*", "progress tracking"),
    ("net/resolve core/names", "address lookup"),
    ("core/fanout *:*_pushes_down", "topology queries"),
    ("wire/fields:host_name cli/errorfile:ErrorFiles.cause cli/jobview:number"
     " cli/client:_where", "field-level checkers"),
    ("rendezvous/*attempts:Attempts.own rendezvous/*attempts:Attempts.synced"
     " rendezvous/*attempts:Attempts.start rendezvous/*attempts:Attempts.numbered"
     " core/jobs:JobBook.learn_go core/jobs:JobBook.has_failed core/jobs:JobBook.advance"
     " core/jobs:JobBook.counts core/jobs:JobBook.firsts core/jobs:JobBook.table",
     "queries of other state"),
)  # fmt: skip
#: Comprehensions and generator expressions run as frames of their own before Python 3.12:
#: they are part of the function they are written in, not a call of the source.
COMPREHENSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")

#: The processes on the path, in its order, and the one beside it.
PATH = ("node1-run", "node1-sidecar", "node0-sidecar", "node2-sidecar", "node2-run")
BESIDE = ("node0-run",)
NODES = 3
HOSTS = tuple(f"127.0.0.{rank + 1}" for rank in range(NODES))
KEEPALIVE_S = 600.0
TIMEOUT_S = 60.0
Hop = tuple[float, str]
#: The profiler: python -c WRAPPER OUT ARM LABEL -- ARGS... runs `rallypoint ARGS` and
#: writes OUT at exit: the package's calls recorded since the monotonic time in the file ARM.
WRAPPER = r"""
import atexit, dis, importlib.util, inspect, functools, json, os, runpy, sys, threading, time
OUT, ARM, LABEL = sys.argv[1:4]
ROOT = os.path.dirname(importlib.util.find_spec("rallypoint").origin) + os.sep
places, table, threads, rows = {}, [], {}, []
def place(code):
    hit = places.get(code)
    if hit is None:
        path, hit = code.co_filename, (-1, 0)
        if path.startswith(ROOT) and path.endswith(".py"):
            first = next((i.offset for i in dis.get_instructions(code) if i.opname == "RESUME"), 0)
            hit = (len(table), first)
            table.append([path[len(ROOT):-3], code.co_qualname])
        places[code] = hit
    return hit
def hook(frame, event, arg):
    if event != "call":
        return
    index, first = place(frame.f_code)
    if index < 0:
        return
    up = frame.f_back  # the caller in the package, through library frames but not asyncio's
    while up is not None and place(up.f_code)[0] < 0 and "asyncio" not in up.f_code.co_filename:
        up = up.f_back
    parent = place(up.f_code)[0] if up is not None else -1
    ident = threading.get_ident()
    if ident not in threads:
        threads[ident] = threading.current_thread().name
    rows.append((time.monotonic(), threads[ident], index, frame.f_lasti > first, id(frame),
                 parent, id(up) if parent >= 0 else 0))
def kind(module, qualname):
    if "<" in qualname:
        return "function"
    owner = sys.modules.get(("rallypoint." + module.replace("/", ".")).removesuffix(".__init__"))
    *outer, last = qualname.split(".")
    for part in outer:
        owner = getattr(owner, part, None)
    found = inspect.getattr_static(owner, last, None) if owner is not None else None
    return "property" if isinstance(found, (property, functools.cached_property)) else "function"
def dump():
    sys.setprofile(None), threading.setprofile(None)
    arm = float(open(ARM).read()) if os.path.exists(ARM) else float("inf")
    kept = [row for row in rows if row[0] >= arm]
    for row in table:
        row.append(kind(*row))
    with open(OUT, "w") as fh:
        json.dump({"label": LABEL, "table": table, "rows": kept}, fh)
atexit.register(dump)
sys.argv = ["rallypoint", *sys.argv[5:]]
threading.setprofile(hook)
sys.setprofile(hook)
runpy.run_module("rallypoint", run_name="__main__", alter_sys=True)
"""
#: The job's child: python -c CHILD ROLE BOX. It stamps files in BOX with time.monotonic():
#: ROLE.started at once, ROLE.term on SIGTERM (then exits), and node1 exits 3 when BOX/fail
#: appears, stamping node1.failed first. It ends by itself after TIMEOUT_S.
CHILD = f"""
import os, signal, sys, time
role, box = sys.argv[1:3]
def stamp(name):  # written whole, then renamed: a reader never sees half of it
    with open(os.path.join(box, name + ".tmp"), "w") as fh:
        fh.write(repr(time.monotonic()))
    os.replace(fh.name, os.path.join(box, name))
def term(*_):
    stamp(role + ".term")
    os._exit(143)
signal.signal(signal.SIGTERM, term)
stamp(role + ".started")
end = time.monotonic() + {TIMEOUT_S}
while time.monotonic() < end:
    if role == "node1" and os.path.exists(os.path.join(box, "fail")):
        stamp("node1.failed")
        sys.exit(3)
    time.sleep(0.01)
"""


# --- the scenario -----------------------------------------------------------------------------


def traced(box: Path, label: str, args: list[str]) -> list[str]:
    """argv of `rallypoint ARGS` under the profiler, its calls to BOX/LABEL.json."""
    out, arm = str(box / f"{label}.json"), str(box / "arm")
    return [sys.executable, "-c", WRAPPER, out, arm, label, "--", *args]


def stamp_of(box: Path, name: str, timeout_s: float = TIMEOUT_S) -> float:
    """The time.monotonic() a child wrote to BOX/name, once it is there."""
    deadline = time.monotonic() + timeout_s
    while not (box / name).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {name} after {timeout_s:g} s")
        time.sleep(0.02)
    return float((box / name).read_text())


def all_running(port: int) -> bool:
    """Whether node 0's job view has every node's job running."""
    try:
        status, body = common.get(port, "/job")
    except OSError:
        return False
    counts = json.loads(body).get("counts", {}) if status == 200 else {}
    return bool(counts.get("running") == NODES)


def start_sidecars(box: Path, env: dict[str, str], procs: dict[str, Any]) -> list[int]:
    """The three sidecars, ready; their local API ports."""
    peer_port = common.free_port()
    local_ports = [common.free_port() for _ in range(NODES)]
    for rank in range(NODES):
        argv = [
            "serve", "--provider", "explicit", "--no-mdns", "--allow-loopback", "--no-probe",
            "--relay-group", "0", "--keepalive", str(KEEPALIVE_S), "--deadline", str(TIMEOUT_S),
            "--local-host", "127.0.0.1", "--local-port", str(local_ports[rank]),
            "--peer-host", HOSTS[rank], "--peer-port", str(peer_port),
        ]  # fmt: skip
        node_env = {**env, "RALLYPOINT_HOSTS": ",".join(HOSTS), "RALLYPOINT_NODE_RANK": str(rank)}
        label = f"node{rank}-sidecar"
        procs[label] = common.spawn(traced(box, label, argv), env=node_env, log=box / label)
    for port in local_ports:
        common.wait_status(port, "/readyz", timeout_s=TIMEOUT_S, interval_s=0.1)
    return local_ports


def scenario(src: Path, box: Path, quiet_s: float) -> tuple[float, float]:
    """Run the scenario with src's code; (failure, stop) times. Every process is stopped."""
    env = common.quiet_environ({"RALLYPOINT_TOKEN": secrets.token_urlsafe(24)})
    if src.resolve() != (common.REPO / "src").resolve():
        env["PYTHONPATH"] = str(src)
    procs: dict[str, Any] = {}
    try:
        ports = start_sidecars(box, env, procs)
        for rank, port in enumerate(ports):
            job = [sys.executable, "-c", CHILD, f"node{rank}", str(box)]
            argv = ["run", "--timeout", str(TIMEOUT_S), "--grace", "5",
                    "--url", f"http://127.0.0.1:{port}", "--", *job]  # fmt: skip
            label = f"node{rank}-run"
            procs[label] = common.spawn(traced(box, label, argv), env=env, log=box / label)
        for rank in range(NODES):
            stamp_of(box, f"node{rank}.started")
        deadline = time.monotonic() + TIMEOUT_S
        while not all_running(ports[0]):
            if time.monotonic() > deadline:
                raise TimeoutError("the job did not run on every node")
            time.sleep(0.1)
        (box / "arm").write_text(repr(time.monotonic()))
        time.sleep(quiet_s)  # the quiet window before the failure: the noise check
        (box / "fail").touch()
        failed, stopped = stamp_of(box, "node1.failed"), stamp_of(box, "node2.term")
        for label in ("node0-run", "node1-run", "node2-run"):
            procs[label].wait(TIMEOUT_S)
    finally:
        for proc in procs.values():
            common.stop(proc, grace_s=20.0)
    return failed, stopped


# --- the counts -------------------------------------------------------------------------------


def left_out(module: str, qualname: str, kind: str) -> str | None:
    """Why a call is not a hop (its EXCLUSIONS reason, or a property read), else None."""
    if kind == "property":
        return "property read"
    if qualname.endswith(COMPREHENSIONS):
        return "comprehension (part of its function)"
    for patterns, why in EXCLUSIONS:
        for pattern in patterns.split():
            modules, _, names = pattern.partition(":")
            if fnmatch.fnmatchcase(module, modules) and fnmatch.fnmatchcase(qualname, names or "*"):
                return why
    return None


def hops(trace: dict[str, Any], start: float, end: float) -> tuple[list[Hop], Counter[str]]:
    """The hops (time, "module : function") of one process in (start, end], and what was left
    out. Frame ids tell a first entry from a resumption, and say who called whom."""
    table = trace["table"]
    rows = sorted(row for row in trace["rows"] if start < row[0] <= end)
    seen: set[int] = set()
    hidden: set[int] = set()  # frames of left-out work: what they call is left out too
    listed: list[Hop] = []
    skipped: Counter[str] = Counter()
    for at, _thread, index, resumed, frame, parent, up in rows:
        if resumed and frame in seen:
            continue
        if not resumed:
            hidden.discard(frame)  # a new frame where a finished one was
        entries = [(index, frame, True)]
        if parent >= 0 and up not in seen:
            entries.insert(0, (parent, up, False))  # a caller that was waiting, now at work
        for place, ident, called in entries:
            module, qualname, kind = table[place]
            why = left_out(module, qualname, kind)
            if why is None and called and up in hidden:
                why = "called by left-out work"
            seen.add(ident)
            if why is not None:
                hidden.add(ident)
                skipped[why] += 1
            else:
                listed.append((at, f"{module} : {qualname}"))
    return listed, skipped


def counts(listed: list[str]) -> dict[str, Any]:
    """Distinct modules, returns (a module entered again after another since) and hops."""
    visited: list[str] = []
    previous, returns, order = None, 0, []
    for hop in listed:
        module = hop.split(" : ")[0]
        if module != previous:
            returns += module in visited
            order.append(module)
        if module not in visited:
            visited.append(module)
        previous = module
    return {"modules": len(visited), "returns": returns, "hops": len(listed),
            "order": order, "hop_list": listed}  # fmt: skip


def path_total(processes: dict[str, Any]) -> dict[str, Any]:
    """The path's counts: distinct modules over its processes, returns and hops summed."""
    modules = sorted({hop.split(" : ")[0] for p in PATH for hop in processes[p]["hop_list"]})
    returns, total = (sum(processes[p][key] for p in PATH) for key in ("returns", "hops"))
    return {"modules": len(modules), "returns": returns, "hops": total, "distinct": modules}


def measure(traces: dict[str, dict[str, Any]], failed: float, stopped: float) -> dict[str, Any]:
    """Both cuts (the window; each process until the next takes over), left out, noise."""
    span = stopped - failed
    timed, skipped, noise = {}, Counter[str](), {}
    for label in PATH + BESIDE:
        timed[label], why = hops(traces[label], failed, stopped)
        skipped.update(why)
        quiet, _ = hops(traces[label], failed - span, failed)
        if quiet:
            noise[label] = [hop for _, hop in quiet]
    firsts = [timed[p][0][0] if timed[p] else stopped for p in PATH]
    ends = dict(zip(PATH + BESIDE, [*firsts[1:], *[stopped] * (1 + len(BESIDE))], strict=True))
    cuts = {}
    for cut in ("window", "handover"):
        processes = {
            label: counts([hop for at, hop in listed if cut == "window" or at < ends[label]])
            for label, listed in timed.items()
        }
        cuts[cut] = {"processes": processes, "path": path_total(processes)}
    for row in cuts["handover"]["processes"].values():
        del row["hop_list"]  # the start of the window's list
    return {"window_ms": round(span * 1000, 1), **cuts,
            "left_out": dict(skipped.most_common()), "noise": noise}  # fmt: skip


# --- output -----------------------------------------------------------------------------------

CUTS = {
    "window": "from node 1's child's exit until node 2's child is stopped",
    "handover": "each process until the next one on the path takes the failure up",
}


def table(results: dict[str, dict[str, Any]], cut: str) -> None:
    """process, modules, returns, hops: the checkouts side by side."""
    sides = list(results)
    print(f"\n{CUTS[cut]}:")
    print(f"{'process':<20}" + "".join(f" | {results[s]['checkout'][:25]:>25}" for s in sides))
    print(f"{'':<20}" + " | modules returns    hops" * len(sides))
    for label in (*PATH, "path", *BESIDE):
        cells = ""
        for side in sides:
            rows = results[side][cut]
            row = rows["path"] if label == "path" else rows["processes"][label]
            cells += f" | {row['modules']:7d} {row['returns']:7d} {row['hops']:7d}"
        name = "whole path" if label == "path" else label
        print(f"{name + (' (beside)' if label in BESIDE else ''):<20}{cells}")


def show(results: dict[str, dict[str, Any]]) -> None:
    """Both tables, then per checkout the modules in the order entered, the left out, noise."""
    for cut in CUTS:
        table(results, cut)
    for side, result in results.items():
        print(f"\n{side} ({result['checkout']}), window {result['window_ms']} ms:")
        for label in (*PATH, *BESIDE):
            print(f"  {label}: {' > '.join(result['window']['processes'][label]['order'])}")
        for cut in CUTS:
            path = result[cut]["path"]
            print(f"  path modules, {cut} ({path['modules']}): {', '.join(path['distinct'])}")
        print("  left out: " + ", ".join(f"{why} {n}" for why, n in result["left_out"].items()))
        if not result["noise"]:
            print(f"  noise: no hop in the {result['window_ms']} ms before the failure")
        for label, listed in result["noise"].items():
            print(f"  NOISE in the window before the failure, {label}: {', '.join(listed)}")


def main() -> None:
    p = common.parser(__doc__)
    p.add_argument("--against", type=Path, help="another checkout, run after this one")
    args = p.parse_args()
    results: dict[str, dict[str, Any]] = {}
    for side, src in common.checkouts(args.against).items():
        with common.workdir(f"report-path-{side}-") as box:
            failed, stopped = scenario(src, box, 0.5 if args.quick else 2.0)
            traces = {label: json.loads((box / f"{label}.json").read_text())
                      for label in PATH + BESIDE}  # fmt: skip
            results[side] = {"checkout": common.checkout_name(src.parent),
                             **measure(traces, failed, stopped)}  # fmt: skip
    show(results)
    options = "--against CHECKOUT" if args.against else ""
    common.write_run_summary(
        "report_path", args, options, {"exclusions": dict(EXCLUSIONS), **results}
    )


if __name__ == "__main__":
    main()
