"""mDNS announce and browse on python-zeroconf's asyncio API; the only module importing zeroconf."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import ifaddr
from zeroconf import DNSQuestionType, InterfaceChoice, IPVersion, ServiceStateChange, Zeroconf
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from rallypoint import discovery
from rallypoint.discovery import Announcement, assign_ranks
from rallypoint.errors import AuthError, PeerMessageError

if TYPE_CHECKING:
    from rallypoint.auth import Authenticator

__all__ = ["SERVICE_TYPE", "Announcement", "Mdns", "assign_ranks", "browse", "resolve_interfaces"]

log = logging.getLogger(__name__)

SERVICE_TYPE = "_rallypoint._tcp.local."
#: How often an instance that nobody answered for is asked again before it is left alone.
RESOLVE_ATTEMPTS = 3

# Rejection reasons, the keys of Mdns.rejections.
MALFORMED, WRONG_SESSION, UNKNOWN_HOST, BAD_SIGNATURE = "malformed", "session", "host", "signature"

#: Zeroconf's interface choice: every interface, or IPv4 addresses and IPv6 interface indexes.
Interfaces = InterfaceChoice | list[str | int]


def _instance_label(name: str) -> str:
    """The instance label of a full service name ("label._rallypoint._tcp.local.")."""
    return name[: -len(SERVICE_TYPE) - 1] if name.endswith("." + SERVICE_TYPE) else name


def resolve_interfaces(entries: Sequence[str]) -> Interfaces:
    """Zeroconf's interface choice for interface names or addresses; () means every interface.

    IPv4 is given to zeroconf by address, IPv6 by interface index (IPV6_JOIN_GROUP
    wants an index). Unknown names are logged and skipped; ValueError when none is left.
    """
    adapters = {adapter.nice_name: adapter for adapter in ifaddr.get_adapters()}
    if not entries:
        return _default_interfaces(adapters.values())
    chosen: list[str | int] = []
    for entry in entries:
        with contextlib.suppress(ValueError):
            ipaddress.ip_address(entry)
            chosen.append(entry)
            continue
        adapter = adapters.get(entry)
        if adapter is None:
            log.warning("mdns_interface_unknown interface=%s", entry)
            continue
        chosen.extend(ip.ip for ip in adapter.ips if isinstance(ip.ip, str))
        if adapter.index is not None and any(isinstance(ip.ip, tuple) for ip in adapter.ips):
            chosen.append(adapter.index)
    if not chosen:
        raise ValueError(
            f"RALLYPOINT_MDNS_INTERFACES={','.join(entries)} names no usable interface"
        )
    return list(dict.fromkeys(chosen))


def _default_interfaces(adapters: Iterable[ifaddr.Adapter]) -> Interfaces:
    """Every IPv4 address, and IPv6 on every interface but loopback.

    IPv6 multicast has no route on ``lo`` (sends to ff02::fb from ::1 fail with
    ENETUNREACH on every announcement), while IPv4 multicast on 127.0.0.1 works and
    lets sidecars on one host see each other.
    """
    chosen: list[str | int] = []
    for adapter in adapters:
        v4 = [ip.ip for ip in adapter.ips if isinstance(ip.ip, str)]
        chosen.extend(v4)
        v6 = [ip.ip for ip in adapter.ips if isinstance(ip.ip, tuple)]
        loopback = any(address[0] == "::1" for address in v6) or adapter.nice_name == "lo"
        if v6 and not loopback and adapter.index is not None:
            chosen.append(adapter.index)
    return list(dict.fromkeys(chosen)) or InterfaceChoice.All


def open_zeroconf(choice: Interfaces) -> AsyncZeroconf:
    """Zeroconf on the chosen interfaces; "all" means IPv4 and IPv6 (IPv4 alone if IPv6 fails)."""
    if choice is not InterfaceChoice.All:
        # An explicit list says its own IP versions (zeroconf infers them from the entries).
        return AsyncZeroconf(interfaces=choice)
    try:
        return AsyncZeroconf(interfaces=choice, ip_version=IPVersion.All)
    except OSError as exc:
        # Hosts with IPv6 disabled fail the IPv6 socket; IPv4 alone still finds peers.
        log.info("mdns_ipv6_unavailable error=%r", exc)
        return AsyncZeroconf(interfaces=choice, ip_version=IPVersion.V4Only)


class _Browser:
    """Browses SERVICE_TYPE, resolves each instance and keeps the ones `judge` accepts."""

    def __init__(
        self,
        azc: AsyncZeroconf,
        *,
        auth: Authenticator | None,
        judge: Callable[[Announcement], str | None],
        on_change: Callable[[], None],
        own_instance: Callable[[], str | None],
        request_timeout_s: float,
    ) -> None:
        self._azc = azc
        self._auth = auth
        self._judge = judge
        self._on_change = on_change
        self._own_instance = own_instance
        self._request_timeout_s = request_timeout_s
        self.accepted: dict[str, Announcement] = {}
        self._fields: dict[str, dict[str, str]] = {}
        self.rejections: dict[str, int] = {}
        #: The latest rejections as (instance, reason): which announcer to look at.
        self.recent_rejections: deque[tuple[str, str]] = deque(maxlen=16)
        self.seen_any = False
        # Last TXT judged per instance: the same record seen again is neither re-verified
        # (a replay cache would refuse its nonce) nor counted twice.
        self._judged: dict[str, bytes] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._warned: set[str] = set()
        self._browser: AsyncServiceBrowser | None = None

    def start(self) -> None:
        # QM for the same reason as in _resolve_once: unicast answers reach one socket only.
        self._browser = AsyncServiceBrowser(
            self._azc.zeroconf,
            SERVICE_TYPE,
            handlers=[self._on_state_change],
            question_type=DNSQuestionType.QM,
        )

    async def stop(self) -> None:
        if self._browser is not None:
            await self._browser.async_cancel()
            self._browser = None
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def warn_once(self, event: str, detail: str) -> None:
        """Log a repeated problem at warning once, then at debug (zeroconf's QuietLogger)."""
        level = logging.DEBUG if event in self._warned else logging.WARNING
        self._warned.add(event)
        log.log(level, "%s %s", event, detail)

    def _on_state_change(
        self,
        zeroconf: Zeroconf,
        service_type: str,
        name: str,
        state_change: ServiceStateChange,
    ) -> None:
        # Runs inside zeroconf's dispatch: it must never raise and never block.
        try:
            if name == self._own_instance():
                return
            if state_change is ServiceStateChange.Removed:
                self._judged.pop(name, None)
                self._drop(name)
                return
            if name in self._tasks:
                self._again.add(name)
                return
            self._tasks[name] = asyncio.get_running_loop().create_task(self._resolve(name))
        except Exception as exc:
            self.warn_once("mdns_callback_failed", f"instance={name!r} error={exc!r}")

    async def _resolve(self, name: str) -> None:
        try:
            unanswered = 0
            while True:
                self._again.discard(name)
                if not await self._resolve_once(name):
                    # Unanswered (a lost packet, a busy peer): ask again a few times, as
                    # nothing else would make this instance show up before its next change.
                    unanswered += 1
                    if unanswered < RESOLVE_ATTEMPTS:
                        self._again.add(name)
                if name not in self._again:
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.warn_once("mdns_resolve_failed", f"instance={name!r} error={exc!r}")
        finally:
            self._tasks.pop(name, None)

    async def _resolve_once(self, name: str) -> bool:
        """Resolve and judge one instance; False when nobody answered in time."""
        info = AsyncServiceInfo(SERVICE_TYPE, name)
        # Zeroconf counts milliseconds; rallypoint's API speaks seconds. Multicast answers
        # (QM) rather than zeroconf's default unicast-first (QU, RFC 6762 section 5.4): when
        # several sidecars share one host and port 5353, a unicast answer reaches only one
        # of their sockets, often not the one that asked.
        timeout_ms = self._request_timeout_s * 1000
        if not await info.async_request(self._azc.zeroconf, timeout_ms, DNSQuestionType.QM):
            return False
        text = bytes(info.text or b"")
        if self._judged.get(name) == text:
            return True
        self._judged[name] = text
        self.seen_any = True
        instance = _instance_label(name)
        try:
            parsed, fields = discovery.parse_fields(info.properties, instance=instance)
        except PeerMessageError as exc:
            self.warn_once("mdns_rejected_malformed", f"instance={instance!r} error={exc}")
            self._reject(name, MALFORMED)
            return True
        announcement = replace(parsed, verified=self._verify(fields))
        reason = self._judge(announcement)
        if reason is not None:
            self._reject(name, reason)
            return True
        self._fields[name] = fields
        if self.accepted.get(name) != announcement:
            self.accepted[name] = announcement
            self._changed()
        return True

    def _reject(self, name: str, reason: str) -> None:
        self.rejections[reason] = self.rejections.get(reason, 0) + 1
        self.recent_rejections.append((_instance_label(name), reason))
        log.debug("mdns_rejected instance=%r reason=%s", name, reason)
        self._drop(name)

    def _drop(self, name: str) -> None:
        self._fields.pop(name, None)
        if self.accepted.pop(name, None) is not None:
            self._changed()

    def expire_stale(self) -> None:
        """Drop accepted peers whose signature is no longer fresh."""
        for name, fields in list(self._fields.items()):
            if self._verify(fields) is False:
                log.info("mdns_peer_expired instance=%r", name)
                self._judged.pop(name, None)
                self._drop(name)

    def _verify(self, fields: dict[str, str]) -> bool | None:
        if self._auth is None or not self._auth.enabled:
            return None
        try:
            self._auth.verify_fields(fields)
        except AuthError:
            return False
        return True

    def _changed(self) -> None:
        try:
            self._on_change()
        except Exception as exc:
            self.warn_once("mdns_on_change_failed", f"error={exc!r}")


class Mdns:
    """Announces this node and collects valid announcements of its session; degrades, never crashes.

    Every failure to start zeroconf (no multicast-capable interface, a socket error) is
    logged once and leaves `available` False: the sidecar keeps working over HTTP.
    """

    def __init__(
        self,
        *,
        session: str,
        host: str,
        peer_port: int,
        auth: Authenticator,
        interfaces: Sequence[str] = (),
        allowed_hosts: Collection[str] | None = None,
        on_change: Callable[[], None] | None = None,
        request_timeout_s: float = 3.0,
        refresh_s: float | None = None,
    ) -> None:
        self.session = session
        self.host = host
        self.peer_port = peer_port
        self._auth = auth
        self._interfaces = tuple(interfaces)
        self._allowed = frozenset(allowed_hosts) if allowed_hosts is not None else None
        self._on_change = on_change
        self._request_timeout_s = request_timeout_s
        # auth.py rejects signed records older than max_skew_s: re-sign well inside it.
        self._refresh_s = refresh_s if refresh_s is not None else auth.max_skew_s / 3
        self._azc: AsyncZeroconf | None = None
        self._browser: _Browser | None = None
        self._info: AsyncServiceInfo | None = None
        self._own: Announcement | None = None
        self._fields: dict[str, str] | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._started = False
        self._closed = False
        #: False when zeroconf could not start: announcements and browsing are off.
        self.available = False
        #: The registered instance name (after any conflict rename), once announced.
        self.instance: str | None = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Open zeroconf on the chosen interfaces and start browsing; idempotent."""
        if self._started or self._closed:
            return
        self._started = True
        try:
            choice = resolve_interfaces(self._interfaces)
            self._azc = open_zeroconf(choice)
            self._browser = _Browser(
                self._azc,
                auth=self._auth,
                judge=self._judge,
                on_change=self._changed,
                own_instance=lambda: self._info.name if self._info is not None else None,
                request_timeout_s=self._request_timeout_s,
            )
            self._browser.start()
        except Exception as exc:
            log.warning(
                "mdns_unavailable error=%r remedy=%s", exc, "peers still rendezvous over HTTP"
            )
            await self._close_zeroconf()
            return
        self.available = True
        if self._auth.enabled:
            self._refresher = asyncio.get_running_loop().create_task(self._refresh())

    def _judge(self, announcement: Announcement) -> str | None:
        if announcement.session != self.session:
            return WRONG_SESSION
        if self._allowed is not None and announcement.host not in self._allowed:
            return UNKNOWN_HOST
        if announcement.verified is False:
            return BAD_SIGNATURE
        return None

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    async def announce(self, *, rank: int, generation: str, addresses: Sequence[str]) -> None:
        """Announce or update this node's rank, generation and addresses (kept locally if off)."""
        fields, own = discovery.encode_fields(
            session=self.session,
            host=self.host,
            rank=rank,
            peer_port=self.peer_port,
            generation=generation,
            addresses=addresses,
        )
        await self._announce((fields, replace(own, verified=True if self._auth.enabled else None)))

    async def _announce(self, new: tuple[dict[str, str], Announcement] | None) -> None:
        """Publish `new`, or re-sign the current announcement when None."""
        async with self._lock:
            # Read under the lock: a refresh must never resurrect an older rank or generation.
            if new is None:
                if self._fields is None or self._own is None:
                    return
                new = (self._fields, self._own)
            fields, own = new
            self._fields = fields
            if not self.available or self._closed:
                self._set_own(own)
                return
            try:
                await self._publish(fields, own)
            except Exception as exc:
                if self._browser is not None:
                    self._browser.warn_once("mdns_announce_failed", f"error={exc!r}")

    async def _publish(self, fields: dict[str, str], own: Announcement) -> None:
        assert self._azc is not None
        properties = self._auth.sign_fields(fields)
        label = discovery.instance_name(self.session, self.host)
        info = AsyncServiceInfo(
            SERVICE_TYPE,
            self._info.name if self._info is not None else f"{label}.{SERVICE_TYPE}",
            port=self.peer_port,
            properties=properties,
            server=f"{label}.local.",
            parsed_addresses=list(own.addresses),
        )
        if self._info is not None:
            # Same name, new records: zeroconf replaces the registration and re-announces.
            self._info = info
            await self._azc.async_update_service(info)
        else:
            # Two nodes claiming one name (same session and host) would otherwise make
            # registration fail; zeroconf probes (RFC 6762 §8.1) and appends "-2", "-3".
            await self._azc.async_register_service(info, allow_name_change=True)
            self._info = info
            self.instance = _instance_label(info.name)
            if self.instance != label:
                log.warning(
                    "mdns_name_conflict instance=%s renamed=%s remedy=%s",
                    label,
                    self.instance,
                    "give every node a distinct host name",
                )
        self._set_own(replace(own, instance=self.instance or own.instance))

    def _set_own(self, own: Announcement) -> None:
        if self._own != own:
            self._own = own
            self._changed()

    async def _refresh(self) -> None:
        # Signed TXT records carry a timestamp; re-sign well within the verifier's skew
        # window so a node that starts browsing later still gets a fresh signature, and drop
        # peers whose signature went stale: they stopped refreshing without a goodbye.
        while True:
            await asyncio.sleep(self._refresh_s)
            if self._browser is not None:
                self._browser.expire_stale()
            try:
                await self._announce(None)
            except Exception as exc:
                log.warning("mdns_refresh_failed error=%r", exc)

    def peers(self) -> list[Announcement]:
        """Valid announcements of our session, this node's own included, sorted by host."""
        found = dict(self._browser.accepted) if self._browser is not None else {}
        if self._own is not None:
            found[""] = self._own
        return sorted(found.values(), key=lambda a: (a.host, a.instance))

    @property
    def rejections(self) -> dict[str, int]:
        """Announcements dropped, by reason: malformed, session, host, signature."""
        return dict(self._browser.rejections) if self._browser is not None else {}

    @property
    def rejected(self) -> int:
        """Announcements dropped (malformed, wrong session, unknown host, bad signature)."""
        return sum(self.rejections.values())

    @property
    def recent_rejections(self) -> list[tuple[str, str]]:
        """The latest rejected announcements as (instance, reason), oldest first."""
        return list(self._browser.recent_rejections) if self._browser is not None else []

    @property
    def seen_any(self) -> bool:
        """Whether any other node's announcement arrived (False on networks that drop multicast)."""
        return self._browser is not None and self._browser.seen_any

    def status(self) -> dict[str, Any]:
        """Counters for /status and /metrics."""
        return {
            "available": self.available,
            "instance": self.instance,
            "seen_any": self.seen_any,
            "peers": len(self.peers()),
            "rejected": self.rejected,
            "rejections": self.rejections,
            "recent_rejections": [list(item) for item in self.recent_rejections],
        }

    async def close(self) -> None:
        """Send the goodbye (TTL 0, RFC 6762 §10.1) and stop; closing twice is safe."""
        if self._closed:
            return
        self._closed = True
        self.available = False
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        await self._close_zeroconf()

    async def _close_zeroconf(self) -> None:
        try:
            if self._browser is not None:
                await self._browser.stop()
            if self._azc is not None:
                await self._azc.async_unregister_all_services()
                await self._azc.async_close()
        except Exception as exc:
            log.warning("mdns_close_failed error=%r", exc)
        finally:
            self._azc = None


async def browse(
    seconds: float,
    *,
    interfaces: Sequence[str] = (),
    auth: Authenticator | None = None,
    request_timeout_s: float = 2.0,
) -> list[Announcement]:
    """Every well-formed announcement seen within `seconds`, any session, by session and host.

    With an enabled `auth`, each announcement's `verified` says whether its signature
    checked out; nothing is dropped for a bad signature here (this is a debugging view).
    """
    choice = resolve_interfaces(interfaces)
    async with open_zeroconf(choice) as azc:
        browser = _Browser(
            azc,
            auth=auth,
            judge=lambda _announcement: None,
            on_change=lambda: None,
            own_instance=lambda: None,
            request_timeout_s=min(request_timeout_s, seconds),
        )
        browser.start()
        try:
            await asyncio.sleep(seconds)
        finally:
            await browser.stop()
        found = list(browser.accepted.values())
    return sorted(found, key=lambda a: (a.session, a.host, a.instance))
