"""One node's rendezvous: the state machine from a cluster spec to ready, and after.

``node.Rendezvous`` composes it: the master (``master``, ``masterbook``), the worker
(``worker``), a relay of the fan-out tree (``relay``), the loop over cluster documents
(``verification``, with ``namecheck``, ``connectivity`` and ``clustercheck``), what is
known of each peer (``peers``), ready or not (``readiness``), the keep-alives after ready
(``keepalive``) and ``/status`` (``status``); ``context`` is what they share. Nothing here
is re-exported: import each name from the module that defines it.
"""
