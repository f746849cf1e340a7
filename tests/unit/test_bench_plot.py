"""A benchmark that draws a figure says at once when it cannot, not after its run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
PLOTTING = sorted(path for path in BENCH.glob("*.py") if "common.pyplot()" in path.read_text())

# The script as `python bench/NAME.py --quick` runs it, on an interpreter without matplotlib.
WITHOUT_MATPLOTLIB = """
import runpy, sys
sys.modules["matplotlib"] = None
sys.path.insert(0, sys.argv[1])
sys.argv = [sys.argv[2], "--quick"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_the_scan_finds_the_plotting_benchmarks() -> None:
    assert {"herd.py", "scale.py", "time_to_ready.py"} <= {path.name for path in PLOTTING}


@pytest.mark.parametrize("script", PLOTTING, ids=lambda path: path.name)
def test_a_missing_matplotlib_stops_the_benchmark_before_it_runs(script: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_MATPLOTLIB, str(BENCH), str(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "matplotlib is not installed" in last
    assert "--no-plot" in last
