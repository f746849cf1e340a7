"""Secrets and exposure: nothing from the container's environment leaks through any route or log.

A real `rallypoint serve` runs with secret-looking variables and a session token in its
environment, at the most verbose log level. Every route of both APIs is exercised, in
success and error cases; no answer and no log line may carry a planted value, and the
peer API may carry no env data beyond the cluster document's hosts, addresses and ports.
"""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint import wire
from rallypoint.auth import Authenticator
from rallypoint.model import Member
from tests.hardening.harness import Reply, request
from tests.hardening.serve import EXIT_BOUND_S, Serve

MARK = uuid.uuid4().hex[:12]
TOKEN = f"rp-session-secret-{MARK}"
PLANTED = {
    "AWS_SECRET_ACCESS_KEY": f"wJalrXUtnFEMI/K7MDENG/bPxRfiCY{MARK}",
    "AWS_ACCESS_KEY_ID": f"AKIA{MARK.upper()}",
    "GITHUB_TOKEN": f"ghp_{MARK}{MARK}abcd",
    "HF_TOKEN": f"hf_{MARK}",
    "PASSWORD": f"hunter2-{MARK}",
    "DATABASE_URL": f"postgres://svc:pw-{MARK}@db.internal/prod",
    "WANDB_API_KEY": f"wandb-{MARK}",
}
ENV_KEYS = (b"MASTER_ADDR", b"MASTER_PORT", b"TF_CONFIG", b"WORLD_SIZE", b"NODE_RANK", b"PET_")
DOC_KEYS = {"session", "generation", "master_host", "master_port", "members"}
MEMBER_KEYS = {"rank", "host", "addresses", "tf_port", "probe_port", "jax_port"}


class SecretServe(Serve):
    """A single-node, ready `rallypoint serve` with secrets planted in its environment."""

    log_format = "text"

    def environ(self) -> dict[str, str]:
        env = super().environ()
        env.update(PLANTED)
        env.update(
            RALLYPOINT_HOSTS=self.name,
            RALLYPOINT_TOKEN=TOKEN,
            RALLYPOINT_VERBOSE="1",
            RALLYPOINT_LOG_FORMAT=self.log_format,
            RALLYPOINT_ALLOW_LOOPBACK="1",
        )
        return env


@pytest.fixture(params=["text", "json"])
def secret_serve(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SecretServe]:
    s = SecretServe(tmp_path)
    s.log_format = request.param
    yield s
    s.stop_all()


def exercise(serve: SecretServe) -> tuple[list[tuple[str, Reply]], list[tuple[str, Reply]]]:
    """Every route, in success and error cases: (local answers, peer answers)."""
    local = [
        (target, request(serve.local_port, "GET", target))
        for target in (
            "/env?wait=20",
            "/env?format=sh",
            "/env?format=dotenv",
            "/env?format=xml",
            "/env?wait=soon",
            "/env?verbose=1",
            "/readyz",
            "/livez",
            "/status",
            "/mesh",
            "/metrics",
            "/nope",
        )
    ]
    local.append(("POST /env", request(serve.local_port, "POST", "/env", body=b"{}")))
    signer = Authenticator(TOKEN)
    peer: list[tuple[str, Reply]] = []
    port = serve.peer_port
    for path in ("/v1/ready", "/v1/cluster"):
        peer.append((path + " unsigned", request(port, "GET", path)))
        context = "GET /v1/cluster?after=" if path == "/v1/cluster" else f"GET {path}"
        peer.append((path, request(port, "GET", path, headers=signer.sign(context, b""))))
    join = wire.encode_join(
        wire.JoinRequest(serve.name, Member(1, "intruder", ("127.0.0.1",), None))
    )
    peer.append(
        (
            "join signed",
            request(
                port, "POST", "/v1/join", body=join, headers=signer.sign("POST /v1/join", join)
            ),
        )
    )
    peer.append(("join unsigned", request(port, "POST", "/v1/join", body=join)))
    peer.append(
        (
            "join junk",
            request(
                port,
                "POST",
                "/v1/join",
                body=b"\xff{",
                headers=signer.sign("POST /v1/join", b"\xff{"),
            ),
        )
    )
    poke = wire.encode_poke(wire.Poke(serve.name, "e1"))
    peer.append(
        (
            "poke",
            request(
                port, "POST", "/v1/poke", body=poke, headers=signer.sign("POST /v1/poke", poke)
            ),
        )
    )
    return local, peer


def test_no_secret_in_any_answer_or_log_line(secret_serve: SecretServe) -> None:
    proc = secret_serve.start()
    local, peer = exercise(secret_serve)
    env_reply = dict(local)["/env?wait=20"]
    assert env_reply.status == 200, env_reply.body
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(EXIT_BOUND_S + 5) == 0
    log = secret_serve.log(-1)
    assert "listening" in log, "the log was not captured"
    secrets = {**PLANTED, "RALLYPOINT_TOKEN": TOKEN}
    for what, reply in [*local, *peer]:
        blob = reply.body + repr(reply.headers).encode()
        for name, value in secrets.items():
            assert value.encode() not in blob, f"{name}'s value leaked in {what}"
            assert name.encode() not in blob or name == "RALLYPOINT_TOKEN", f"{name} in {what}"
    for name, value in secrets.items():
        assert value not in log, f"{name}'s value leaked into the log"
        # Also the token's significant part, in case it is logged truncated or quoted.
        assert value[-12:] not in log, f"part of {name}'s value leaked into the log"


def test_peer_api_carries_no_env_data(secret_serve: SecretServe) -> None:
    secret_serve.start()
    local, peer = exercise(secret_serve)
    env = json.loads(dict(local)["/env?wait=20"].body)
    tf_config = env.get("TF_CONFIG", "")
    answers = dict(peer)
    assert json.loads(answers["/v1/ready"].body) == {"ready": True}
    doc = json.loads(answers["/v1/cluster"].body)
    assert set(doc) == DOC_KEYS
    assert all(set(member) == MEMBER_KEYS for member in doc["members"])
    for what, reply in peer:
        for key in ENV_KEYS:
            assert key not in reply.body, f"{key!r} in the peer answer {what}"
        if tf_config:
            assert tf_config.encode() not in reply.body, f"TF_CONFIG in the peer answer {what}"
