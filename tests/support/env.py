"""A clean environment: none of the test process's cluster variables reach the code under test."""

from __future__ import annotations

import os
from collections.abc import Mapping

#: Variables of the test process that would change what a provider detects.
_CLUSTER_PREFIXES = ("RALLYPOINT_", "BACKENDAI_", "SLURM_", "PET_", "KUBERNETES_")
_CLUSTER_KEYS = {
    "MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "WORLD_SIZE", "RANK", "WORLD_RANK",
    "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TF_CONFIG", "JOB_COMPLETION_INDEX",
    "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
}  # fmt: skip


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """A CliRunner env that unsets every cluster variable, then sets `extra`."""
    env: dict[str, str | None] = {
        key: None for key in os.environ if key.startswith(_CLUSTER_PREFIXES) or key in _CLUSTER_KEYS
    }
    env["HOSTNAME"] = "trainer"
    env.update(extra or {})
    return env


def child_env() -> dict[str, str]:
    """os.environ without cluster variables, for child processes."""
    unset = clean_env()
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update({k: v for k, v in unset.items() if v is not None})
    return env
