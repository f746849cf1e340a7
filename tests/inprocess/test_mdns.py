"""Several Mdns instances in one process, talking real mDNS over loopback multicast only."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AsyncExitStack

import pytest

from rallypoint.auth import Authenticator
from rallypoint.mdns import txt
from rallypoint.mdns.announce import Mdns
from rallypoint.mdns.browse import browse
from rallypoint.mdns.ranks import assign_ranks
from tests.support.mdns import rogues

LOOPBACK = ["127.0.0.1"]
WAIT_S = 20.0


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll until condition holds; fail naming `what` after WAIT_S (a deadline, not speed)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not condition():
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def hosts(mdns: Mdns) -> set[str]:
    return {a.host for a in mdns.peers()}


def signed(auth: Authenticator, session: str, host: str) -> dict[str | bytes, str | bytes | None]:
    """The TXT record a node of `session` on `host` announces, signed with `auth`."""
    fields, _ = txt.encode_fields(
        session=session, host=host, rank=-1, peer_port=7781, generation="", addresses=["10.9.0.1"]
    )
    record: dict[str | bytes, str | bytes | None] = {}
    record.update(auth.sign_fields(fields))
    return record


async def test_peers_see_each_other_update_and_say_goodbye(
    multicast_lo: None, session: str
) -> None:
    changes: list[int] = []
    async with AsyncExitStack() as stack:
        nodes = [
            await stack.enter_async_context(
                Mdns(
                    session=session,
                    host=host,
                    peer_port=7781 + i,
                    auth=Authenticator("s3cret"),
                    interfaces=LOOPBACK,
                    on_change=(lambda: changes.append(1)) if i == 0 else None,
                )
            )
            for i, host in enumerate(["node-a", "node-b", "node-c"])
        ]
        a, b, c = nodes
        assert a.available
        await asyncio.gather(
            *(
                n.announce(rank=-1, generation="", addresses=[f"10.9.0.{i}"])
                for i, n in enumerate(nodes)
            )
        )
        everyone = {"node-a", "node-b", "node-c"}
        await wait_for(lambda: all(hosts(n) == everyone for n in nodes), "3 peers on every node")
        seen_b = next(p for p in a.peers() if p.host == "node-b")
        assert (seen_b.session, seen_b.peer_port, seen_b.addresses) == (
            session,
            7782,
            ("10.9.0.1",),
        )
        assert seen_b.verified is True
        assert a.seen_any
        assert changes

        # Same ranks everywhere without talking: every node derives the same order.
        orders = {assign_ranks(n.peers(), 3) for n in nodes}
        assert orders == {("node-a", "node-b", "node-c")}

        await b.announce(rank=1, generation="gen-2", addresses=["10.9.0.1"])
        await wait_for(
            lambda: any(p.generation == "gen-2" and p.rank == 1 for p in c.peers()),
            "the generation update to reach node-c",
        )

        before = len(changes)
        await b.close()
        await b.close()  # closing twice is safe
        await wait_for(lambda: hosts(a) == {"node-a", "node-c"}, "node-b's goodbye")
        assert len(changes) > before
        # None of our own announcements was refused. (Strangers on this host's loopback,
        # another rallypoint of the user's among them, are refused by session: not ours.)
        ours = {n.instance for n in nodes}
        assert [r for r in a.recent_rejections if r[0] in ours] == []


async def test_wrong_session_bad_signature_and_unknown_host_are_rejected(
    multicast_lo: None, session: str
) -> None:
    auth = Authenticator("s3cret")
    async with Mdns(
        session=session,
        host="node-a",
        peer_port=7781,
        auth=auth,
        interfaces=LOOPBACK,
        allowed_hosts={"node-a", "node-b", "node-c"},
    ) as a:
        await a.announce(rank=-1, generation="", addresses=["10.9.0.1"])
        forged = signed(Authenticator("other"), session, "node-b")
        unsigned = {k: v for k, v in signed(auth, session, "node-b").items() if k != "sig"}
        async with rogues(
            signed(auth, "another-session", "node-c"),
            forged,
            signed(auth, session, "intruder"),
            unsigned,
            signed(auth, session, "node-c"),
        ) as labels:
            expected = set(
                zip(labels[:4], ["session", "signature", "host", "signature"], strict=True)
            )
            good = labels[4]
            await wait_for(lambda: expected <= set(a.recent_rejections), "4 rejections")
            await wait_for(lambda: "node-c" in hosts(a), "the valid announcer")
            assert good in {p.instance for p in a.peers()}
            assert hosts(a) == {"node-a", "node-c"}
            assert a.rejected >= 4
            assert a.rejections["signature"] >= 2


MALFORMED: dict[str, dict[str | bytes, str | bytes | None]] = {
    "missing-fields": {"v": "1", "session": "{s}"},
    "rank-not-int": {"v": "1", "session": "{s}", "host": "h", "rank": "x", "port": "1", "gen": ""},
    "port-not-int": {
        "v": "1",
        "session": "{s}",
        "host": "h",
        "rank": "0",
        "port": "1e3",
        "gen": "",
    },
    "not-utf8": {b"v": b"1", b"session": b"{s}", b"host": b"\xff\xfe"},
    "valueless-keys": {"session": None, "host": None},
    "oversized": {f"k{i}": "x" * 200 for i in range(12)},
    "empty-txt": {},
}


async def test_malformed_announcements_are_counted_never_raised(
    multicast_lo: None, session: str
) -> None:
    records = [
        {k: v.replace("{s}", session) if isinstance(v, str) else v for k, v in props.items()}
        for props in MALFORMED.values()
    ]
    async with Mdns(
        session=session,
        host="node-a",
        peer_port=7781,
        auth=Authenticator(None),
        interfaces=LOOPBACK,
    ) as a:
        await a.announce(rank=-1, generation="", addresses=["10.9.0.1"])
        async with rogues(*records, signed(Authenticator(None), session, "node-b")) as labels:
            bad = dict(zip(labels, MALFORMED, strict=False))

            def missing() -> list[str]:
                return [case for label, case in bad.items()
                        if (label, "malformed") not in a.recent_rejections]  # fmt: skip

            await wait_for(lambda: not missing(), "every malformed announcement's rejection")
            # The browser survived the bad records: a valid announcer is still accepted.
            await wait_for(lambda: "node-b" in hosts(a), "the valid announcer")
            assert not set(bad) & {p.instance for p in a.peers()}
            # Each record is counted once, however often zeroconf repeats it. (Records
            # without a session are malformed to every listener: another test run on this
            # host can add its own to the count, never to our instances.)
            ours = [label for label, _ in a.recent_rejections if label in bad]
            assert sorted(ours) == sorted(bad), a.recent_rejections
            assert a.rejections.get("malformed", 0) >= len(MALFORMED)


async def test_stale_signatures_are_rejected_and_expire(multicast_lo: None, session: str) -> None:
    offset = [0.0]
    skewed = Authenticator("s3cret", max_skew_s=30.0, clock=lambda: time.time() + offset[0])
    async with (
        Mdns(
            session=session,
            host="node-a",
            peer_port=7781,
            auth=skewed,
            interfaces=LOOPBACK,
            refresh_s=0.2,
        ) as a,
        Mdns(
            session=session,
            host="node-b",
            peer_port=7782,
            auth=Authenticator("s3cret"),
            interfaces=LOOPBACK,
        ) as b,
    ):
        await asyncio.gather(
            a.announce(rank=-1, generation="", addresses=["10.9.0.1"]),
            b.announce(rank=-1, generation="", addresses=["10.9.0.2"]),
        )
        await wait_for(lambda: "node-b" in hosts(a), "node-b")
        # node-b's signature is now 100 s old as node-a's clock sees it.
        offset[0] = 100.0
        await wait_for(lambda: "node-b" not in hosts(a), "node-b's stale signature to expire")


async def test_name_conflict_gets_a_new_instance_name(multicast_lo: None, session: str) -> None:
    async with (
        Mdns(session=session, host="twin", peer_port=7781, auth=Authenticator(None),
             interfaces=LOOPBACK) as first,
        Mdns(session=session, host="twin", peer_port=7782, auth=Authenticator(None),
             interfaces=LOOPBACK) as second,
    ):  # fmt: skip
        await first.announce(rank=-1, generation="", addresses=["10.9.0.1"])
        await second.announce(rank=-1, generation="", addresses=["10.9.0.2"])
        label = txt.instance_name(session, "twin")
        assert first.instance == label
        assert second.instance is not None
        assert second.instance.startswith(label)
        assert second.instance != label
        await wait_for(lambda: second.instance in {p.instance for p in first.peers()}, "the twin")


@pytest.mark.parametrize("interfaces", [["no-such-if0"], ["192.0.2.77"]])
async def test_startup_failure_degrades(interfaces: list[str], session: str) -> None:
    mdns = Mdns(
        session=session,
        host="node-a",
        peer_port=7781,
        auth=Authenticator(None),
        interfaces=interfaces,
    )
    async with mdns:
        assert not mdns.available
        await mdns.announce(rank=0, generation="g", addresses=["10.9.0.1"])
        assert [p.host for p in mdns.peers()] == ["node-a"]
        assert not mdns.seen_any
        assert mdns.status()["available"] is False
    await mdns.close()


async def test_browse_reports_every_session_and_signature(multicast_lo: None, session: str) -> None:
    auth = Authenticator("s3cret")
    async with rogues(
        signed(auth, session, "node-a"),
        signed(auth, f"{session}-x", "node-b"),
        signed(Authenticator("wrong"), session, "node-c"),
    ) as (good, other, forged):
        found = await browse(3.0, interfaces=LOOPBACK, auth=auth)
    mine = {a.instance: a for a in found if a.session.startswith(session)}
    assert {i: a.verified for i, a in mine.items()} == {good: True, other: True, forged: False}
    assert mine[other].session == f"{session}-x"
