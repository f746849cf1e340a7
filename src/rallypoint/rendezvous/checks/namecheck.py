"""A generation's first two steps: check the peer names this node needs, then derive its env."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import msgspec

from rallypoint import wire
from rallypoint.core import names
from rallypoint.core.backoff import Backoff
from rallypoint.core.names import Resolution
from rallypoint.errors import OverrideError, TFConfigError
from rallypoint.model import ClusterDoc, Env, Member, OverrideSource
from rallypoint.net import netinfo, resolve
from rallypoint.net.pause import Pause
from rallypoint.reasons import Reason
from rallypoint.rendezvous.context import NodeContext
from rallypoint.served import derive

if TYPE_CHECKING:
    from rallypoint.rendezvous.checks.connectivity import Connections

# The rendezvous logs under one name, whichever module of it speaks.
log = logging.getLogger("rallypoint.rendezvous")

#: A node whose names or env failed judges them again after about this long.
RECHECK_S = 2.0

#: Called with (peer host, reason) when a peer's first check fails.
PeerFailure = Callable[[str, Reason], None]
#: Called with (peer rank, resolution) as soon as a peer's name passed.
PeerPassed = Callable[[int, Resolution], None]


class Report(Protocol):
    """Where the names' outcome goes next: the report to the master (clustercheck.py)."""

    net: wire.NetFacts

    def peer_failed(self, host: str, reason: Reason) -> None: ...

    async def failed(self, failures: Sequence[Reason], timeout_s: float) -> None: ...


class Checked(msgspec.Struct, frozen=True):
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
    #: That interface's MTU and whether RDMA devices are visible, for the report.
    net: wire.NetFacts = msgspec.field(default_factory=wire.NetFacts)


