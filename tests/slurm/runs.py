"""The runs of Slurm clusters: this process's tag, atexit, and the stale-resource sweeper.

Resource names carry the run's tag (`run_tag`), and ``OWNERS_DIR/TAG`` the pid that owns
it; ``OWNERS_DIR/TAG.munged`` names the run's munged, the one daemon outside the
namespaces, so the sweeper kills a dead run's.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from pathlib import Path

from tests.support import netns

#: Which tag belongs to which live run (and its munged), so the sweeper spares live runs.
OWNERS_DIR = Path("/run/rallypoint-slurm")
DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "scontrol", "sinfo")
_TAG_RE = re.compile(r"^(rps\d{1,3})(?:-|br$|[vp]\d)")


def run_tag() -> str:
    """This process's resource prefix: ``rps`` and the pid modulo 1000."""
    return f"rps{os.getpid() % 1000}"


def prerequisites() -> str | None:
    """Why a Slurm cluster cannot run here, or None when it can."""
    return netns.prerequisites(
        f"{run_tag()}-probe", DAEMONS, root_for="Slurm daemons in network namespaces"
    )


RUNS = netns.Runs(OWNERS_DIR, run_tag)
close_all = RUNS.close_all


def _is_munged(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "munged"
    except OSError:
        return False


def sweep_stale() -> list[str]:
    """Delete what dead runs left (daemons, namespaces, links, rules, files); list it."""
    removed = RUNS.sweep(_TAG_RE)
    if OWNERS_DIR.is_dir():
        for entry in sorted(OWNERS_DIR.iterdir()):
            tag = entry.name.removesuffix(".munged")
            if not RUNS.stale(tag):
                continue
            if entry.name.endswith(".munged"):
                with contextlib.suppress(ValueError, OSError):
                    pid = int(entry.read_text().strip())
                    if _is_munged(pid):
                        os.kill(pid, signal.SIGKILL)
                        removed.append(f"munged {pid}")
            entry.unlink(missing_ok=True)
    return removed
