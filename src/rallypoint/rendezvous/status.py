"""The /status document: readiness, spec, peers, ports, checks and timings of one node."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import msgspec

from rallypoint import wire
from rallypoint.core import mesh, names
from rallypoint.model import ClusterSpec, OverrideSource
from rallypoint.net.ports import HeldPort
from rallypoint.rendezvous.checks.verification import Verification
from rallypoint.rendezvous.cluster.masterbook import MasterBook
from rallypoint.rendezvous.peers import PeerState, PeerTable
from rallypoint.rendezvous.readiness import Readiness
from rallypoint.settings import Settings


def round_s(value: float | None) -> float | None:
    """Seconds rounded to milliseconds for /status, None kept."""
    return None if value is None else round(value, 3)


def document(
    *,
    spec: ClusterSpec,
    settings: Settings,
    readiness: Readiness,
    peers: PeerTable,
    user: Mapping[str, tuple[str, OverrideSource]],
    held: Mapping[str, HeldPort],
    auth_enabled: bool,
    verification: Verification | None,
    book: MasterBook | None,
    sections: Mapping[str, Callable[[], object]],
) -> dict[str, object]:
    """The whole picture for /status."""
    doc = None if verification is None else verification.doc
    net = wire.NetFacts() if verification is None else verification.net
    out: dict[str, object] = {
        "ready": readiness.ready,
        "reasons": [r.as_json() for r in readiness.reasons()],
        "generation": None if doc is None else doc.generation,
        "role": _role(spec),
        "spec": _spec(spec),
        "peers": [peer_json(p) for p in peers.values()],
        "overrides": _overrides(readiness),
        "user_values": sorted(user),
        "warnings": readiness.warnings(),
        "env_waiters": readiness.env_waiters,
        "master_problem": None
        if readiness.master_problem is None
        else readiness.master_problem.as_json(),
        "ports": _ports(held),
        "auth": {"enabled": auth_enabled},
        "network": {"route_ifname": net.ifname, "mtu": net.mtu, "rdma_devices": net.rdma},
        "checks": _checks(settings, verification),
        "timings": _timings(settings, readiness),
    }
    if book is not None:
        out["cluster"] = _cluster(book)
        out["links"] = book.verdict.link_view()
        out["link_warnings"] = [r.as_json() for r in book.verdict.link_warnings]
    for name, section in sections.items():
        try:
            # A typed section (the job view, wire/local.py) as the JSON it is written as.
            out[name] = msgspec.to_builtins(section())
        except Exception as exc:
            out[name] = {"error": str(exc)}
    return out


def _spec(spec: ClusterSpec) -> dict[str, object]:
    """The cluster spec this node works from (no master while discovering)."""
    return {
        "provider": spec.provider,
        "session": spec.session,
        "hosts": list(spec.hosts),
        "rank": spec.rank,
        "nnodes": spec.nnodes,
        "master": spec.master if spec.hosts else None,
        "preferred_port": spec.preferred_port,
        "loopback_ok": spec.loopback_ok,
        "facts": dict(spec.facts),
    }


def _overrides(readiness: Readiness) -> list[dict[str, object]]:
    """The environment overrides of the rendered env (none before it is rendered)."""
    env = readiness.env
    overrides = [] if env is None else env.overrides
    return [
        {"key": o.key, "value": o.value, "derived": o.derived, "source": o.source}
        for o in overrides
    ]


def _ports(held: Mapping[str, HeldPort]) -> dict[str, object]:
    """Each port this node holds, by name, with the ports it skipped and why."""
    return {
        name: {
            "port": port.port,
            "held": port.held,
            "skipped": [{"port": s.port, "reason": s.reason} for s in port.skipped],
        }
        for name, port in held.items()
    }


def _timings(settings: Settings, readiness: Readiness) -> dict[str, object]:
    return {
        "uptime_s": round_s(readiness.uptime_s),
        "ready_after_s": round_s(readiness.ready_after_s),
        "deadline_s": settings.deadline_s,
    }


def peer_json(peer: PeerState) -> dict[str, object]:
    """One peer as /status shows it: an excused verdict's detail says what, not what to do."""
    res = peer.resolution
    detail = None if res is None else res.detail
    if res is not None and peer.excused and res.verdict is names.Verdict.LOOPBACK:
        detail = names.loopback_fact(res.host, res.addresses)
    return {
        "rank": peer.rank,
        "host": peer.host,
        "joined": peer.joined,
        "joined_after_s": round_s(peer.joined_after_s),
        "addresses": list(peer.addresses),
        "tf_port": peer.tf_port,
        "remote": peer.remote,
        "relay": peer.relay,
        "verified": peer.in_scope,
        "verdict": None if res is None else str(res.verdict),
        "excused": peer.excused,
        "resolved": [] if res is None else list(res.addresses),
        "detail": detail,
        "attempts": 0 if res is None else res.attempts,
        "resolve_s": None if res is None else round_s(res.elapsed_s),
    }


def _role(spec: ClusterSpec) -> str:
    if not spec.hosts:
        return "discovering"
    return "master" if spec.is_master else "worker"


def _checks(settings: Settings, verification: Verification | None) -> dict[str, object]:
    windows = None if verification is None else verification.windows
    check = None if verification is None else verification.check
    out: dict[str, object] = {
        "enabled": settings.probe,
        "windows": {} if windows is None else dict(windows.state),
    }
    if check is not None:
        out.update(check.status())
    return out


def _cluster(book: MasterBook) -> list[dict[str, object]]:
    """The master's view: each node's last report of the current generation (first 256)."""
    nodes: list[dict[str, object]] = []
    for rank, report in sorted(book.verdict.reports.items())[:256]:
        nodes.append(
            {
                "rank": rank,
                "host": report.host,
                "passed": report.passed,
                "failures": len(report.failures),
                "busy": sorted(report.busy),
                "route_ifname": report.net.ifname,
                "mtu": report.net.mtu,
                "rdma_devices": report.net.rdma,
                **_clock(report),
            }
        )
    return nodes


def _clock(report: wire.Report) -> dict[str, object]:
    """A node's clock against the master's, as its report gave it (core/clock.py)."""
    facts = report.clock
    return {
        "clock_offset_s": None if facts is None else round(facts.offset_s, 6),
        "clock_rtt_s": None if facts is None else round(facts.rtt_s, 6),
        "clock_source": None if facts is None else facts.source,
    }


def mesh_view(book: MasterBook, settings: Settings) -> dict[str, object]:
    """The master's mesh of the current generation (core/mesh.py), for GET /mesh and /v1/mesh."""
    spec, doc = book.spec, book.doc
    return mesh.view(
        hosts=spec.hosts,
        generation=None if doc is None else doc.generation,
        reports=book.verdict.reports,
        scope=mesh.scope_of(spec.nnodes, settings.resolve_scope, spec.session),
        excused=book.verdict.excused,
        cut=wire.MAX_FAILURES,
    )
