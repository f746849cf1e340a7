"""The benchmarks, run as modules from the repository root: ``python -m bench.NAME``."""
