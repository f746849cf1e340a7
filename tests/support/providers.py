"""The providers' error contract: a bad environment fails detection with one line naming it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from rallypoint.errors import ClusterSpecError
from rallypoint.providers import detect


def assert_one_line_error(environ: Mapping[str, str], fragments: Sequence[str]) -> None:
    """detect(environ) raises ClusterSpecError: one line, holding every fragment."""
    with pytest.raises(ClusterSpecError) as info:
        detect(dict(environ))
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
