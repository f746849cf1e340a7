"""Slurm batch jobs as the tests submit them (sbatch) and see them (scontrol, their output).

`BatchJobs` is mixed into `SlurmCluster` (cluster.py), which runs the client commands.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.netns import wait_for

#: Terminal job states (squeue/scontrol names).
FINAL_STATES = frozenset(
    {
        "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
        "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Job:
    """A finished (or abandoned) batch job: what scontrol and its output file say."""

    job_id: str
    state: str
    exit_code: str
    nodes: str
    batch_host: str
    output: str
    record: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_record(cls, job_id: str, record: Mapping[str, str], output: str) -> Job:
        return cls(
            job_id=job_id,
            state=record.get("JobState", "UNKNOWN"),
            exit_code=record.get("ExitCode", "?"),
            nodes=record.get("NodeList", "?"),
            batch_host=record.get("BatchHost", "?"),
            output=output,
            record=record,
        )

    def lines(self, prefix: str) -> list[str]:
        """The output lines that start with prefix."""
        return [line for line in self.output.splitlines() if line.startswith(prefix)]

    def describe(self) -> str:
        return (
            f"job {self.job_id}: {self.state} exit {self.exit_code} on {self.nodes}\n"
            f"--- output ---\n{self.output}"
        )


def parse_record(oneliner: str) -> dict[str, str]:
    """``scontrol --oneliner show job``'s KEY=VALUE words as a dict (the first of a key)."""
    record: dict[str, str] = {}
    for item in oneliner.split():
        key, sep, value = item.partition("=")
        if sep and key not in record:
            record[key] = value
    return record


def read_output(path: Path) -> str:
    """A job's output file; slurmstepd may still be flushing it when the state turns final."""
    text = ""
    for _ in range(10):
        text = path.read_text(errors="replace") if path.exists() else ""
        if text:
            break
        time.sleep(0.2)
    return text


class BatchJobs(ABC):
    """Submitting batch jobs from the login node, each from a fresh directory, and waiting."""

    workdir: Path
    #: Jobs submitted so far: the prefix of the next job's directory.
    _jobs: int

    @abstractmethod
    def client(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        check: bool = True,
        timeout_s: float = 30.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command on the controller (the login node)."""

    def job_dir(self, label: str) -> Path:
        """A fresh directory for one job: its script, its files, its output."""
        self._jobs += 1
        path = self.workdir / "jobs" / f"{self._jobs:02d}-{label}"
        path.mkdir(parents=True)
        return path

    def submit(
        self,
        script: str,
        workdir: Path,
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> str:
        """sbatch the script text from workdir; return the job id."""
        path = workdir / "job.sh"
        path.write_text(script)
        # The job inherits sbatch's environment: torchrun's log directories go to the job's.
        (workdir / "tmp").mkdir(exist_ok=True)
        env = {"TMPDIR": str(workdir / "tmp"), **(env or {})}
        argv = [
            "sbatch", "--parsable", f"--chdir={workdir}",
            f"--output={workdir / 'slurm-%j.out'}", *args, str(path),
        ]  # fmt: skip
        done = self.client(argv, env=env, cwd=workdir)
        return done.stdout.strip().split(";")[0]

    def job_record(self, job_id: str) -> dict[str, str]:
        """scontrol's record of a job as a dict ({} when unknown)."""
        done = self.client(["scontrol", "--oneliner", "show", "job", job_id], check=False)
        return parse_record(done.stdout)

    def cancel(self, job_id: str, timeout_s: float = 60) -> None:
        """scancel the job (requeued and pending, or whatever it is) and wait for its end."""
        self.client(["scancel", job_id], check=False)
        wait_for(
            lambda: self.job_record(job_id).get("JobState") in FINAL_STATES,
            timeout_s=timeout_s,
            interval_s=0.2,
            what=f"job {job_id} cancelled",
        )

    def wait_job(self, job_id: str, workdir: Path, timeout_s: float) -> Job:
        """Wait until the job ends; scancel it (and report what it printed) after timeout_s."""
        deadline = time.monotonic() + timeout_s
        record: dict[str, str] = {}
        while time.monotonic() < deadline:
            record = self.job_record(job_id)
            if record.get("JobState") in FINAL_STATES:
                break
            time.sleep(0.5)
        else:
            self.cancel(job_id, timeout_s=30)
            record = self.job_record(job_id)
            record["JobState"] = f"{record.get('JobState')} (cancelled after {timeout_s:g} s)"
        return Job.from_record(job_id, record, read_output(workdir / f"slurm-{job_id}.out"))

    def run_job(
        self,
        script: str,
        label: str,
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        files: Mapping[str, str | Path] | None = None,
        timeout_s: float = 150.0,
    ) -> Job:
        """Submit script from a fresh job directory (with files copied in) and wait for it."""
        workdir = self.job_dir(label)
        for name, content in (files or {}).items():
            if isinstance(content, Path):
                shutil.copy(content, workdir / name)
            else:
                (workdir / name).write_text(content)
        job_id = self.submit(script, workdir, args=args, env=env)
        return self.wait_job(job_id, workdir, timeout_s)
