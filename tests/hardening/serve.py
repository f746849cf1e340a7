"""`rallypoint serve` as a real child process on free loopback ports, for the shutdown tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.hardening.harness import request
from tests.support.ports import free_port

EXIT_BOUND_S = 5.0
START_BOUND_S = 20.0


@dataclass
class Serve:
    """`rallypoint serve` as the only node of a 2-node session whose peer never comes."""

    tmp: Path
    mdns: bool = False
    name: str = field(default_factory=lambda: f"rp{uuid.uuid4().hex[:8]}")
    local_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    master_port: int = field(default_factory=free_port)
    tf_port: int = field(default_factory=free_port)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}
        env.update(
            RALLYPOINT_HOSTS=f"{self.name},{self.name}-ghost",
            RALLYPOINT_NODE_RANK="0",
            RALLYPOINT_SESSION=self.name,
            RALLYPOINT_LOCAL_HOSTS="127.0.0.1",
            RALLYPOINT_LOCAL_PORT=str(self.local_port),
            RALLYPOINT_PEER_HOST="127.0.0.1",
            RALLYPOINT_PEER_PORT=str(self.peer_port),
            MASTER_PORT=str(self.master_port),
            RALLYPOINT_TF_PORT=str(self.tf_port),
            RALLYPOINT_MDNS="1" if self.mdns else "0",
            RALLYPOINT_MDNS_INTERFACES="127.0.0.1",
            RALLYPOINT_RESOLVE_TIMEOUT="1",
            RALLYPOINT_BACKOFF_MAX="0.5",
        )
        return env

    def start(self) -> subprocess.Popen[bytes]:
        exe = shutil.which("rallypoint")
        cmd = [exe, "serve"] if exe else [sys.executable, "-m", "rallypoint", "serve"]
        log = (self.tmp / f"serve-{len(self.procs)}.log").open("wb")
        proc = subprocess.Popen(cmd, env=self.environ(), stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        deadline = time.monotonic() + START_BOUND_S
        while True:
            assert proc.poll() is None, f"serve exited {proc.returncode}: {self.log(-1)}"
            try:
                if request(self.local_port, "GET", "/livez", timeout_s=1.0).status == 200:
                    return proc
            except OSError:
                pass
            assert time.monotonic() < deadline, f"serve did not listen: {self.log(-1)}"
            time.sleep(0.1)

    def log(self, index: int) -> str:
        return (self.tmp / f"serve-{index % len(self.procs)}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
