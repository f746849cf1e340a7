"""Profile the master sidecar under N simulated workers with py-spy; print the hot spots.

python -m bench.profile_master --workers 2048     # writes bench/results/profile-master-N.txt
python -m bench.profile_master --workers 2000 --joins-only   # the herd: profile-joins-N.txt
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from bench import common, simcluster


def top(
    collapsed: Path, limit: int = 25
) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """Self-time and inclusive-time shares per function from py-spy's collapsed stacks."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1] + ")"
            if " (" in f
            else f
            for f in stack.split(";")
        ]
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    share = lambda c: [(k, round(100 * v / total, 1)) for k, v in c.most_common(limit)]  # noqa: E731
    return share(own), share(inclusive)


def main() -> None:
    p = common.parser(__doc__)
    p.add_argument("--workers", type=int, default=2048)
    p.add_argument("--joins-only", action="store_true", help="the herd: joins, no long-polls")
    args = p.parse_args()
    common.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    raw = Path("/tmp") / f"rp-profile-{args.workers}.txt"
    r = simcluster.simulate(args.workers, poll=not args.joins_only, profile=raw)
    own, inclusive = top(raw)
    lines = (
        [
            f"master under {args.workers} simulated workers: CPU {r.master_cpu_s:.2f} s, "
            f"VmHWM {r.master_hwm_mb:.0f} MB, documents {r.sim['doc_ok']}/{args.workers}",
            "",
            "self time %:",
        ]
        + [f"  {v:5.1f}  {k}" for k, v in own]
        + ["", "inclusive time %:"]
        + [f"  {v:5.1f}  {k}" for k, v in inclusive]
    )
    text = "\n".join(lines) + "\n"
    print(text)
    kind = "joins" if args.joins_only else "master"
    out = common.RESULTS_DIR / f"profile-{kind}-{args.workers}.txt"
    out.write_text(text)
    print(f"wrote {out.relative_to(common.REPO)}")


if __name__ == "__main__":
    main()
