"""Browsing: resolve each announced instance, parse its TXT record, keep what is judged valid."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from msgspec.structs import replace
from zeroconf import DNSQuestionType, ServiceStateChange, Zeroconf
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from rallypoint.errors import AuthError, PeerMessageError
from rallypoint.mdns import txt
from rallypoint.mdns.interfaces import open_zeroconf, resolve_interfaces
from rallypoint.mdns.txt import SERVICE_TYPE, Announcement, instance_label

if TYPE_CHECKING:
    from rallypoint.auth import Authenticator

__all__ = ["Browser", "browse"]

log = logging.getLogger(__name__)

#: How often an instance that nobody answered for is asked again before it is left alone.
RESOLVE_ATTEMPTS = 3

# Rejection reasons, the keys of Mdns.rejections.
MALFORMED, WRONG_SESSION, UNKNOWN_HOST, BAD_SIGNATURE = "malformed", "session", "host", "signature"


class Browser:
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

    def warn_once(self, event: str, **fields: object) -> None:
        """Log a repeated problem at warning once, then at debug (zeroconf's QuietLogger)."""
        level = logging.DEBUG if event in self._warned else logging.WARNING
        self._warned.add(event)
        log.log(level, event, extra=fields)

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
            self.warn_once("mdns_callback_failed", instance=name, error=repr(exc))

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
            self.warn_once("mdns_resolve_failed", instance=name, error=repr(exc))
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
        instance = instance_label(name)
        try:
            parsed, fields = txt.parse_fields(info.properties, instance=instance)
        except PeerMessageError as exc:
            self.warn_once("mdns_rejected_malformed", instance=instance, error=str(exc))
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
        self.recent_rejections.append((instance_label(name), reason))
        log.debug("mdns_rejected", extra={"instance": name, "reason": reason})
        self._drop(name)

    def _drop(self, name: str) -> None:
        self._fields.pop(name, None)
        if self.accepted.pop(name, None) is not None:
            self._changed()

    def expire_stale(self) -> None:
        """Drop accepted peers whose signature is no longer fresh."""
        for name, fields in list(self._fields.items()):
            if self._verify(fields) is False:
                log.info("mdns_peer_expired", extra={"instance": name})
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
            self.warn_once("mdns_on_change_failed", error=repr(exc))


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
        browser = Browser(
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
