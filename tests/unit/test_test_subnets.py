"""The namespace tiers' subnets stay out of Docker's default address pools.

A compose network takes the next pool (172.18/16, 172.19/16, ... 172.30/16 by its twelfth),
and Docker then masquerades that subnet's traffic on every other interface, our bridges'
frames included: a multi-host cluster on 172.30.x lost every new connection while the
compose tier ran beside it. The harness refuses such a subnet before it builds anything.
"""

from __future__ import annotations

import pytest

from tests.support.netns import check_subnet


@pytest.mark.parametrize("prefix", ["172.17.0", "172.30.213", "172.31.255", "192.168.16"])
def test_a_subnet_in_docker_s_pools_is_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="Docker's address pool"):
        check_subnet(prefix)


@pytest.mark.parametrize("prefix", ["10.213.0", "10.214.0", "198.18.213", "172.15.0", "172.32.0"])
def test_a_subnet_outside_them_is_taken(prefix: str) -> None:
    check_subnet(prefix)
