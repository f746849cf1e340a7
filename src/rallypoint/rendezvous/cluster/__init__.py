"""The nodes made one cluster: the master (``master``, its book ``masterbook`` and the book's
``verdict``), the worker's join (``worker``), and the fan-out tree's relays (``relay``, and
``upstream``, their batches to the master)."""
