"""Settings from option values and the variables they came from; click stays in setup.py."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from typing import Any

from rallypoint import settings
from rallypoint.cli.logs import configure_logging
from rallypoint.settings import Settings

#: Option names whose Settings field counts seconds (the field carries an `_s`).
_SECONDS = frozenset(
    {
        "deadline",
        "backoff_initial",
        "backoff_max",
        "long_poll",
        "resolve_timeout",
        "probe_timeout",
        "keepalive",
    }
)
#: Options that are not Settings fields, or need more than a rename.
_NOT_FIELDS = frozenset(
    {"token_file", "url", "fmt", "timeout", "out", "hostfile", "as_json", "seconds", "nodes"}
    | {"command", "local_hosts", "mdns_interfaces", "quiet", "explain", "mesh", "show_all"}
    | {"grace", "lost_exit_code", "restarts", "rejoin_timeout", "termination_log"}
    | {"stall_timeout", "stall_timeout_first", "stall_timeout_checkpoint", "stall_signal"}
)


def process_environ() -> dict[str, str]:
    """The mapping providers read: os.environ, plus HOSTNAME when the shell did not export it."""
    environ = dict(os.environ)
    if not environ.get("HOSTNAME"):
        environ["HOSTNAME"] = socket.gethostname()
    return environ


def _field(option: str) -> str:
    return option + "_s" if option in _SECONDS else option


def _flatten(groups: Iterable[tuple[str, ...]]) -> tuple[str, ...]:
    return tuple(item for group in groups for item in group)


def _read_token(
    params: Mapping[str, Any], from_env: Mapping[str, str], environ: Mapping[str, str]
) -> str | None:
    """The session secret: --token-file (flag) > RALLYPOINT_TOKEN > RALLYPOINT_TOKEN_FILE."""
    # Imported here: `check` and the other client commands take no token, and auth pulls in
    # hashlib, hmac and secrets (random), which a HEALTHCHECK run every few seconds skips.
    from rallypoint import auth

    return auth.load_token(
        params.get("token_file"),
        environ.get("RALLYPOINT_TOKEN") or None,
        where=from_env.get("token_file", "--token-file"),
        both_from_env="token_file" in from_env,
    )


def build(
    params: Mapping[str, Any], from_env: Mapping[str, str], environ: Mapping[str, str]
) -> Settings:
    """The frozen Settings from a command's option values (flag > RALLYPOINT_* > default).

    ``from_env`` maps each option whose value came from its variable to that variable.
    """
    values: dict[str, Any] = {
        _field(name): value
        for name, value in params.items()
        if name not in _NOT_FIELDS and value is not None
    }
    values["local_hosts"] = _flatten(params.get("local_hosts") or ())
    values["mdns_interfaces"] = _flatten(params.get("mdns_interfaces") or ())
    if "token_file" in params:
        values["token"] = _read_token(params, from_env, environ)
    # A port set by flag or variable wins; under Slurm the unset ones are the job's own.
    job_ports = settings.job_ports(environ)
    if job_ports is not None:
        values.setdefault("local_port", job_ports[0])
        values.setdefault("peer_port", job_ports[1])
    labels = {_field(name): envvar for name, envvar in from_env.items()}
    return settings.from_mapping(values, labels)


def start(
    params: Mapping[str, Any], from_env: Mapping[str, str]
) -> tuple[Settings, dict[str, str]]:
    """Logging, environment and Settings for a command, in that order."""
    configure_logging(params.get("log_format", "text"), params.get("verbose", False))
    environ = process_environ()
    built = build(params, from_env, environ)
    if built.token:
        configure_logging(built.log_format, built.verbose, built.token)
    return built, environ
