"""mDNS: announce this node, browse for peers, the TXT codec and the sidecar's discovery loop.

Import the submodule you need: txt and ranks are pure, announce and browse use zeroconf.
"""
