"""What every part of one node's rendezvous shares: spec, settings, seams and state tables."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from rallypoint.metrics import Metrics
    from rallypoint.model import ClusterSpec
    from rallypoint.net.peerhttp import PeerClient, PeerEndpoint
    from rallypoint.net.resolve import Resolver
    from rallypoint.rendezvous.peers import PeerTable
    from rallypoint.rendezvous.readiness import Readiness
    from rallypoint.settings import Settings


class NodeContext(msgspec.Struct, frozen=True):
    """Built once the spec names every host; the master, worker and verification read it."""

    spec: ClusterSpec
    settings: Settings
    resolver: Resolver
    metrics: Metrics
    readiness: Readiness
    peers: PeerTable
    #: Signed requests to other nodes' peer APIs.
    client: PeerClient
    #: (host name, verified address) -> where that node's peer API answers.
    endpoint: PeerEndpoint
    #: The spec or --allow-loopback says a name on loopback is fine (one host).
    accept_loopback: bool
    clock: Callable[[], float]
    rng: random.Random
