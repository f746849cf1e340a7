"""mDNS: the announcement codec, browsing, announcing and the sidecar's discovery loop."""

# Deliberately empty: importing the package must not import zeroconf, so that txt and
# ranks stay pure. Import the submodule you need (rallypoint.mdns.announce.Mdns, ...).
