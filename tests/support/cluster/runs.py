"""The runs of namespace clusters: this process's tag, atexit, and the stale-resource sweeper.

Resource names carry the run's tag (`run_tag`), and ``OWNERS_DIR/TAG`` the pid that owns
it, so the sweeper deletes what dead runs left and leaves concurrent runs alone.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.support import netns
from tests.support.cluster.procs import faketime_files

#: Who owns which tag: one file per live run, so the sweeper leaves concurrent runs alone.
OWNERS_DIR = Path("/run/rallypoint-multihost")
#: Suffix of the file beside a run's owner file listing its faketime wrappers' pids.
FAKETIME_PIDS = ".faketime"
_TAG_RE = re.compile(r"^(rp\d{1,3})(?:-|c\d)")


def run_tag() -> str:
    """The resource prefix of this process: ``rp`` and the pid modulo 1000."""
    return f"rp{os.getpid() % 1000}"


def prerequisites() -> str | None:
    """Why namespace clusters cannot run here, or None when they can."""
    return netns.prerequisites(f"{run_tag()}-probe")


RUNS = netns.Runs(OWNERS_DIR, run_tag)
close_all = RUNS.close_all


def sweep_stale() -> list[str]:
    """Delete leftovers of dead runs (processes, namespaces, links, files, rules); list them."""
    removed = RUNS.sweep(_TAG_RE)
    if OWNERS_DIR.is_dir():
        for entry in OWNERS_DIR.iterdir():
            tag = entry.name.removesuffix(FAKETIME_PIDS)
            if tag == run_tag() or not RUNS.stale(tag):
                continue
            if entry.name != tag:  # a dead run's faketime wrappers: their shared memory
                removed += _remove_faketime_files(entry)
            entry.unlink(missing_ok=True)
    return removed


def _remove_faketime_files(pids_file: Path) -> list[str]:
    """Remove the shared memory of the dead faketime wrappers a pids file lists; list it."""
    removed: list[str] = []
    pids = [int(p) for p in pids_file.read_text().split() if p.isdigit()]
    for path in (f for pid in pids if not netns.pid_alive(pid) for f in faketime_files(pid)):
        if path.exists():
            path.unlink(missing_ok=True)
            removed.append(f"file {path}")
    return removed
