"""Who may join the master, and signed peer messages: refusals, bad signatures, counters.

Sidecars of one session in one event loop on loopback ports (tests/support/cluster/inprocess.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import aiohttp
import pytest

from rallypoint.auth import Authenticator
from rallypoint.errors import AuthError
from rallypoint.reasons import auth_reason
from tests.support.cluster.inprocess import (
    SESSION,
    cluster,
    codes,
    ready_cluster,
    start_all,
    until,
)


def _join_body(rank: int, host: str, session: str = SESSION) -> bytes:
    body = {"session": session, "rank": rank, "host": host, "addresses": [], "tf_port": None}
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("signer", "replay", "reason"),
    [
        (None, False, "unsigned"),
        ("wrong-secret", False, "bad_signature"),
        ("s3cret", True, "replayed"),
    ],
    ids=["unsigned", "wrong-token", "replayed"],
)
async def test_bad_signatures_are_rejected_and_counted(
    signer: str | None, replay: bool, reason: str
) -> None:
    async with ready_cluster(2, token="s3cret") as c:
        body = _join_body(1, "node1")
        headers = {"Content-Type": "application/json"}
        if signer is not None:
            headers.update(Authenticator(signer).sign("POST /v1/join", body))
        async with aiohttp.ClientSession() as http:
            url = c.peer_url(0, "/v1/join")
            if replay:
                async with http.post(url, data=body, headers=headers) as first:
                    assert first.status == 200
            async with http.post(url, data=body, headers=headers) as resp:
                assert resp.status == 401
                assert (await resp.json())["code"] == "auth_failed"
        metrics = c.nodes[0].metrics
        assert metrics.value("rallypoint_auth_failures_total", reason=reason) == 1


async def test_a_worker_with_the_wrong_token_is_not_ready() -> None:
    async with cluster(2, token="s3cret", per_node={1: {"token": "other"}}) as c:
        await start_all(c)
        await until(lambda: "auth_failed" in codes(c.nodes[1]))
        assert not c.nodes[0].node.readiness.ready
        assert c.nodes[0].metrics.value("rallypoint_auth_failures_total", reason="bad_signature")


@pytest.mark.parametrize(
    ("rank", "host", "session", "status", "code"),
    [
        (1, "evil", SESSION, 403, "impostor"),
        (1, "node1", "other-session", 409, "session_mismatch"),
        (5, "node5", SESSION, 400, "rank_out_of_range"),
    ],
)
async def test_master_refuses_foreign_joins(
    rank: int, host: str, session: str, status: int, code: str
) -> None:
    async with cluster(2) as c:
        await c.start(0)
        async with (
            aiohttp.ClientSession() as http,
            http.post(c.peer_url(0, "/v1/join"), data=_join_body(rank, host, session)) as resp,
        ):
            assert resp.status == status
            assert (await resp.json())["code"] == code
        assert not c.nodes[0].node.peers[1].joined
        assert c.nodes[0].metrics.value("rallypoint_joins_total", result="rejected") == 1


async def test_a_worker_refuses_joins() -> None:
    async with cluster(2) as c:
        await c.start(1)
        async with (
            aiohttp.ClientSession() as http,
            http.post(c.peer_url(1, "/v1/join"), data=_join_body(1, "node1")) as resp,
        ):
            assert resp.status == 409
            assert (await resp.json())["code"] == "not_master"


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("bad signature", "unsigned"),
        ("unsigned, replayed", "stale"),
        ("", "malformed"),
        ("clock", "bad_signature"),
    ],
)
def test_auth_metric_labels_come_from_the_error_not_its_text(message: str, reason: str) -> None:
    assert auth_reason(AuthError(message, reason=reason)) == reason


def _stale_headers(body: bytes) -> dict[str, str]:
    ten_minutes_ago = Authenticator("s3cret", clock=lambda: time.time() - 600)
    return ten_minutes_ago.sign("POST /v1/join", body)


def _malformed_headers(body: bytes) -> dict[str, str]:
    headers = Authenticator("s3cret").sign("POST /v1/join", body)
    return {**headers, "X-Rallypoint-Nonce": "not-hex"}


@pytest.mark.parametrize(
    ("sign", "reason"),
    [(_stale_headers, "stale"), (_malformed_headers, "malformed")],
    ids=["stale", "malformed"],
)
async def test_stale_and_malformed_signatures_are_counted(
    sign: Callable[[bytes], dict[str, str]], reason: str
) -> None:
    async with cluster(2, token="s3cret") as c:
        await c.start(0)
        body = _join_body(1, "node1")
        async with (
            aiohttp.ClientSession() as http,
            http.post(c.peer_url(0, "/v1/join"), data=body, headers=sign(body)) as resp,
        ):
            assert resp.status == 401
        metrics = c.nodes[0].metrics
        assert metrics.value("rallypoint_auth_failures_total", reason=reason) == 1


async def test_a_worker_counts_the_masters_refusal_of_its_signature() -> None:
    async with cluster(2, token="s3cret", per_node={1: {"token": "other"}}) as c:
        await start_all(c)
        metrics = c.nodes[1].metrics
        await until(lambda: metrics.value("rallypoint_auth_failures_total", reason="refused") > 0)
