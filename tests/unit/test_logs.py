"""Log events carry their fields as record attributes, so JSON lines hold them as keys."""

from __future__ import annotations

import ast
import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

from rallypoint.cli import logs
from rallypoint.model import Member
from rallypoint.rendezvous.cluster import master

SRC = Path(__file__).resolve().parents[2] / "src" / "rallypoint"
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}
#: An event name: lower case words joined by `_` or `.`, nothing to format.
EVENT = re.compile(r"[a-z][a-z0-9_.]*")


def _join_line(
    formatter: logging.Formatter, remote: str = "10.0.0.2", relay: int | None = None
) -> str:
    """The line a node-2 join logs on the master through ``formatter``."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger = logging.getLogger("rallypoint")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        master._log_join(Member(2, "node2", ("10.0.0.2",)), remote, relay, 1, 2, 3)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return stream.getvalue().rstrip()


def test_a_json_line_carries_the_events_fields_as_keys() -> None:
    doc = json.loads(_join_line(logs.JsonFormatter(None)))
    assert doc["event"] == "joined"
    assert doc["logger"] == "rallypoint.rendezvous"
    assert (doc["rank"], doc["host"], doc["remote"]) == (2, "node2", "10.0.0.2")


def test_a_text_line_reads_event_then_fields_in_order() -> None:
    line = _join_line(logs.TextFormatter(None))
    assert line.endswith("rallypoint.rendezvous: joined rank=2 host=node2 remote=10.0.0.2")


def test_a_join_a_relay_batched_names_the_relay() -> None:
    line = _join_line(logs.TextFormatter(None), remote="10.0.0.9", relay=9)
    assert line.endswith("joined rank=2 host=node2 remote=10.0.0.9 relay=9")


def _messages(root: Path) -> Iterator[tuple[str, ast.Call, ast.expr]]:
    """Every logger call under ``root`` with a message: where, the call, the message."""
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            receiver = node.func.value
            if not (isinstance(receiver, ast.Name) and receiver.id.endswith("log")):
                continue
            method = node.func.attr
            index = 1 if method == "log" else 0 if method in LEVELS else None
            if index is not None and len(node.args) > index:
                yield f"{path.relative_to(root).as_posix()}:{node.lineno}", node, node.args[index]


def _violations(root: Path) -> list[str]:
    """Log calls under ``root`` whose message is not a bare event name."""
    found = []
    for where, call, message in _messages(root):
        if message is not call.args[-1]:
            found.append(f"{where}: arguments are formatted into the message")
        elif isinstance(message, ast.Name):
            continue  # an event name passed through (warn_once)
        elif not (isinstance(message, ast.Constant) and isinstance(message.value, str)):
            found.append(f"{where}: the message is not a literal event name")
        elif "=%" in message.value or not EVENT.fullmatch(message.value):
            found.append(f"{where}: {message.value!r} is not an event name")
    return found


def test_log_messages_are_event_names_with_fields_in_extra() -> None:
    calls = [message for _, _, message in _messages(SRC)]
    # The scan must see the calls it judges: the join event is one of them.
    assert any(isinstance(m, ast.Constant) and m.value == "joined" for m in calls)
    assert len(calls) >= 35
    assert _violations(SRC) == []


def test_the_scan_catches_fields_in_the_message(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(
        "log.info('joined rank=%d', rank)\n"
        "log.log(level, 'not_ready reasons=%s', codes)\n"
        "log.warning(f'lost {host}')\n"
        "log.info('joined rank=%(rank)d', extra={})\n"
        "log.info('joined', extra={'rank': 1})\n",
        encoding="utf-8",
    )
    assert [v.split(":")[1] for v in _violations(tmp_path)] == ["1", "2", "3", "4"]
