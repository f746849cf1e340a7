"""The hostfile MPI-style launchers read: one ``host slots=N`` line per node, in rank order.

DeepSpeed's runner (``deepspeed.launcher.runner._parse_hostfile``: ``^(\\S+)\\s+slots=(\\d+)``,
each host once), Open MPI's ``--hostfile`` and MPICH/Hydra's ``-f`` (``host:N`` there, so
MPICH users convert) all read it. Rank order matters: DeepSpeed's ``--no_ssh --node_rank R``
and Open MPI's by-slot mapping number the processes in the order the lines appear, so the
first line is the master (node rank 0), as it is for torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from rallypoint.errors import HostfileError

_INT = re.compile(r"[0-9]{1,9}")


def slots(values: Mapping[str, str], nproc_per_node: int) -> int:
    """Processes per node: the served PET_NPROC_PER_NODE, else ``nproc_per_node``.

    A PET_NPROC_PER_NODE word (``gpu``, ``auto`` ...) is resolved by torchrun on each node
    and gives no number to write: HostfileError.
    """
    served = values.get("PET_NPROC_PER_NODE")
    if served is None:
        return nproc_per_node
    if _INT.fullmatch(served) and int(served) >= 1:
        return int(served)
    raise HostfileError(
        f"PET_NPROC_PER_NODE={served!r} is not a number of processes, so no hostfile can say "
        "how many slots each node has; set --nproc-per-node N (or PET_NPROC_PER_NODE=N)"
    )


def render(hosts: Sequence[str], slot_count: int) -> str:
    """``host slots=N`` lines for ``hosts`` in node-rank order (the master first)."""
    if slot_count < 1:
        raise HostfileError(f"slots {slot_count} must be at least 1")
    if not hosts:
        raise HostfileError("the cluster has no hosts yet; nothing to write")
    lines = []
    for host in hosts:
        if not host or any(char.isspace() or char == "#" for char in host):
            raise HostfileError(f"host {host!r} cannot be written to a hostfile")
        lines.append(f"{host} slots={slot_count}\n")
    return "".join(lines)
