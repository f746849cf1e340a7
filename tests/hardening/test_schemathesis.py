"""Schemathesis over both APIs of docs/openapi.yaml against in-process sidecars.

Positive (schema-conforming) and negative (schema-violating) cases are generated for each
operation; every answer must pass schemathesis' conformance checks (status code, content
type, response schema and headers documented) and never be a server error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import schemathesis
import yaml  # type: ignore[import-untyped]
from hypothesis import given
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.hardening.harness import REQUEST_TIMEOUT_S, Node, Records, fuzz

RAW = yaml.safe_load((Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml").read_text())
SCHEMA = schemathesis.openapi.from_dict(RAW)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
LOCAL = [("GET", path) for path in ("/env", "/readyz", "/livez", "/status", "/metrics")]
# POST /job only: a fuzzed GET /job?after=&wait= may long-poll for minutes, by design.
LOCAL.append(("POST", "/job"))
PEER = [("POST", "/v1/join"), ("GET", "/v1/cluster"), ("GET", "/v1/ready"), ("POST", "/v1/poke"),
        ("POST", "/v1/alive")]  # fmt: skip


def cases(method: str, path: str) -> st.SearchStrategy[Any]:
    operation = SCHEMA[path][method]
    return st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    )


def run_case(case: Any, port: int, logs: Records) -> None:
    response = case.call(base_url=f"http://127.0.0.1:{port}", timeout=REQUEST_TIMEOUT_S)
    case.validate_response(response, checks=CHECKS)
    assert b"Traceback" not in response.content
    assert not logs.crashes()


@pytest.mark.parametrize(("method", "path"), LOCAL, ids=[p for _, p in LOCAL])
def test_local_api_conforms(ready_node: Node, logs: Records, method: str, path: str) -> None:
    @fuzz(0.3)
    @given(case=cases(method, path))
    def check(case: Any) -> None:
        run_case(case, ready_node.local_port, logs)

    check()


@pytest.mark.parametrize(("method", "path"), PEER, ids=[p for _, p in PEER])
def test_peer_api_conforms(ready_node: Node, logs: Records, method: str, path: str) -> None:
    @fuzz(0.3)
    @given(case=cases(method, path))
    def check(case: Any) -> None:
        run_case(case, ready_node.peer_port, logs)

    check()


@pytest.mark.parametrize(("method", "path"), PEER, ids=[p for _, p in PEER])
def test_peer_api_of_a_waiting_master_conforms(
    waiting_master: Node, logs: Records, method: str, path: str
) -> None:
    """Same, against a master still collecting joins (GET /v1/cluster long-polls, then 204)."""

    @fuzz(0.05)
    @given(case=cases(method, path))
    def check(case: Any) -> None:
        run_case(case, waiting_master.peer_port, logs)

    check()
