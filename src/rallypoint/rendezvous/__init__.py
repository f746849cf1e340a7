"""One node's rendezvous: the state machine from a cluster spec to ready, and after.

``node.Rendezvous`` composes it from three rooms: ``checks/`` (before ready: one cluster
document's names, env, connections and verdict), ``cluster/`` (the nodes made one cluster:
the master and its book, the worker's join, the relays) and ``afterready/`` (who is gone,
the supervised job, its progress). Beside them sit what every room shares: ``context``,
``peers`` (what is known of each peer), ``readiness`` (ready or not), ``tasks`` and
``waits``; and what the node serves from every room: ``peerapi`` and ``status``. A room
imports only the rooms below it (docs/architecture.md). Nothing here is re-exported: import
each name from the module that defines it.
"""
