"""The typed views the CLI renders, from the JSON a test writes out (as the client decodes it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from rallypoint.wire.jobstates import JobView
from rallypoint.wire.local import StatusView


def status_view(doc: Mapping[str, Any]) -> StatusView:
    return msgspec.convert(doc, StatusView)


def job_view(doc: Mapping[str, Any]) -> JobView:
    return msgspec.convert(doc, JobView)
