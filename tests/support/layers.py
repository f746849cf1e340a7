"""The package's floors as docs/architecture.md ("Layers") draws them, for the layout tests."""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "rallypoint"

#: The pure floor: every module of these packages imports no I/O library.
PURE_PACKAGES = ("core", "wire", "served", "providers")
#: What every layer shares, at the top of the package (pure).
PURE_SHARED = ("model", "errors", "settings", "reasons", "auth", "localapi")
#: mDNS's record codec and rank rules, pure inside an I/O wing.
PURE_MDNS = ("mdns.txt", "mdns.ranks")
#: The I/O floor below the wings.
IO_PACKAGES = ("net",)
#: The packages that build on the rest; what sits below them imports none of them.
WINGS = ("cli", "server", "mdns", "providers", "rendezvous")
#: The rooms of rendezvous/, each with the rooms it may import: before ready (checks), the
#: cluster made (the master, the worker, the relays), after ready (keep-alives, the job).
RENDEZVOUS_ROOMS: dict[str, tuple[str, ...]] = {
    "checks": ("cluster",),
    "cluster": (),
    "afterready": (),
}
#: The modules at the top of rendezvous/ that every room may use (the composer ``node``,
#: ``peerapi`` and ``status``, which reach into the rooms, are not among them).
RENDEZVOUS_SHARED = ("context", "peers", "readiness", "tasks", "waits")
#: The top level's modules that compose the wings (or are the entry point).
COMPOSERS = ("__main__", "sidecar")
#: At most this many modules sit loose at the top (``__init__`` and ``__main__`` aside).
MAX_TOP_MODULES = 10


def packages() -> set[str]:
    return {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}


def top_modules() -> set[str]:
    return {p.stem for p in SRC.glob("*.py")} - {"__init__", "__main__"}
