"""A real torch TCPStore on a given port, in a child process: the proof that a held port works."""

from __future__ import annotations

import importlib.util
import subprocess

from tests.support.commands import python

TCPSTORE_SCRIPT = """
import sys
from datetime import timedelta
import torch.distributed as dist

port = int(sys.argv[1])
use_libuv = sys.argv[2] == "1"
store = dist.TCPStore("127.0.0.1", port, 1, True, timedelta(seconds=20),
                      wait_for_workers=False, use_libuv=use_libuv)
store.set("rallypoint", "ok")
client = dist.TCPStore("127.0.0.1", port, 1, False, timedelta(seconds=20), use_libuv=use_libuv)
print(client.get("rallypoint").decode())
"""


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def run_tcpstore(port: int, use_libuv: bool) -> subprocess.CompletedProcess[str]:
    """Serve a TCPStore on ``port`` and read a key back; it prints ``ok`` when that worked."""
    return python("-c", TCPSTORE_SCRIPT, str(port), "1" if use_libuv else "0", timeout_s=120)
