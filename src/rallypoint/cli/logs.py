"""Log output on stderr, text or JSON, the session secret never printed; set up by the CLI."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RECORD_FIELDS and k[:1] != "_"}


def _without_traceback(record: logging.LogRecord) -> logging.LogRecord:
    """A copy of record whose exception is one `(Type: message)` suffix, not a traceback."""
    if not record.exc_info or record.exc_info[1] is None:
        return record
    exc = record.exc_info[1]
    message = f"{record.getMessage()} ({type(exc).__name__}: {one_line(str(exc))})"
    return logging.makeLogRecord(
        {**vars(record), "msg": message, "args": None, "exc_info": None, "exc_text": None}
    )


class TextFormatter(logging.Formatter):
    """`time level logger: event key=value ...`; tracebacks only when verbose; secret redacted."""

    def __init__(self, secret: str | None, verbose: bool = False) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.secret = secret
        self.verbose = verbose

    def format(self, record: logging.LogRecord) -> str:
        record = record if self.verbose else _without_traceback(record)
        text = super().format(record)
        fields = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        text = f"{text} {fields}" if fields else text
        return text.replace(self.secret, "[redacted]") if self.secret else text


class JsonFormatter(TextFormatter):
    """One JSON object per line: ts, level, logger, event and the record's extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        record = record if self.verbose else _without_traceback(record)
        doc: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
            **_extras(record),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        text = json.dumps(doc, default=str)
        return text.replace(self.secret, "[redacted]") if self.secret else text


class Handler(logging.StreamHandler):  # type: ignore[type-arg,unused-ignore]
    """Marks the handler configure_logging installed, so a second invocation replaces it."""


def configure_logging(log_format: str, verbose: bool, secret: str | None = None) -> None:
    """Send logs to stderr: rallypoint at INFO (DEBUG with --verbose), libraries at WARNING."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, Handler)]:
        root.removeHandler(handler)
    handler = Handler(sys.stderr)
    formatter = JsonFormatter if log_format == "json" else TextFormatter
    handler.setFormatter(formatter(secret, verbose))
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.WARNING)
    logging.getLogger("rallypoint").setLevel(logging.DEBUG if verbose else logging.INFO)


def one_line(text: str) -> str:
    """Text on one line, blanks collapsed (a message for `error: ...` or a log suffix)."""
    return " ".join(text.split()) or "no detail"
