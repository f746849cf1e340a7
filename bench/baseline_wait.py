"""The two entrypoint waits rallypoint is compared with, run inside a node's namespace.

kubeflow:  ``until nslookup MASTER; do sleep 2; done`` (the PyTorchJob init container),
           with getaddrinfo instead of nslookup.
sagemaker: resolve every host in turn, retrying each with exponential backoff from 100 ms,
           capped at 30 s (the SageMaker training toolkit's hostname wait).

Prints "started <t>" and "done <t>" with t = time.monotonic(), a clock every namespace of
the host shares, so the benchmark can compare it with its own timestamps.

    python -m bench.baseline_wait kubeflow MASTER
    python -m bench.baseline_wait sagemaker HOST [HOST ...]
"""

from __future__ import annotations

import socket
import sys
import time


def resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return True


def main() -> None:
    mode, hosts = sys.argv[1], sys.argv[2:]
    print(f"started {time.monotonic()}", flush=True)
    if mode == "kubeflow":
        while not resolves(hosts[0]):
            time.sleep(2.0)
    elif mode == "sagemaker":
        for host in hosts:
            delay = 0.1
            while not resolves(host):
                time.sleep(delay)
                delay = min(delay * 2, 30.0)
    else:
        raise SystemExit(f"unknown mode {mode!r}: use kubeflow or sagemaker")
    print(f"done {time.monotonic()}", flush=True)


if __name__ == "__main__":
    main()
