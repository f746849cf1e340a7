"""A single-node `rallypoint serve` started as a child process, and the ports it was given."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass


@dataclass
class Served:
    proc: subprocess.Popen[str]
    local_port: int
    peer_port: int
    master_port: int
    tf_port: int
