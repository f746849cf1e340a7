"""A real PyTorch gloo job across the namespaces, started from the env the sidecars served."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from tests.multihost import clients
from tests.support.cluster.build import Cluster, backendai_order
from tests.support.netns import IFNAME

pytestmark = [pytest.mark.multihost, pytest.mark.torch]

READY_S = 30.0
JOB_S = 90.0  # three torch imports on two cores dominate


@pytest.mark.parametrize(
    ("pinned", "args"),
    [
        pytest.param((), (), id="clean-hosts"),
        # Debian's `127.0.1.1 <hostname>` on every node: gloo would publish loopback and
        # fail in connectFullMesh (docs/loopback.md). With --emit-ifname the sidecars serve
        # GLOO_SOCKET_IFNAME, gloo binds that interface, and the job completes.
        pytest.param(
            ("main1", "sub1", "sub2"), ("--emit-ifname",), id="every-own-name-on-127.0.1.1"
        ),
    ],
)
def test_gloo_all_reduce_runs_on_the_served_env(
    cluster: Cluster,
    torch_script: Path,
    pinned: tuple[str, ...],
    args: tuple[str, ...],
) -> None:
    for name in pinned:
        cluster[name].pin(name, "127.0.1.1")
    cluster.start_all(args)
    served = cluster.wait_all_ready(READY_S)
    master_port = int(served["main1"]["MASTER_PORT"])
    # The sidecar holds the port: an unrelated plain bind on the master node fails ...
    assert cluster["main1"].try_bind(master_port) == errno.EADDRINUSE
    for name in pinned:
        warnings = " ".join(cluster[name].status()["warnings"])
        assert name in warnings and "127.0.1.1" in warnings, warnings
        assert served[name]["GLOO_SOCKET_IFNAME"] == IFNAME

    results = clients.run_torch_job(list(cluster), torch_script, timeout_s=JOB_S)

    # ... while the training process, whose TCPStore listens with SO_REUSEADDR, binds it.
    for name, (code, result) in results.items():
        assert code == 0 and result is not None, f"{name}: exit {code}, {result}"
        assert result["ok"] and result["sum"] == result["expected"] == 6.0, result
        assert result["world_size"] == 3
        assert result["rank"] == backendai_order(cluster.hosts).index(name)
        assert result["master_addr"] == "main1"
        assert int(result["master_port"]) == master_port
        assert sorted(result["hosts"]) == sorted(cluster.hosts)
