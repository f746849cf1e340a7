"""The container's termination message: where Kubernetes reads why a container ended.

`rallypoint run` writes its first-failure line there when the job failed, so that
`kubectl describe pod` and a Job's pod status show the node, the rank and the cause. The
kubelet creates /dev/termination-log in every container (``terminationMessagePath``) and
shows at most 4096 bytes of it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

#: The kubelet's default terminationMessagePath.
DEFAULT = "/dev/termination-log"
#: The most the kubelet shows of it.
MAX_BYTES = 4096


def write(path: str | None, line: str, say: Callable[[str], None]) -> bool:
    """Write ``line`` to ``path`` (None: DEFAULT when it exists); whether it was written. A
    path that cannot be written is said once and changes nothing else."""
    target = path if path is not None else (DEFAULT if os.path.exists(DEFAULT) else None)
    if target is None:
        return False
    data = (line.removeprefix("rallypoint: ") + "\n").encode()[:MAX_BYTES]
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError as exc:
        say(f"rallypoint: warning: cannot write the termination message to {target}: {exc}")
        return False
    return True
