"""The local API's route table (localapi.py) is what the server registers, what the docs
list and what the client calls by: one row per route, nowhere else."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest
import yaml

from rallypoint import localapi
from rallypoint.auth import LOCAL_PROOF_HEADER, Authenticator
from rallypoint.cli import client
from rallypoint.core.jobs import JobState
from rallypoint.core.progress import Mark
from rallypoint.errors import HostfileError, NotReady, SidecarError, WriteRefused
from rallypoint.reasons import Reason
from rallypoint.rendezvous.node import Rendezvous
from rallypoint.served import render
from rallypoint.server.common import error_response, json_answer
from rallypoint.server.local import local_app
from rallypoint.wire import jobstates, local

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


# --- the answers: one type per JSON row, the server's bytes decoded by the client ---------

#: The answer kinds that carry JSON (/env's in its default format).
JSON_KINDS = ("json", "env")


def untyped(routes: tuple[localapi.LocalRoute[Any], ...]) -> list[str]:
    """The JSON rows that name no answer type, and the other rows that name one."""
    return [r.context for r in routes if (r.answer in JSON_KINDS) != (r.body is not None)]


def test_every_json_row_names_its_answer_type() -> None:
    assert untyped(localapi.ROUTES) == []
    assert localapi.JOB.body is localapi.JOB_REPORT.body is jobstates.JobView
    assert localapi.STATUS.body is local.StatusView


def test_a_row_without_its_type_is_found() -> None:
    planted = localapi.LocalRoute("GET", "/planted", "planted")
    assert untyped((*localapi.ROUTES, planted)) == ["GET /planted"]


NOW = 1_000.0
FAILED = JobState(2, "sub2", "exited", 990.0, 995.5, code=3, detail="RuntimeError: x", attempt=1)
WAITING = JobState(0, "main1", "waiting")


def job_view() -> jobstates.JobView:
    mark = Mark(2, 1, 994.0, step=11, phase="data")
    progress = jobstates.ProgressView(
        1, 2, (jobstates.ShownMark.of(mark, ("main1", "sub1", "sub2"), NOW),),
        behind="sub2 (rank 2) is behind",
    )  # fmt: skip
    shown = jobstates.ShownState.of(FAILED, NOW)
    return jobstates.JobView(
        True, 7, "boot", 0, "main1", 1, jobstates.ShownState.of(WAITING, NOW), None, shown,
        (shown,), True, 0.5, {"waiting": 1, "exited": 1}, (shown,), progress,
    )  # fmt: skip


def served(answer: object, status: int = 200) -> client.Answer:
    """What the server writes for ``answer`` (server/common.json_answer), as the client reads it."""
    response = json_answer(answer, status)
    assert isinstance(response.body, bytes)
    return client.Answer(response.status, response.body.decode())


def test_a_shown_state_keeps_the_local_api_s_json_and_reads_back_as_its_state() -> None:
    shown = jobstates.ShownState.of(FAILED, NOW)
    assert json.loads(served(shown).body) == {
        "rank": 2, "host": "sub2", "state": "exited", "what": "exited 3: RuntimeError: x",
        "started": 990.0, "since": 995.5, "code": 3, "signal": None, "signal_name": None,
        "detail": "RuntimeError: x", "attempt": 1, "ago_s": 4.5,
    }  # fmt: skip
    assert shown.job == FAILED
    # Zero times and an empty detail are shown as null, and read back as the defaults.
    waiting = jobstates.ShownState.of(WAITING)
    written = served(waiting).body
    assert json.loads(written)["started"] is None and "ago_s" not in written
    assert waiting.job == WAITING


@pytest.mark.parametrize(
    ("route", "answer"),
    [
        (localapi.JOB, job_view()),
        (localapi.JOB_REPORT, job_view()),
        (localapi.JOB, jobstates.JobView(version=3)),
        (localapi.STATUS, local.StatusView(True, (Reason("a", "m"),), "g1", "master")),
        (localapi.ENV, {"MASTER_ADDR": "main1", "WORLD_SIZE": "2"}),
        (localapi.MESH, {"counts": {"passed": 2}, "nnodes": 2}),
    ],
)
def test_the_client_decodes_what_the_server_writes(
    route: localapi.LocalRoute[Any], answer: object
) -> None:
    assert route.body is not None
    assert client.decode("http://x", route, served(answer), route.body) == answer


def test_the_job_section_of_status_decodes_before_the_node_list_is_known() -> None:
    doc = {"ready": False, "role": "discovering", "job": jobstates.JOBS_UNKNOWN}
    view = client.decode("http://x", localapi.STATUS, served(doc), local.StatusView)
    assert view.job == jobstates.JobView() and view.spec is msgspec.UNSET
    assert json.loads(served(jobstates.JOBS_UNKNOWN).body) == {
        "carried": False, "version": 0, "first": None, "stop": False,
    }  # fmt: skip


def test_the_env_the_server_renders_decodes_as_the_env() -> None:
    body = render.render_bytes((("RANK", "0"),), "json").decode()
    assert client.env_values(body) == {"RANK": "0"}


def test_a_not_ready_answer_and_a_refusal_decode_into_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reasons = (Reason("waiting_for_join", "1 of 2 nodes have not joined yet: n1", ranks=(1,)),)
    monkeypatch.setattr(client, "get", Recorder(served(local.NotReadyAnswer(False, reasons), 503)))
    with pytest.raises(NotReady) as not_ready:
        client.fetch_env("http://x")
    assert not_ready.value.reasons == (
        {"code": "waiting_for_join", "message": reasons[0].message, "ranks": [1]},
    )
    no_hostfile = error_response(409, "PET_NPROC_PER_NODE=gpu has no slot count", "no_hostfile")
    assert isinstance(no_hostfile.body, bytes)
    monkeypatch.setattr(client, "get", Recorder(client.Answer(409, no_hostfile.body.decode())))
    with pytest.raises(HostfileError, match=r"^PET_NPROC_PER_NODE=gpu has no slot count$"):
        client.fetch_hostfile("http://x")


@pytest.mark.parametrize(
    ("route", "body", "said"),
    [
        (localapi.JOB, '{"version": "7"}', "Expected `int`, got `str` - at `$.version`"),
        (localapi.JOB, '{"own": {"rank": 0}}', "missing required field `host`"),
        (localapi.JOB, '{"first": {"rank": 0, "host": "h", "state": "gone"}}', "$.first.state"),
        (localapi.JOB_REPORT, "[1, 2]", "Expected `object`, got `array`"),
        (localapi.STATUS, "{}", "missing required field `ready`"),
        (localapi.STATUS, "<html>proxy</html>", "not JSON"),
        (localapi.MESH, "", "not JSON"),
        (localapi.ENV, '{"RANK": 0}', "Expected `str`, got `int`"),
    ],
)
def test_an_answer_that_does_not_decode_is_one_line_naming_the_route(
    monkeypatch: pytest.MonkeyPatch, route: localapi.LocalRoute[Any], body: str, said: str
) -> None:
    monkeypatch.setattr(client, "get", Recorder(client.Answer(200, body)))
    with pytest.raises(SidecarError) as caught:
        client.fetch("http://x", route, timeout_s=1)
    text = str(caught.value)
    assert "\n" not in text and said in text, text
    assert text.startswith(f"{route.context} on x answered 200: ")
