"""Verification of a cluster document: check the peer names this node needs, then derive its env."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rallypoint import derive, netinfo, resolve
from rallypoint.errors import OverrideError, TFConfigError
from rallypoint.metrics import Metrics
from rallypoint.model import ClusterDoc, ClusterSpec, Env, Member, OverrideSource
from rallypoint.reasons import Reason, loopback_reason, self_loopback_reason
from rallypoint.resolve import Resolution, Resolver, Verdict
from rallypoint.settings import Settings

# The rendezvous logs under one name, whichever module of it speaks.
log = logging.getLogger("rallypoint.rendezvous")

#: Called with (document, peer host, reason) when a peer's first check fails.
PeerFailure = Callable[[ClusterDoc, str, Reason], None]


@dataclass(slots=True)
class PeerState:
    """What this node knows about one node of the session, for /status."""

    rank: int
    host: str
    joined: bool = False
    joined_after_s: float | None = None
    addresses: tuple[str, ...] = ()
    tf_port: int | None = None
    remote: str | None = None
    in_scope: bool = False
    resolution: Resolution | None = None

    def as_json(self) -> dict[str, object]:
        res = self.resolution
        return {
            "rank": self.rank,
            "host": self.host,
            "joined": self.joined,
            "joined_after_s": round_s(self.joined_after_s),
            "addresses": list(self.addresses),
            "tf_port": self.tf_port,
            "remote": self.remote,
            "verified": self.in_scope,
            "verdict": None if res is None else str(res.verdict),
            "resolved": [] if res is None else list(res.addresses),
            "detail": None if res is None else res.detail,
            "attempts": 0 if res is None else res.attempts,
            "resolve_s": None if res is None else round_s(res.elapsed_s),
        }


@dataclass(frozen=True, slots=True)
class Checked:
    """The outcome of checking names: failures, a warning about our own name, what to serve."""

    failures: list[Reason]
    warning: str | None
    own: Resolution
    #: The master's verified address (None when no verified answer names it).
    master_ip: str | None
    #: The interface served as GLOO_SOCKET_IFNAME (None with --no-emit-ifname or when no
    #: route was found); the own name was judged with it, so derive() serves exactly what
    #: the judgement assumed.
    ifname: str | None
    #: The interface that routes to the master, served or not (for /status and the MTU).
    route_ifname: str | None = None


class Verifier:
    """Checks the names of one spec's peers (retrying until the deadline) and derives the env."""

    def __init__(
        self,
        spec: ClusterSpec,
        settings: Settings,
        *,
        resolver: Resolver,
        metrics: Metrics,
        peers: Mapping[int, PeerState],
        user: Mapping[str, tuple[str, OverrideSource]],
        accept_loopback: bool,
        clock: Callable[[], float],
        deadline: Callable[[], float],
        on_peer_failure: PeerFailure,
    ) -> None:
        self.spec = spec
        self.settings = settings
        self.resolver = resolver
        self.metrics = metrics
        self.peers = peers
        self.user = user
        self.accept_loopback = accept_loopback
        self._clock = clock
        self._deadline = deadline
        self._on_peer_failure = on_peer_failure

    async def check(self, doc: ClusterDoc) -> Checked:
        """Resolve our own name and every peer name in scope; what failed and why."""
        spec = self.spec
        ranks = resolve.scope_ranks(
            spec.nnodes, spec.rank, self.settings.resolve_scope, seed=doc.session
        )
        peers = [r for r in ranks if r != spec.rank]
        for peer in self.peers.values():
            peer.in_scope = peer.rank in ranks
        own = await self._check_own(doc.members[spec.rank])
        results = await asyncio.gather(*(self._verify_peer(doc, doc.members[r]) for r in peers))
        failures = [r for r in (self.peer_reason(res) for res in results) if r is not None]
        master_ip = self._master_address(doc, own)
        route_ifname = await self._route_ifname(master_ip)
        ifname = route_ifname if self.settings.emit_ifname is not False else None
        # gloo binds the user's GLOO_SOCKET_IFNAME if set, else the one served here.
        bound = self._user_ifname() or ifname
        if "jax" in self.settings.frameworks:
            bound = None  # JAX's gloo reads no GLOO_SOCKET_IFNAME (docs/env-contract.md)
        self_reason, self_warning = self._judge_own(own, bound)
        if self_reason is not None:
            failures.insert(0, self_reason)
        elif self_warning is not None:
            log.warning("own_name verdict=%s host=%s ifname=%s", own.verdict, own.host, bound)
        return Checked(failures, self_warning, own, master_ip, ifname, route_ifname)

    def derive(self, doc: ClusterDoc, checked: Checked) -> Env | Reason:
        """The env for a checked document, or why it cannot be derived."""
        spec = self.spec
        master_ip, ifname = checked.master_ip, checked.ifname
        options = self.settings.derive_options(self.user, master_ip=master_ip, ifname=ifname)
        if self.settings.master_addr_mode == "ip" and master_ip is None:
            return Reason(
                "resolve_failed",
                "--master-addr ip: no verified address for the master",
                host=spec.master,
            )
        try:
            return derive.derive(spec, doc, options)
        except OverrideError as exc:
            return Reason("override_invalid", str(exc))
        except TFConfigError as exc:
            return Reason("tfconfig_invalid", str(exc))

    async def _check_own(self, member: Member) -> Resolution:
        res = await resolve.check(
            self.resolver,
            self.spec.host,
            member.addresses or None,
            timeout_s=self.settings.resolve_timeout_s,
        )
        self.metrics.resolutions.labels(str(res.verdict)).inc()
        self.peers[self.spec.rank].resolution = res
        return res

    def _judge_own(self, res: Resolution, ifname: str | None) -> tuple[Reason | None, str | None]:
        """judge_own for this node; a lone node has no peer to misroute."""
        accept = self.accept_loopback or self.spec.nnodes == 1
        return judge_own(res, self.settings, accept_loopback=accept, ifname=ifname)

    def _user_ifname(self) -> str | None:
        user = self.user.get("GLOO_SOCKET_IFNAME")
        return user[0] if user is not None else None

    async def _route_ifname(self, master_ip: str | None) -> str | None:
        """The interface that routes to the master; None if unknown."""
        if master_ip is None:
            return None
        return await asyncio.to_thread(netinfo.route_ifname, master_ip)

    async def _verify_peer(self, doc: ClusterDoc, member: Member) -> Resolution:
        peer = self.peers[member.rank]
        expected = member.addresses or None
        res = await resolve.check(
            self.resolver, member.host, expected, timeout_s=self.settings.resolve_timeout_s
        )
        self.metrics.resolutions.labels(str(res.verdict)).inc()
        peer.resolution = res
        if self.peer_reason(res) is None:
            return res
        # Show the first failure at once; the retries below may take until the deadline.
        reason = self.peer_reason(res)
        assert reason is not None
        self._on_peer_failure(doc, member.host, reason)
        res = await resolve.verify(
            self.resolver,
            member.host,
            expected,
            deadline=self._deadline(),
            timeout_s=self.settings.resolve_timeout_s,
            backoff_initial_s=self.settings.backoff_initial_s,
            backoff_max_s=self.settings.backoff_max_s,
            clock=self._clock,
            accept_loopback=self.accept_loopback,
        )
        self.metrics.resolutions.labels(str(res.verdict)).inc()
        peer.resolution = res
        return res

    def peer_reason(self, res: Resolution) -> Reason | None:
        """Why a peer's resolution fails verification, or None when it passes."""
        if res.verdict is Verdict.OK:
            return None
        if res.verdict is Verdict.LOOPBACK:
            return None if self.accept_loopback else loopback_reason(res.host, res)
        if res.verdict is Verdict.MISMATCH:
            return Reason(
                "address_mismatch",
                f"peer {res.host} resolves here to an address it did not report; "
                "fix its DNS or /etc/hosts entry",
                host=res.host,
                detail=res.detail,
            )
        return Reason(
            "resolve_failed",
            f"peer {res.host} does not resolve here ({res.verdict}); wait for DNS or fix it",
            host=res.host,
            detail=res.detail,
        )

    def _master_address(self, doc: ClusterDoc, own: Resolution) -> str | None:
        """The master's verified address: resolved here and reported by the master."""
        master = doc.members[0]
        res = own if self.spec.is_master else self.peers[0].resolution
        resolved = list(res.addresses) if res is not None else []
        for address in resolved:
            if address in master.addresses:
                return address
        if master.addresses:
            return master.addresses[0]
        return resolved[0] if resolved else None


