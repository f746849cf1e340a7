"""Before ready: one cluster document's checks, from the names to the cluster-wide verdict.

``verification`` runs one pipeline per document: ``namecheck`` (the names, then the env),
``connectivity`` with ``prober`` and ``probewindows`` (the job's connections), and
``clustercheck`` (the report to the master and its verdict).
"""
