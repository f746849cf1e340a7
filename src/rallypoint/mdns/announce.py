"""This node's announcement and its view of the session's peers (Mdns); degrades, never crashes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from msgspec.structs import replace
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

from rallypoint.core.lifecycle import AsyncResource
from rallypoint.mdns import txt
from rallypoint.mdns.browse import BAD_SIGNATURE, UNKNOWN_HOST, WRONG_SESSION, Browser
from rallypoint.mdns.interfaces import open_zeroconf, resolve_interfaces
from rallypoint.mdns.txt import SERVICE_TYPE, Announcement, instance_label

if TYPE_CHECKING:
    from rallypoint.auth import Authenticator

__all__ = ["Mdns"]

log = logging.getLogger(__name__)


class Mdns(AsyncResource):
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
        self._browser: Browser | None = None
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

    async def start(self) -> None:
        """Open zeroconf on the chosen interfaces and start browsing; idempotent."""
        if self._started or self._closed:
            return
        self._started = True
        try:
            choice = resolve_interfaces(self._interfaces)
            self._azc = open_zeroconf(choice)
            self._browser = Browser(
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
                "mdns_unavailable",
                extra={"error": repr(exc), "remedy": "peers still rendezvous over HTTP"},
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
        fields, own = txt.encode_fields(
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
                    self._browser.warn_once("mdns_announce_failed", error=repr(exc))

    async def _publish(self, fields: dict[str, str], own: Announcement) -> None:
        assert self._azc is not None
        properties = self._auth.sign_fields(fields)
        label = txt.instance_name(self.session, self.host)
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
            self.instance = instance_label(info.name)
            if self.instance != label:
                log.warning(
                    "mdns_name_conflict",
                    extra={
                        "instance": label,
                        "renamed": self.instance,
                        "remedy": "give every node a distinct host name",
                    },
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
                log.warning("mdns_refresh_failed", extra={"error": repr(exc)})

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
            log.warning("mdns_close_failed", extra={"error": repr(exc)})
        finally:
            self._azc = None