class NameCheck:
    """Checks the names of one spec's peers (retrying until the deadline) and derives the env."""

    def __init__(self, ctx: NodeContext, *, user: Mapping[str, tuple[str, OverrideSource]]) -> None:
        self.ctx = ctx
        self.user = user

    async def until_passed(self, doc: ClusterDoc, report: Report, connections: Connections) -> Env:
        """Check the names and derive the env until both pass, reporting each failure.

        A peer's first failure is reported at once, and a peer whose name passed is handed to
        the connection checks at once (connectivity.Connections.name_passed).
        """
        # A steady pause between half and all of RECHECK_S, so nodes do not judge in lockstep.
        recheck = Pause(Backoff(RECHECK_S, RECHECK_S, jitter="half", rng=self.ctx.rng))
        while True:
            connections.names_again()
            checked = await self.check(doc, report.peer_failed, connections.name_passed)
            log.debug("names_checked", extra={"failures": len(checked.failures)})
            self.ctx.readiness.verify_warnings = [checked.warning] if checked.warning else []
            report.net = checked.net
            outcome = checked.failures[0] if checked.failures else self.derive(doc, checked)
            if not isinstance(outcome, Reason):
                return outcome
            # Tell the master, then judge again after a pause: a fixed /etc/hosts entry or a
            # late DNS record turns the cluster ready without a restart (a poke or a re-join
            # retries at once).
            await report.failed(checked.failures or [outcome], self.ctx.settings.resolve_timeout_s)
            await recheck.sleep()

    async def check(
        self, doc: ClusterDoc, on_failure: PeerFailure, on_passed: PeerPassed
    ) -> Checked:
        """Resolve our own name and every peer name in scope; what failed and why."""
        spec = self.ctx.spec
        ranks = names.scope_ranks(
            spec.nnodes, spec.rank, self.ctx.settings.resolve_scope, seed=doc.session
        )
        peers = [r for r in ranks if r != spec.rank]
        self.ctx.peers.scope(ranks)
        # Our own name beside the peers' (one round of resolver threads, not two).
        own, *results = await asyncio.gather(
            self._check_own(doc.members[spec.rank]),
            *(self._verify_peer(doc.members[r], on_failure, on_passed) for r in peers),
        )
        failures = [r for r in (self._peer_reason(res) for res in results) if r is not None]
        master_ip = self._master_address(doc, own)
        net = await asyncio.to_thread(net_facts, master_ip)
        route_ifname = net.ifname
        ifname = route_ifname if self.ctx.settings.emit_ifname is not False else None
        # gloo binds the user's GLOO_SOCKET_IFNAME if set, else the one served here.
        bound = self._user_ifname() or ifname
        if "jax" in self.ctx.settings.frameworks:
            bound = None  # JAX's gloo reads no GLOO_SOCKET_IFNAME (docs/env-contract.md)
        self_reason, self_warning = self._judge_own(own, bound)
        if self_reason is None:
            excused = names.why_acceptable(
                own,
                accept_loopback=self.ctx.accept_loopback,
                lone=spec.nnodes == 1,
                ifname=bound,
            )
            self.ctx.peers.resolved(spec.rank, own, excused=excused)
        if self_reason is not None:
            failures.insert(0, self_reason)
        elif self_warning is not None:
            log.warning(
                "own_name", extra={"verdict": str(own.verdict), "host": own.host, "ifname": bound}
            )
        return Checked(failures, self_warning, own, master_ip, ifname, route_ifname, net)

    def derive(self, doc: ClusterDoc, checked: Checked) -> Env | Reason:
        """The env for a checked document, or why it cannot be derived."""
        spec = self.ctx.spec
        master_ip, ifname = checked.master_ip, checked.ifname
        options = self.ctx.settings.derive_options(self.user, master_ip=master_ip, ifname=ifname)
        if self.ctx.settings.master_addr_mode == "ip" and master_ip is None:
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
            self.ctx.resolver,
            self.ctx.spec.host,
            member.addresses or None,
            timeout_s=self.ctx.settings.resolve_timeout_s,
        )
        self.ctx.metrics.resolutions.labels(str(res.verdict)).inc()
        self.ctx.peers.resolved(self.ctx.spec.rank, res)
        return res

    def _judge_own(self, res: Resolution, ifname: str | None) -> tuple[Reason | None, str | None]:
        """judge_own for this node; a lone node has no peer to misroute."""
        accept = self.ctx.accept_loopback or self.ctx.spec.nnodes == 1
        rules = self.ctx.settings.own_name_rules()
        return names.judge_own(res, rules, accept_loopback=accept, ifname=ifname)

    def _user_ifname(self) -> str | None:
        user = self.user.get("GLOO_SOCKET_IFNAME")
        return user[0] if user is not None else None

    async def _verify_peer(
        self, member: Member, on_failure: PeerFailure, on_passed: PeerPassed
    ) -> Resolution:
        expected = member.addresses or None
        res = await resolve.check(
            self.ctx.resolver, member.host, expected, timeout_s=self.ctx.settings.resolve_timeout_s
        )
        reason = self._record_peer(member, res, on_passed)
        if reason is None:
            return res
        # Show the first failure at once; the retries below may take until the deadline.
        on_failure(member.host, reason)
        res = await resolve.verify(
            self.ctx.resolver,
            member.host,
            expected,
            deadline=self.ctx.readiness.deadline,
            timeout_s=self.ctx.settings.resolve_timeout_s,
            backoff_initial_s=self.ctx.settings.backoff_initial_s,
            backoff_max_s=self.ctx.settings.backoff_max_s,
            clock=self.ctx.clock,
            accept_loopback=self.ctx.accept_loopback,
        )
        self._record_peer(member, res, on_passed)
        return res

    def _record_peer(self, member: Member, res: Resolution, on_passed: PeerPassed) -> Reason | None:
        """Count and record a peer's resolution, telling the listener of a pass; why it failed."""
        self.ctx.metrics.resolutions.labels(str(res.verdict)).inc()
        reason = self._peer_reason(res)
        self.ctx.peers.resolved(member.rank, res, excused=self._excuse(res, reason))
        if reason is None:
            on_passed(member.rank, res)
        return reason

    def _peer_reason(self, res: Resolution) -> Reason | None:
        return names.peer_reason(res, accept_loopback=self.ctx.accept_loopback)

    def _excuse(self, res: Resolution, reason: Reason | None) -> str | None:
        if reason is not None:
            return None
        return names.why_acceptable(res, accept_loopback=self.ctx.accept_loopback)

    def _master_address(self, doc: ClusterDoc, own: Resolution) -> str | None:
        """The master's verified address: resolved here and reported by the master."""
        master = doc.members[0]
        res = own if self.ctx.spec.is_master else self.ctx.peers[0].resolution
        resolved = list(res.addresses) if res is not None else []
        for address in resolved:
            if address in master.addresses:
                return address
        if master.addresses:
            return master.addresses[0]
        return resolved[0] if resolved else None


def net_facts(master_ip: str | None) -> wire.NetFacts:
    """The interface that routes to the master, its MTU and whether RDMA devices are visible.

    Blocking (a routing socket, sysfs): one thread hop for all three, off the event loop.
    """
    ifname = None if master_ip is None else netinfo.route_ifname(master_ip)
    return wire.NetFacts(
        ifname=ifname,
        mtu=None if ifname is None else netinfo.mtu(ifname),
        rdma=netinfo.rdma_visible(),
    )
