"""Slurm hostlist expressions: expand ``gpu[01-04,07],login1``, purely."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NoReturn

from rallypoint.errors import ClusterSpecError
from rallypoint.providers._common import MAX_NODES, show

# Longest number in a range: keeps int() cheap and ranges far from overflowing anything.
_MAX_DIGITS = 12
_RANGE = re.compile(rf"([0-9]{{1,{_MAX_DIGITS}}})(?:-([0-9]{{1,{_MAX_DIGITS}}}))?")

# A bracket group is the list of numbers it stands for, kept as (lo, hi, width) ranges so
# that a huge range is counted before anything is generated.
_Range = tuple[int, int, int]
_Segment = str | list[_Range]


def expand(
    expression: str, *, variable: str = "SLURM_JOB_NODELIST", limit: int = MAX_NODES
) -> list[str]:
    """Every host name of a hostlist expression, in Slurm's order; ClusterSpecError if malformed.

    Ranges keep the width of their first number (``[08-10]`` gives 08, 09, 10); several
    bracket groups in one name multiply out with the leftmost group varying slowest.
    """
    hosts: list[str] = []
    for item in _split_top_level(expression, variable):
        segments = _parse_item(item, expression, variable)
        count = 1
        for segment in segments:
            if isinstance(segment, list):
                count *= sum(hi - lo + 1 for lo, hi, _ in segment)
        if len(hosts) + count > limit:
            raise ClusterSpecError(
                f"{variable}={show(expression)} expands to more than {limit} hosts;"
                " check the ranges"
            )
        hosts.extend(_generate(segments))
    return hosts


def _split_top_level(expression: str, variable: str) -> list[str]:
    """Split at the commas outside brackets; brackets must balance and not nest."""
    items: list[str] = []
    depth = 0
    start = 0
    for position, char in enumerate(expression):
        if char == "[":
            if depth:
                _malformed(expression, variable, "nested '['")
            depth = 1
        elif char == "]":
            if not depth:
                _malformed(expression, variable, "']' without '['")
            depth = 0
        elif char == "," and not depth:
            items.append(expression[start:position])
            start = position + 1
    if depth:
        _malformed(expression, variable, "'[' without ']'")
    items.append(expression[start:])
    for item in items:
        if not item:
            _malformed(expression, variable, "an empty entry")
    return items


def _parse_item(item: str, expression: str, variable: str) -> list[_Segment]:
    """Literal text and bracket groups of one comma-separated entry."""
    segments: list[_Segment] = []
    position = 0
    while position < len(item):
        opening = item.find("[", position)
        if opening < 0:
            segments.append(item[position:])
            break
        if opening > position:
            segments.append(item[position:opening])
        closing = item.index("]", opening)
        segments.append(_parse_group(item[opening + 1 : closing], expression, variable))
        position = closing + 1
    return segments


def _parse_group(body: str, expression: str, variable: str) -> list[_Range]:
    """The ranges inside one pair of brackets, e.g. ``01-04,07``."""
    ranges: list[_Range] = []
    for part in body.split(","):
        match = _RANGE.fullmatch(part)
        if match is None:
            _malformed(expression, variable, f"bad range {show(part)} (want N or N-M)")
        first, last = match.group(1), match.group(2)
        lo = int(first)
        hi = lo if last is None else int(last)
        if hi < lo:
            _malformed(expression, variable, f"range {show(part)} runs backwards")
        ranges.append((lo, hi, len(first)))
    return ranges


def _generate(segments: Sequence[_Segment]) -> list[str]:
    """The cartesian product of the segments, leftmost bracket group varying slowest."""
    names = [""]
    for segment in segments:
        if isinstance(segment, str):
            names = [name + segment for name in names]
        else:
            numbers = [
                f"{number:0{width}d}" for lo, hi, width in segment for number in range(lo, hi + 1)
            ]
            names = [name + number for name in names for number in numbers]
    return names


def _malformed(expression: str, variable: str, what: str) -> NoReturn:
    raise ClusterSpecError(
        f"{variable}={show(expression)} is not a valid hostlist expression: {what};"
        " write it as Slurm does, e.g. 'gpu[01-04,07],login1'"
    )
