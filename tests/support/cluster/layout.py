"""The fixed layout of a namespace cluster: its subnets, the sidecars' ports, fast timings."""

from __future__ import annotations

#: Each node's IPv4 address is ``SUBNET.(10 + index)``, assigned only inside the namespaces.
SUBNET = "10.213.0"
#: IPv6 clusters (family "ipv6" or "dual"): unique local addresses, one /64 per bridge.
SUBNET6 = "fd00:"
#: Address families a Cluster can be built with.
FAMILIES = ("ipv4", "ipv6", "dual")
LOCAL_PORT = 7780
PEER_PORT = 7781
#: Small timings so that every scenario finishes in seconds; scenarios and the
#: fault campaign add their own flags.
FAST_ARGS = (
    "--deadline", "25",
    "--backoff-initial", "0.05",
    "--backoff-max", "0.5",
    "--long-poll", "5",
    "--resolve-timeout", "2",
)  # fmt: skip
