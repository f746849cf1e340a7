"""Shared test plumbing: tier gating that skips locally and fails in CI, and shared fixtures."""

from __future__ import annotations

import os

import pytest

from tests.support.mdns import loopback_multicast_works

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require(condition: bool, reason: str) -> None:
    """Skip the calling test when a prerequisite is missing; in CI (CI=true), fail instead."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"prerequisite missing in CI: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def multicast_lo() -> None:
    """Real mDNS on loopback: skipped (failed in CI) where lo does not loop multicast back."""
    require(loopback_multicast_works(), "multicast over loopback (127.0.0.1) is not available")
