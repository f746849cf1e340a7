"""The network floor: name lookups, held ports, the connection and data-path probes, peer calls."""
