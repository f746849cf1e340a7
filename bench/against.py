"""One benchmark on two checkouts, alternating run by run: this one and --against CHECKOUT.

    git worktree add ../before COMMIT
    python -m bench.against --against ../before --rounds 2 -- scale --sizes 4096 --runs 3

Each round runs the benchmark of both checkouts, each with its own code: this checkout's
with the interpreter's install of it, the other's as ``python -m bench.SCRIPT`` from that
checkout with its src/ first on PYTHONPATH (a checkout whose bench/ is not a package yet
runs ``bench/SCRIPT.py`` by its path). The order is this, against, then against, this on
the next round, so that a drift of the machine's load falls on both alike. Every run's
summary (the file the benchmark reports it wrote) is collected into
bench/results/against-SCRIPT.json (``--out NAME``: NAME.json); this checkout's own results
are left as they were (a run with other flags would overwrite the figures docs/ cite).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench import common

WROTE = re.compile(r"^wrote (\S+\.json)$", re.MULTILINE)


def command(checkout: Path, script: str) -> list[str]:
    """The interpreter running one checkout's benchmark ``script`` (``scale`` or ``scale.py``)."""
    name = Path(script).stem
    if (checkout / "bench" / "__init__.py").exists():
        return [sys.executable, "-m", f"bench.{name}"]
    return [sys.executable, str(checkout / "bench" / f"{name}.py")]


def run_once(checkout: Path, script: str, argv: list[str]) -> dict[str, Any]:
    """Run one checkout's benchmark; the summary it wrote, its own file restored."""
    written = {path.resolve(): path.read_bytes() for path in common.RESULTS_DIR.glob("*.json")}
    own = checkout == common.REPO
    out = subprocess.run(
        [*command(checkout, script), *argv, "--no-plot"],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
        cwd=checkout,
        env=common.quiet_environ(None if own else {"PYTHONPATH": str(checkout / "src")}),
    )
    sys.stdout.write(out.stdout)
    found = WROTE.findall(out.stdout)
    if not found:
        raise SystemExit(f"{script} on {checkout} reported no summary file")
    result = json.loads((checkout / found[-1]).read_text())
    for name in found:  # leave this checkout's figures as they were
        path = (checkout / name).resolve()
        if path.parent != common.RESULTS_DIR.resolve():
            continue  # another checkout's results
        if path not in written:
            path.unlink()
        elif path.read_bytes() != written[path]:
            path.write_bytes(written[path])
    return result


def main() -> None:
    p = common.ab_parser(__doc__, rounds=2)
    p.add_argument("--out", help="the summary's name (default: against-SCRIPT)")
    p.add_argument("script", help="the benchmark, e.g. scale")
    p.add_argument("args", nargs="*", help="its flags (after --)")
    args = p.parse_args()
    if args.against is None:
        raise SystemExit("--against CHECKOUT is required: the checkout to measure beside this one")
    sides = {"this": common.REPO, "against": args.against.resolve()}
    names = {side: common.checkout_name(path) for side, path in sides.items()}
    runs: list[dict[str, Any]] = []
    for round_no in range(args.rounds):
        order = ["this", "against"] if round_no % 2 == 0 else ["against", "this"]
        for side in order:
            print(f"round {round_no + 1}/{args.rounds}: {side} ({names[side]})", flush=True)
            result = run_once(sides[side], args.script, list(args.args))
            result.pop("machine", None)
            runs.append({"round": round_no + 1, "side": side, "result": result})
    name = args.out or f"against-{Path(args.script).stem}"
    out = f" --out {args.out}" if args.out else ""
    common.write_summary(
        name,
        {
            "command": f"python -m bench.against --against CHECKOUT --rounds {args.rounds}{out} -- "
            + " ".join([args.script, *args.args]),
            "checkouts": names,
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
