"""Profile a ready single-node sidecar serving GET /env under wrk (64 connections) with py-spy.

python bench/profile_env.py      # writes bench/results/profile-env.txt
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import common
from local_api import wrk
from profile_master import top


def main() -> None:
    p = common.parser(__doc__)
    p.add_argument("--seconds", type=int, default=10)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rp-bench-"))
    lp, pp = common.free_port(), common.free_port()
    proc = common.spawn(common.serve_argv(lp, pp), cpus="0", log=tmp / "sidecar.log")
    raw = tmp / "env.collapsed"
    try:
        common.wait_status(lp, "/readyz")
        spy = subprocess.Popen(
            ["py-spy", "record", "--pid", str(proc.pid), "--format", "raw", "--rate", "250",
             "--nonblocking", "--duration", str(args.seconds + 1), "--output", str(raw)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(0.5)
        report = wrk(lp, 64, args.seconds)
        spy.wait(60)
    finally:
        common.stop(proc)
    own, inclusive = top(raw, 30)
    lines = [f"/env under wrk -c64: {report['rps']:.0f} req/s", "", "self time %:"]
    lines += [f"  {v:5.1f}  {k}" for k, v in own]
    lines += ["", "inclusive time %:"] + [f"  {v:5.1f}  {k}" for k, v in inclusive]
    text = "\n".join(lines) + "\n"
    print(text)
    out = common.RESULTS_DIR / "profile-env.txt"
    out.write_text(text)
    print(f"wrote {out.relative_to(common.REPO)}")


if __name__ == "__main__":
    main()
