"""After ready: who is gone (``keepalive``), the supervised job on every node (``jobwatch``,
with ``attempts``, which attempt may start), and its progress (``progresswatch``)."""
