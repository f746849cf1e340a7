"""Clusters of sidecars for tests and benchmarks: in one event loop (inprocess.py), or as
real `rallypoint serve` processes in Linux network namespaces on a bridge (the rest)."""
