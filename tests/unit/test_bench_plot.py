"""A benchmark that draws a figure says at once when it cannot, not after its run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.commands import python

BENCH = Path(__file__).resolve().parents[2] / "bench"
PLOTTING = sorted(path for path in BENCH.glob("*.py") if "common.pyplot()" in path.read_text())

# The benchmark as `python -m bench.NAME --quick` runs it from the repository root, on an
# interpreter without matplotlib.
WITHOUT_MATPLOTLIB = """
import runpy, sys
sys.modules["matplotlib"] = None
module = sys.argv[1]
sys.argv = [module, "--quick"]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def test_the_scan_finds_the_plotting_benchmarks() -> None:
    assert {"herd.py", "scale.py", "time_to_ready.py"} <= {path.name for path in PLOTTING}


@pytest.mark.parametrize("script", PLOTTING, ids=lambda path: path.name)
def test_a_missing_matplotlib_stops_the_benchmark_before_it_runs(script: Path) -> None:
    done = python("-c", WITHOUT_MATPLOTLIB, f"bench.{script.stem}", cwd=BENCH.parent)
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "matplotlib is not installed" in last
    assert "--no-plot" in last
