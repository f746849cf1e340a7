"""Render served values as json, sh (for eval) or dotenv (for compose's env_file)."""

from __future__ import annotations

import functools
import json
import re
import shlex
from collections.abc import Mapping

FORMATS = ("json", "sh", "dotenv")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Characters both compose readers take literally in an unquoted value: no
# whitespace, quotes, '#', '$' or backslash.
_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def render(values: Mapping[str, str], fmt: str) -> str:
    """Return ``values`` in ``fmt`` (json, sh or dotenv), keys in the given order.

    ValueError on an unknown format, a key that is not a variable name, a value
    holding NUL (no environment can carry it), or a dotenv value that the two
    compose readers cannot both read back exactly (see docs/env-contract.md).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    for key, value in values.items():
        if not _NAME.fullmatch(key):
            raise ValueError(f"{key!r} is not an environment variable name")
        if "\0" in value:
            raise ValueError(f"{key} holds a NUL character, which no environment can carry")
    if fmt == "json":
        return json.dumps(dict(values), indent=2) + "\n"
    if fmt == "sh":
        return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in values.items())
    return "".join(f"{key}={dotenv_quote(key, value)}\n" for key, value in values.items())


@functools.lru_cache(maxsize=32)
def render_bytes(values: tuple[tuple[str, str], ...], fmt: str) -> bytes:
    """``render(dict(values), fmt)`` as UTF-8, memoised: /env serves the same env many times.

    ``values`` is an Env's (key, value) pairs, hashable and immutable, so a cached answer
    can never be stale; errors are raised again on every call (they are not cached).
    """
    return render(dict(values), fmt).encode()


def dotenv_quote(key: str, value: str) -> str:
    """Quote ``value`` so compose v2 (compose-go) and compose 1.29 (python-dotenv) read it back.

    The rule, from both parsers' sources and checked against docker-compose 1.29:

    * plain characters only (letters, digits, ``_@%+=:,./-``): unquoted;
    * otherwise, without ``'``, backslash, carriage return or ``${``: single quotes.
      compose-go keeps single-quoted text verbatim (no escapes, no interpolation);
      python-dotenv decodes ``\\\\`` and ``\\'`` there, reads the file with universal
      newlines (a bare CR becomes LF) and interpolates ``${NAME}`` even in single quotes;
    * otherwise, without ``$`` and not ending in a backslash: double quotes, escaping
      backslash and ``"`` and writing newline and CR as ``\\n`` and ``\\r``, which both
      decode. A ``$`` cannot go here: compose-go interpolates ``$NAME`` in double quotes
      and only ``\\$`` escapes it, while python-dotenv keeps ``\\$`` as two characters.
      A trailing backslash would make compose-go take the closing quote as escaped.

    Any other value has no spelling that both readers agree on: ValueError naming the key.
    """
    if _PLAIN.fullmatch(value):
        return value
    if not any(bad in value for bad in ("'", "\\", "\r", "${")):
        return f"'{value}'"
    if "$" not in value and not value.endswith("\\"):
        escaped = (
            value.replace("\\", "\\\\")
            .replace('"', '\\"')
            .replace("\n", "\\n")
            .replace("\r", "\\r")
        )
        return f'"{escaped}"'
    raise ValueError(
        f"{key} cannot be written as dotenv that docker compose reads back exactly "
        "(it holds '$' with a quote, backslash or CR, '${', or ends in a backslash); "
        "use format json or sh"
    )
