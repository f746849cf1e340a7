"""`rallypoint serve` without click: specs.py's options resolved as click would, else None."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from rallypoint.cli import config, rules, specs
from rallypoint.settings import Settings

#: Each flag of `serve` with its spec and, for a boolean flag, the value it sets.
_FLAGS: dict[str, tuple[specs.Spec, bool | None]] = {
    **{flag: (s, True if s.is_flag else None) for s in specs.SETTINGS for flag in s.flags},
    **{flag: (s, False) for s in specs.SETTINGS for flag in s.off_flags},
}


def parse(
    args: Sequence[str], environ: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str]] | None:
    """`serve`'s option values and the variables they came from, as click makes them.

    Handles long options (`--name value`, `--name=value`), boolean flags and their `--no-`
    pairs, variables and defaults, flag over variable over default; None for anything else
    (short options, help, unknown or abbreviated names, a refused value), which click then
    parses and reports in its own words.
    """
    given: dict[str, Any] = {}
    rest = list(args)
    rest.reverse()
    while rest:
        arg = rest.pop()
        name, eq, value = arg.partition("=")
        found = _FLAGS.get(name) if arg.startswith("--") else None
        if found is None:
            return None
        spec, flag_value = found
        if spec.is_flag:
            if eq:
                return None
            given[spec.name] = flag_value
            continue
        if not eq:
            if not rest:
                return None
            value = rest.pop()  # click takes the next word whatever it looks like
        if spec.multiple:
            given.setdefault(spec.name, []).append(value)
        else:
            given[spec.name] = value  # repeated: the last one wins, as in click
    params: dict[str, Any] = {}
    from_env: dict[str, str] = {}
    for spec in specs.SETTINGS:
        if spec.name in given:
            raw = given[spec.name]
        elif environ.get(spec.envvar):  # an empty variable counts as unset, as in click
            raw = spec.from_variable(environ[spec.envvar])
            from_env[spec.name] = spec.envvar
        elif spec.default is specs.UNSET:
            raw = False if spec.is_flag else None
        else:
            raw = spec.default
        try:
            params[spec.name] = spec.convert(raw)
        except rules.Invalid:
            return None
    return params, from_env


def run(settings: Settings, environ: dict[str, str]) -> None:
    """What `serve` does once it has its Settings: run the sidecar until a signal stops it."""
    import asyncio

    from rallypoint import sidecar

    asyncio.run(sidecar.run(settings, environ))


def serve(args: Sequence[str]) -> int | None:
    """Run `serve` with args, and its exit code; None (nothing done) when click must parse."""
    if os.name == "nt" or os.environ.get("_RALLYPOINT_COMPLETE"):
        return None  # click expands Windows globs and answers shell completion
    try:
        parsed = parse(args, os.environ)
        if parsed is None:
            return None
        params, from_env = parsed
        try:
            settings, environ = config.start(params, from_env)
        except Exception:
            return None  # click builds them again and reports the failure
        try:
            run(settings, environ)
        except Exception as exc:
            from rallypoint.cli import output

            return output.report(exc, params["verbose"])
    except KeyboardInterrupt:
        from rallypoint.cli import output

        return output.interrupted()
    return 0
