"""Compose one sidecar (spec, resolver, held ports, rendezvous, listeners, mDNS) and run it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from rallypoint import providers, server
from rallypoint.auth import Authenticator
from rallypoint.core.clock import ClockEstimate
from rallypoint.core.lifecycle import AsyncResource
from rallypoint.errors import ClusterSpecError, ConfigError, PortError, TFConfigError
from rallypoint.metrics import Metrics
from rallypoint.model import ClusterSpec, OverrideSource, master_ports
from rallypoint.net import netinfo, ports, resolve
from rallypoint.net.peerhttp import PeerEndpoint
from rallypoint.net.probe import ProbeRoute
from rallypoint.net.resolve import Resolver
from rallypoint.rendezvous.node import Rendezvous
from rallypoint.served import derive, overrides, tfconfig
from rallypoint.settings import Settings

if TYPE_CHECKING:
    from rallypoint.mdns.announce import Mdns

log = logging.getLogger(__name__)

_UNSIGNED_REMEDY = "set RALLYPOINT_TOKEN (or --token-file) to the same secret on every node"


class Sidecar(AsyncResource):
    """Everything `rallypoint serve` runs, as one async context manager.

    Several can run in one event loop (the in-process tests and the demo do): each gets its
    own Settings (ports), registry, authenticator and state. ``spec``, ``addresses`` and
    ``endpoint`` replace provider detection, interface discovery and the peer address
    (host name + Settings.peer_port) when given.
    """

    def __init__(
        self,
        settings: Settings,
        environ: Mapping[str, str],
        *,
        resolver: Resolver | None = None,
        spec: ClusterSpec | None = None,
        addresses: Sequence[str] | None = None,
        endpoint: PeerEndpoint | None = None,
        route: ProbeRoute | None = None,
        avoid_ports: Collection[int] = (),
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        #: The wall clock (Unix seconds) peer messages are timed by, before correction.
        self._wall_clock = wall_clock
        self.environ = dict(environ)
        self._resolver = resolver
        self._spec = spec
        self._addresses = None if addresses is None else tuple(addresses)
        self._endpoint = endpoint
        self._route = route
        #: Never handed to the job: its own APIs' ports, and the ports the caller names.
        self._avoid = frozenset(avoid_ports) | self._api_ports().keys()
        self._stack: AsyncExitStack | None = None
        self._node: Rendezvous | None = None
        self._mdns: Mdns | None = None
        self._mdns_error: str | None = None
        self._mdns_changed = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.listeners: server.Listeners | None = None
        self.metrics = Metrics()

    @property
    def node(self) -> Rendezvous:
        if self._node is None:
            raise RuntimeError("the sidecar is not started")
        return self._node

    @property
    def held_ports(self) -> list[int]:
        return [held.port for held in self.node.held.values()]

    async def start(self) -> None:
        """Reserve ports, bind both APIs and start the rendezvous; undone entirely on failure."""
        stack = AsyncExitStack()
        self._stack = stack
        try:
            await self._start(stack)
        except BaseException:
            self._stack = None
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await stack.aclose()
            raise

    async def _start(self, stack: AsyncExitStack) -> None:
        settings = self.settings
        resolver = self._resolver
        if resolver is None:
            resolver = await stack.enter_async_context(
                resolve.SystemResolver(settings.resolve_workers)
            )
        user = derive.user_values(self.environ, settings.sets)
        derive.check_values(user)  # a malformed value could never be served: exit 2 now
        # Signed and checked on the master's clock as measured (core/clock.py): a worker whose
        # clock is off still joins, and is named for it (docs/readiness.md#clocks).
        offsets = ClockEstimate(self._wall_clock, on_change=self.metrics.clock_offset.set)
        auth = Authenticator(settings.token, clock=offsets.now)
        spec = self._spec or providers.detect(self.environ, settings.provider)
        # A lone node exchanges no peer message: nothing to authenticate, nothing to warn of.
        unsigned = not auth.enabled and (spec.nnodes > 1 or not spec.hosts)
        if unsigned:
            log.warning("auth_disabled", extra={"remedy": _UNSIGNED_REMEDY})
        addresses = (
            self._addresses if self._addresses is not None else tuple(netinfo.local_addresses())
        )
        if settings.mdns:
            await self._start_mdns(stack, spec, auth)
        self._check_discovery(spec)
        # Without hosts (mDNS discovery) the rank is unknown: MASTER_PORT is held later.
        held = self._hold(stack, spec, user)
        node = Rendezvous(
            spec,
            settings,
            resolver=resolver,
            auth=auth,
            metrics=self.metrics,
            addresses=addresses,
            held=held,
            user=user,
            endpoint=self._endpoint,
            route=self._route,
            offsets=offsets,
        )
        if unsigned:
            node.readiness.static_warnings.append(
                "peer messages are not authenticated: set RALLYPOINT_TOKEN on every node"
            )
        self._node = await stack.enter_async_context(node)
        self._expose(node)
        # Both APIs answer from here on; during discovery the peer API refuses joins (503).
        self.listeners = await stack.enter_async_context(server.Listeners(node, settings))
        if self._mdns is not None:
            self._start_discovery(stack, self._mdns, node, addresses, user)

    def _expose(self, node: Rendezvous) -> None:
        """Show the node's mDNS section on /status and its reasons in the metrics."""
        node.status_sections["mdns"] = self._mdns_status
        self.metrics.not_ready_codes = lambda: [reason.code for reason in node.readiness.reasons()]
        self.metrics.link_warning_codes = lambda: (
            [] if node.book is None else [reason.code for reason in node.book.verdict.link_warnings]
        )

    async def stop(self, *, goodbye: bool = True) -> None:
        """Readiness 503 first, then the goodbyes (to the nodes this one keeps alive with,
        and mDNS's), then close everything within the grace. ``goodbye=False`` leaves as a
        crash would: the others name this node down."""
        stack, self._stack = self._stack, None
        if stack is None:
            return
        if self._node is not None:
            self._node.begin_shutdown()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            async with asyncio.timeout(self.settings.shutdown_grace_s):
                if goodbye and self._node is not None:
                    await self._node.goodbye()
                if self._mdns is not None:
                    await self._mdns.close()
                await stack.aclose()
        except TimeoutError:
            log.warning("shutdown_timeout", extra={"grace_s": self.settings.shutdown_grace_s})

    async def close(self) -> None:
        """What `async with` runs on exit: stop()."""
        await self.stop()

    # -- ports --------------------------------------------------------------------------

    def _hold(
        self,
        stack: AsyncExitStack,
        spec: ClusterSpec,
        user: Mapping[str, tuple[str, OverrideSource]],
    ) -> dict[str, ports.HeldPort]:
        """This node's ports (see _reserve), released when `stack` closes."""
        held = self._reserve(spec, user)
        for port in held.values():
            stack.callback(port.close)
        return held

    def _reserve(
        self, spec: ClusterSpec, user: Mapping[str, tuple[str, OverrideSource]]
    ) -> dict[str, ports.HeldPort]:
        """Hold MASTER_PORT and the JAX coordinator port (master), the TF worker port (when
        TF_CONFIG is served) and the probe port (when connections are checked)."""
        settings = self.settings
        held: dict[str, ports.HeldPort] = {}
        try:
            if spec.is_master:
                held["master"] = self._reserve_master(spec, user)
                if "jax" in settings.frameworks:
                    avoid = set(self._avoid) | {p.port for p in held.values()}
                    held["jax"] = self._reserve_jax(user, avoid)
            if "tf" in settings.frameworks:
                avoid = set(self._avoid) | {p.port for p in held.values()}
                held["tf"] = ports.reserve([settings.tf_port], settings.port_range, avoid=avoid)
            if settings.probe:
                held["probe"] = ports.reserve_ephemeral()
        except BaseException:
            for port in held.values():
                port.close()
            raise
        return held

    def _reserve_master(
        self, spec: ClusterSpec, user: Mapping[str, tuple[str, OverrideSource]]
    ) -> ports.HeldPort:
        settings = self.settings
        if "MASTER_PORT" in user:
            text, source = user["MASTER_PORT"]
            wanted = overrides.user_port(text)
            if wanted is not None:
                self._not_an_api_port(f"MASTER_PORT={wanted} (from {source})", wanted)
                # The user's port must be exactly that port: never fall back to another, and
                # never refuse it for lying in the ephemeral range (the user chose it).
                try:
                    return ports.reserve(
                        [wanted], settings.port_range, avoid=self._avoid, exact=True
                    )
                except PortError as exc:
                    raise PortError(
                        f"MASTER_PORT={wanted} (from {source}) cannot be held on this node: "
                        f"{exc}; free it or unset MASTER_PORT"
                    ) from exc
            # Not a port: check_values refused it before this point.
        preferred = master_ports(
            settings.master_port, spec.preferred_port, settings.default_master_port
        )
        return ports.reserve(preferred, settings.port_range, avoid=self._avoid)

    def _reserve_jax(
        self, user: Mapping[str, tuple[str, OverrideSource]], avoid: Collection[int]
    ) -> ports.HeldPort:
        """The coordinator port: exactly the user's JAX_COORDINATOR_ADDRESS port, if set."""
        settings = self.settings
        if "JAX_COORDINATOR_ADDRESS" in user:
            text, source = user["JAX_COORDINATOR_ADDRESS"]
            try:
                _host, wanted = tfconfig.parse_address(text, "JAX_COORDINATOR_ADDRESS")
            except TFConfigError:
                wanted = None  # check_values refused it before this point
            if wanted is not None:
                self._not_an_api_port(
                    f"JAX_COORDINATOR_ADDRESS={text} (from {source}) names port {wanted}, which",
                    wanted,
                )
                try:
                    return ports.reserve([wanted], settings.port_range, avoid=avoid, exact=True)
                except PortError as exc:
                    raise PortError(
                        f"JAX_COORDINATOR_ADDRESS={text} (from {source}) names port {wanted}, "
                        f"which cannot be held on this node: {exc}; free it or unset the variable"
                    ) from exc
        return ports.reserve([settings.jax_port], settings.port_range, avoid=avoid)

    def _api_ports(self) -> dict[int, str]:
        """The ports this sidecar's own listeners take, each with what it is and its setting."""
        settings = self.settings
        own = {
            settings.local_port: "local API (RALLYPOINT_LOCAL_PORT)",
            settings.peer_port: "peer API (RALLYPOINT_PEER_PORT)",
        }
        if settings.metrics_port is not None:
            own[settings.metrics_port] = "metrics listener (RALLYPOINT_METRICS_PORT)"
        return own

    def _not_an_api_port(self, what: str, port: int) -> None:
        """Refuse a port the user chose for the job when one of this sidecar's listeners
        needs it: held for the job first, it would stop that listener with "in use"."""
        own = self._api_ports()
        if port in own:
            raise ConfigError(
                f"{what} is the port of this sidecar's {own[port]}; give the job another port"
                " or move the sidecar's listener"
            )

    # -- mDNS ---------------------------------------------------------------------------

    async def _start_mdns(
        self, stack: AsyncExitStack, spec: ClusterSpec, auth: Authenticator
    ) -> None:
        """Start mDNS beside HTTP; any failure is logged and leaves HTTP working."""
        if spec.hosts:
            host = spec.host
        else:
            host = self.environ.get("HOSTNAME", "")
            if not host:
                raise ClusterSpecError("mDNS discovery needs this node's host name: set HOSTNAME")
        try:
            from rallypoint.mdns.announce import Mdns

            mdns = Mdns(
                session=spec.session,
                host=host,
                peer_port=self.settings.peer_port,
                auth=auth,
                interfaces=self.settings.mdns_interfaces,
                allowed_hosts=spec.hosts or None,
                on_change=self._mdns_changed.set,
            )
            self._mdns = await stack.enter_async_context(mdns)
        except Exception as exc:
            self._mdns_error = f"{type(exc).__name__}: {exc}"
            log.warning(
                "mdns_failed", extra={"error": self._mdns_error, "remedy": "HTTP still works"}
            )

    def _check_discovery(self, spec: ClusterSpec) -> None:
        """Refuse a spec without hosts when mDNS, the only way to discover them, is unavailable."""
        if not spec.hosts and (self._mdns is None or not self._mdns.available):
            raise ClusterSpecError(
                f"RALLYPOINT_DISCOVERY=mdns but mDNS is unavailable ({self._mdns_error}); "
                "use a provider with a host list on networks without multicast"
            )

    def _start_discovery(
        self,
        stack: AsyncExitStack,
        mdns: Mdns,
        node: Rendezvous,
        addresses: Sequence[str],
        user: Mapping[str, tuple[str, OverrideSource]],
    ) -> None:
        """Run the discovery loop beside the node: it completes the spec, then announces."""
        from rallypoint.mdns.loop import DiscoveryLoop

        self.metrics.mdns_rejections = lambda: mdns.rejections
        loop = DiscoveryLoop(mdns, node, self._mdns_changed, self.metrics)
        node.on_generation.append(lambda doc: self._spawn(loop.announce_generation(doc)))
        self._spawn(loop.run(addresses, lambda spec: self._hold(stack, spec, user)))

    def _mdns_status(self) -> object:
        if self._mdns is None:
            return {"enabled": self.settings.mdns, "error": self._mdns_error}
        seen = [
            {"host": a.host, "rank": a.rank, "generation": a.generation, "instance": a.instance}
            for a in self._mdns.peers()
        ]
        return {"enabled": True, "error": self._mdns_error, **self._mdns.status(), "seen": seen}

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[Any] = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def run(
    settings: Settings, environ: Mapping[str, str], *, resolver: Resolver | None = None
) -> None:
    """Serve until SIGTERM/SIGINT (or cancellation): readiness 503 first, then exit."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    try:
        async with Sidecar(settings, environ, resolver=resolver):
            await stop.wait()
            log.info("shutdown_requested")
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
