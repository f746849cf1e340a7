"""rallypoint: a network-aware rendezvous sidecar for distributed training."""

__version__ = "0.1.0"
