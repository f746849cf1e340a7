"""Cluster providers: turn an environment mapping into a ClusterSpec, purely.

Each module exposes ``detects(environ) -> bool`` and ``read(environ) -> ClusterSpec``;
detect() tries them in NAMES order unless a provider is named.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType

from rallypoint.errors import ClusterSpecError
from rallypoint.model import ClusterSpec
from rallypoint.providers import backendai, explicit, kubernetes, mdns, single, slurm
from rallypoint.providers._common import show

#: Provider names in auto-detection order; "single" always matches, so it comes last.
NAMES: tuple[str, ...] = ("explicit", "backendai", "slurm", "kubernetes", "mdns", "single")

_MODULES: dict[str, ModuleType] = {
    module.NAME: module for module in (explicit, backendai, slurm, kubernetes, mdns, single)
}


def detect(environ: Mapping[str, str], provider: str | None = None) -> ClusterSpec:
    """The ClusterSpec of this environment, by the named provider or the first that detects.

    Raises ClusterSpecError for an unknown provider name or for anything the provider
    finds missing, malformed or contradictory.
    """
    if provider is None or provider == "auto":
        for name in NAMES:
            if _detects(name)(environ):
                return _read(name)(environ)
        raise AssertionError("the single provider always detects")  # pragma: no cover
    name = provider.strip().lower()
    if name not in _MODULES:
        raise ClusterSpecError(
            f"unknown provider {show(provider)}; choose one of {', '.join(NAMES)}"
            " (or leave it unset to auto-detect)"
        )
    return _read(name)(environ)


def _detects(name: str) -> Callable[[Mapping[str, str]], bool]:
    detects: Callable[[Mapping[str, str]], bool] = _MODULES[name].detects
    return detects


def _read(name: str) -> Callable[[Mapping[str, str]], ClusterSpec]:
    read: Callable[[Mapping[str, str]], ClusterSpec] = _MODULES[name].read
    return read


__all__ = ["NAMES", "detect"]
