"""Value rules of the options, without click: text in, a value out, or Invalid saying why."""

from __future__ import annotations

import ipaddress
import math
import re
import signal
from collections.abc import Sequence
from typing import Any

from rallypoint import settings
from rallypoint.core import fanout
from rallypoint.errors import ConfigError

_UINT = re.compile(r"[0-9]+")
_RANGE = re.compile(r"\s*([0-9]+)\s*-\s*([0-9]+)\s*")


class Invalid(ValueError):
    """A value a rule refuses; the message names the value and the remedy, not the option."""


class Rule:
    """A conversion from an option's text, with the name --help shows for its value."""

    name = "text"

    def __call__(self, value: Any) -> Any:
        return str(value)

    def split(self, text: str) -> list[str]:
        """The items of a repeatable option's variable (click's default: split on blanks)."""
        return text.split()


class Int(Rule):
    """An integer in [low, high]."""

    def __init__(self, name: str, low: int, high: int, remedy: str) -> None:
        self.name, self.low, self.high, self.remedy = name, low, high, remedy

    def __call__(self, value: Any) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if not _UINT.fullmatch(text) or not self.low <= int(text) <= self.high:
            raise Invalid(f"{value!r} is not {self.remedy}")
        return int(text)


class Seconds(Rule):
    """A finite number of seconds, > 0 (or >= 0 when zero means something)."""

    name = "seconds"

    def __init__(self, allow_zero: bool = False) -> None:
        self.allow_zero = allow_zero

    def __call__(self, value: Any) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = math.nan
        if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not self.allow_zero):
            least = "0 or more" if self.allow_zero else "more than 0"
            raise Invalid(f"{value!r} is not a number of seconds: use {least}, e.g. 30")
        return seconds


class SignalName(Rule):
    """A signal a process can catch, by name (USR1, SIGUSR1) or number: its number."""

    name = "signal"

    def __call__(self, value: Any) -> int:
        text = str(value).strip().upper()
        name = text if text.startswith("SIG") else f"SIG{text}"
        try:
            number = int(text) if text.isdigit() else int(signal.Signals[name])
            signal.Signals(number)
        except (KeyError, ValueError):
            number = 0
        if number in (0, signal.SIGKILL, signal.SIGSTOP):
            raise Invalid(f"{value!r} is not a signal a job can catch: use a name like USR1")
        return number


class Rate(Rule):
    """A finite rate in Mbit/s, > 0."""

    name = "mbit/s"

    def __call__(self, value: Any) -> float:
        try:
            rate = float(value)
        except (TypeError, ValueError):
            rate = math.nan
        if not math.isfinite(rate) or rate <= 0:
            raise Invalid(f"{value!r} is not a rate in Mbit/s: use a number above 0, e.g. 1000")
        return rate


class PortRange(Rule):
    """LO-HI, two ports with LO <= HI."""

    name = "LO-HI"

    def __call__(self, value: Any) -> tuple[int, int]:
        if isinstance(value, tuple):
            return (int(value[0]), int(value[1]))
        match = _RANGE.fullmatch(str(value))
        if match:
            low, high = int(match[1]), int(match[2])
            if 1 <= low <= high <= 65535:
                return (low, high)
        raise Invalid(
            f"{value!r} is not a port range: use LO-HI with 1 <= LO <= HI <= 65535, "
            "e.g. 20000-29999"
        )


class Address(Rule):
    """An IP address to listen on: 0.0.0.0 (with ::, every address), :: or one address."""

    name = "ADDRESS"

    def __call__(self, value: Any) -> str:
        text = str(value).strip()
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            address = None
        if address is None or "%" in text:
            raise Invalid(
                f"{value!r} is not an IP address to listen on: use 0.0.0.0 (every address), "
                "or one of this node's addresses, e.g. 10.0.0.5 or fd00::5"
            )
        return str(address)


class Choice(Rule):
    """One of a fixed set of words."""

    def __init__(self, choices: Sequence[str]) -> None:
        self.choices = tuple(choices)
        self.name = "|".join(self.choices)

    def __call__(self, value: Any) -> str:
        text = str(value).strip().lower()
        if text not in self.choices:
            raise Invalid(f"{value!r} is not one of {', '.join(self.choices)}")
        return text


class Words(Rule):
    """A comma-separated list; with `multiple`, the option may also be repeated."""

    def __init__(self, name: str, choices: Sequence[str] | None = None) -> None:
        self.name, self.choices = name, choices

    def split(self, text: str) -> list[str]:
        return [text]  # one variable holds the whole comma list

    def __call__(self, value: Any) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        words = tuple(word.strip() for word in str(value).split(",") if word.strip())
        for word in words:
            if any(ch.isspace() for ch in word):
                raise Invalid(f"{value!r} contains {word!r}: separate items by commas")
            if self.choices is not None and word not in self.choices:
                raise Invalid(f"{value!r}: {word!r} is not one of {', '.join(self.choices)}")
        if not words:
            raise Invalid(f"{value!r} names nothing: give a comma-separated list")
        return words


class KeyValue(Rule):
    """KEY=VALUE; in the variable, one assignment per line (values may contain spaces)."""

    name = "KEY=VALUE"

    def split(self, text: str) -> list[str]:
        return [line for line in text.splitlines() if line.strip()]

    def __call__(self, value: Any) -> tuple[str, str]:
        if isinstance(value, tuple):
            return (str(value[0]), str(value[1]))
        key, sep, val = str(value).partition("=")
        if not sep or not key.strip():
            raise Invalid(f"{value!r} is not KEY=VALUE: write e.g. --set MASTER_PORT=29600")
        return (key.strip(), val)


class TFLayout(Rule):
    """A TF_CONFIG layout, as settings.tf_layout reads it."""

    name = "workers|chief|evaluator|ps:N"

    def __call__(self, value: Any) -> str:
        try:
            return settings.tf_layout(str(value))
        except ConfigError as exc:
            raise Invalid(str(exc)) from exc


class RelayGroup(Rule):
    """auto, 0 (no fan-out tree) or a group size of 2-128 ranks."""

    name = "auto|0|2-128"

    def __call__(self, value: Any) -> int | None:
        if value is None or isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text == "auto":
            return None
        if not _UINT.fullmatch(text) or int(text) == 1 or int(text) > fanout.MAX_GROUP:
            raise Invalid(
                f"{value!r} is not a relay group size: use auto, 0 (every worker joins the "
                f"master) or 2-{fanout.MAX_GROUP}"
            )
        return int(text)


class Provider(Rule):
    """A provider name from providers.NAMES."""

    name = "provider"

    def __call__(self, value: Any) -> str:
        from rallypoint import providers

        text = str(value).strip().lower()
        if text not in providers.NAMES:
            raise Invalid(
                f"{value!r} is not a provider: use one of {', '.join(providers.NAMES)} "
                "(or leave it unset to detect)"
            )
        return text


#: click's BoolParamType.bool_states: what a boolean flag's variable may say.
BOOL_STATES = {
    "1": True, "0": False, "yes": True, "no": False, "true": True, "false": False,
    "on": True, "off": False, "t": True, "f": False, "y": True, "n": False, "": False,
}  # fmt: skip


class Bool(Rule):
    """A boolean flag's value: a bool, or a variable's word from BOOL_STATES."""

    name = "boolean"

    def __call__(self, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        state = BOOL_STATES.get(str(value).strip().lower())
        if state is None:
            raise Invalid(f"{value!r} is not a boolean")
        return state