def judge_own(
    res: Resolution, settings: Settings, *, accept_loopback: bool, ifname: str | None
) -> tuple[Reason | None, str | None]:
    """This node's own name: (why it is not ready, or None; a warning for /status, or None).

    On loopback it is fatal (``self_loopback``) unless loopback is accepted or ``ifname`` names
    the interface gloo binds instead (GLOO_SOCKET_IFNAME); with --strict-self anything but OK
    is fatal (``strict_self``), ``ifname`` or not.
    """
    if res.verdict is Verdict.OK or (res.verdict is Verdict.LOOPBACK and accept_loopback):
        return None, None
    host = res.host
    if res.verdict is not Verdict.LOOPBACK:
        text = f"this node's own name {host} does not check out: {res.detail}"
        if settings.strict_self:
            return _strict_self(host, res, text), None
        return None, text
    loopback = [address for address in res.addresses if resolve.is_loopback(address)]
    where = f"this node's own name {host} resolves to loopback ({', '.join(loopback)})"
    if settings.strict_self:
        # Stacks that advertise their own resolved name ignore GLOO_SOCKET_IFNAME.
        return _strict_self(
            host, res, f"{where}; map {host} to its cluster address in /etc/hosts"
        ), None
    if ifname is None:
        return self_loopback_reason(
            host,
            loopback,
            detail=res.detail,
            emit_ifname=settings.emit_ifname is not False,
            jax="jax" in settings.frameworks,
        ), None
    return None, (
        f"{where}; gloo binds {ifname} (GLOO_SOCKET_IFNAME) instead, but stacks that advertise "
        f"their own resolved name would not: map {host} to its cluster address in /etc/hosts"
    )


def _strict_self(host: str, res: Resolution, text: str) -> Reason:
    return Reason(
        "strict_self", f"{text} (fatal with --strict-self)", host=host, detail=str(res.verdict)
    )


def round_s(value: float | None) -> float | None:
    """Seconds rounded to milliseconds for /status, None kept."""
    return None if value is None else round(value, 3)
