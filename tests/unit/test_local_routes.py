"""The local API's route table (localapi.py) is what the server registers, what the docs
list and what the client calls by: one row per route, nowhere else."""

from __future__ import annotations

import re
from pathlib import Path
from typing import cast

import pytest
import yaml

from rallypoint import localapi
from rallypoint.auth import LOCAL_PROOF_HEADER, Authenticator
from rallypoint.cli import client
from rallypoint.errors import NotReady, SidecarError, WriteRefused
from rallypoint.rendezvous.node import Rendezvous
from rallypoint.server.local import local_app

DOCS = Path(__file__).resolve().parents[2] / "docs"
TABLE = {(route.method, route.path) for route in localapi.ROUTES}


def test_the_table_names_each_route_once() -> None:
    assert len(TABLE) == len(localapi.ROUTES)
    assert len({route.handler for route in localapi.ROUTES}) == len(localapi.ROUTES)
    # A write takes JSON and proves the token; every write is a POST, every POST a write.
    assert {r.path for r in localapi.ROUTES if r.write} == {"/job", "/job/progress"}
    assert all(r.write == (r.method == "POST") for r in localapi.ROUTES)


def test_the_server_registers_exactly_the_table() -> None:
    app = local_app(cast(Rendezvous, object()))
    registered = {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None and route.method != "HEAD"
    }
    assert registered == TABLE


def test_docs_api_lists_exactly_the_table() -> None:
    text = (DOCS / "api.md").read_text()
    local = text.split("## Local API", 1)[1].split("## Peer API", 1)[0]
    listed = {
        (method, path)
        for method, path in re.findall(r"^\| `(GET|POST) (/[a-z/]*)[?`]", local, re.MULTILINE)
    }
    assert listed == TABLE


def test_openapi_lists_exactly_the_table() -> None:
    spec = yaml.safe_load((DOCS / "openapi.yaml").read_text())
    documented = {
        (method.upper(), path)
        for path, item in spec["paths"].items()
        for method, operation in item.items()
        if "local" in operation.get("tags", [])
    }
    assert documented == TABLE


class Recorder:
    """client.get's stand-in: records each request and answers with a canned Answer."""

    def __init__(self, answer: client.Answer) -> None:
        self.answer = answer
        self.seen: list[tuple[str, bytes | None, str | None]] = []

    def __call__(
        self,
        base_url: str,
        path: str,
        *,
        timeout_s: float,
        body: bytes | None = None,
        proof: str | None = None,
    ) -> client.Answer:
        self.seen.append((path, body, proof))
        return self.answer


def test_the_client_calls_by_the_table_and_sends_the_proof_on_writes_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = Recorder(client.Answer(200, '{"ready": true}'))
    monkeypatch.setattr(client, "get", recorder)
    client.status("http://x", timeout_s=1)
    client.job("http://x", after=3, wait_s=1.5)
    client.report_job("http://x", b"{}", proof="p")
    assert recorder.seen == [
        ("/status", None, None),
        ("/job?after=3&wait=1.500", None, None),
        ("/job", b"{}", "p"),
    ]
    # A read never carries the proof, even when handed one.
    client.call("http://x", localapi.STATUS, timeout_s=1, proof="p")
    assert recorder.seen[-1] == ("/status", None, None)


@pytest.mark.parametrize(
    ("route", "status", "error"),
    [
        (localapi.ENV, 503, NotReady),
        (localapi.JOB_REPORT, 403, WriteRefused),
        (localapi.JOB, 503, SidecarError),  # /job's 503 is discovery, not readiness
        (localapi.STATUS, 404, SidecarError),
    ],
)
def test_the_answers_every_route_shares_are_read_once(
    monkeypatch: pytest.MonkeyPatch, route: localapi.LocalRoute, status: int, error: type
) -> None:
    body = '{"error": "this sidecar has a session token", "ready": false, "reasons": []}'
    monkeypatch.setattr(client, "get", Recorder(client.Answer(status, body)))
    with pytest.raises(error) as caught:
        client.call("http://x", route, timeout_s=1, body=b"{}")
    assert "\n" not in str(caught.value)


def test_the_client_s_proof_header_is_the_one_the_server_reads() -> None:
    # client.get spells the header out (it must not import auth: `check` stays light).
    source = Path(client.__file__).read_text()
    assert f'"{LOCAL_PROOF_HEADER}", f"Bearer {{proof}}"' in source
    assert len(Authenticator("t").local_proof()) == 64
