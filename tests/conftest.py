"""Shared test plumbing: tier gating that skips locally and fails in CI, and shared fixtures."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import resource
import time
from collections.abc import Generator, Iterator

import pytest
from hypothesis import HealthCheck, settings

from rallypoint.cli import logs
from tests.support import quiet
from tests.support.mdns import LOOPBACK_MDNS_TESTS, loopback_multicast_works

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

# A property test asserts properties, not speed: hypothesis' default 200 ms deadline per
# example failed a correct test whenever the suite's other workers left it a slow core
# (test_fanout at 34,729 nodes took 291 ms beside four busy processes). Speed is measured
# by the benchmarks (bench/, docs/performance.md).
settings.register_profile("rallypoint", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("rallypoint")


def require(condition: bool, reason: str) -> None:
    """Skip the calling test when a prerequisite is missing; in CI (CI=true), fail instead."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"prerequisite missing in CI: {reason}", pytrace=False)
    pytest.skip(reason)


def require_module(module: str, install: str) -> None:
    """Skip (fail in CI) when a framework is not installed."""
    require(importlib.util.find_spec(module) is not None, f"{module} is not installed ({install})")


#: Tiers whose tests share one cluster or server per run, or one Docker engine: each runs on
#: one worker when the suite runs side by side (pytest-xdist, ``--dist loadgroup``;
#: docs/testing.md). The compose sessions share the Docker engine, whose network changes
#: reach every session's firewall rules.
ONE_WORKER_TIERS = ("slurm", "monitoring", "compose")
#: Tiers whose modules share long-lived fixtures: each module runs on one worker.
ONE_WORKER_MODULES = ("hardening",)


#: The modules that use real mDNS on loopback, the host's own medium: one worker for all.
LOOPBACK_MDNS_MODULES = frozenset([*LOOPBACK_MDNS_TESTS, "tests/inprocess/test_mdns_strangers.py"])


def _module(item: pytest.Item) -> str:
    """``tests/multihost/test_run.py`` for any test of that module."""
    return item.nodeid.split("::", 1)[0]


def _tier(item: pytest.Item) -> str:
    """``multihost`` for a test under tests/multihost/, "" outside a tier."""
    parts = _module(item).split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else ""


def side_by_side_group(item: pytest.Item) -> str | None:
    """The xdist group a test runs in: loopback mDNS's, its tier's, its module's, or none
    (any worker)."""
    module, tier = _module(item), _tier(item)
    if module in LOOPBACK_MDNS_MODULES:
        return "loopback-mdns"
    if tier in ONE_WORKER_TIERS:
        return tier
    if tier in ONE_WORKER_MODULES:
        return module
    return None


#: The order the tests start in, side by side: the in-process tier beside the measuring tests
#: (which lock out every busy tier), then the tiers that run serially on one worker (Slurm,
#: compose, monitoring, each hardening module) so that none is left to run alone at the end,
#: then the namespace scenarios, and the unit tests last to fill the workers' gaps. Started
#: after the namespace scenarios, two hardening modules ran alone for the last 40 s.
TIER_ORDER = ("inprocess", "slurm", "compose", "monitoring", "hardening", "multihost", "unit")


def _tier_rank(item: pytest.Item) -> int:
    tier = _tier(item)
    return TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER)


#: Tiers whose tests start processes (sidecars, real frameworks, containers, Slurm steps) or
#: keep a core busy: side by side, a ``quiet_machine`` test does not run beside them.
BUSY_TIERS = ("multihost", "compose", "slurm", "monitoring", "hardening")


def _start_rank(item: pytest.Item) -> tuple[bool, int]:
    """Measuring tests first (they wait for no busy test then), the rest by ``TIER_ORDER``."""
    return item.get_closest_marker("quiet_machine") is None, _tier_rank(item)


def pytest_configure(config: pytest.Config) -> None:
    """The controller of a side-by-side run makes the lock its workers share (support/quiet)
    and keeps the start order above: by default pytest-xdist deals out the groups with the
    most tests first (``--loadscope-reorder``), which started the measuring tests late, with
    every busy test of the moment to wait for and the cores idle meanwhile."""
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        quiet.start()
        config.option.loadscopereorder = False


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        quiet.finish()


#: A file to add one JSON line per test to (start, end, worker, test): where the suite's time
#: goes side by side (docs/testing.md, "Where the time goes").
TIMELINE = os.environ.get("RALLYPOINT_TEST_TIMELINE")


def _cpu_s() -> float:
    """CPU seconds of this worker and of every child it reaped (sidecars, frameworks): a
    test's share, give or take what runs in containers or Slurm steps."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """Side by side, a ``quiet_machine`` test runs with no busy test beside it
    (tests/support/quiet.py); setup and teardown included."""
    began, cpu = time.time(), _cpu_s()
    try:
        if item.get_closest_marker("quiet_machine") is not None:
            with quiet.hold(exclusive=True):
                return (yield)
        if _tier(item) in BUSY_TIERS or item.get_closest_marker("starts_processes") is not None:
            with quiet.hold(exclusive=False):
                return (yield)
        return (yield)
    finally:
        if TIMELINE:
            worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
            line = {"start": began, "end": time.time(), "worker": worker, "test": item.nodeid,
                    "cpu_s": round(_cpu_s() - cpu, 2)}  # fmt: skip
            with open(TIMELINE, "a") as timeline:
                timeline.write(json.dumps(line) + "\n")


@pytest.hookimpl(wrapper=True)  # around xdist's hook, which reads the groups off the markers
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> Generator[None, None, None]:
    items.sort(key=_start_rank)  # stable: each module's tests stay together, in file order
    for item in items:
        group = side_by_side_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    yield
    # In an xdist worker under --dist loadgroup, a grouped test's id ends in @group; without
    # it the tier's tests would be spread over workers, each starting its own cluster.
    if getattr(config.option, "loadgroup", False):
        lost = [i.nodeid for i in items if side_by_side_group(i) and "@" not in i.nodeid]
        if lost:
            raise pytest.UsageError(
                f"--dist loadgroup did not group {lost[0]} (pytest-xdist#1386 on pytest 9.2): "
                "install the test extra's pytest (pip install -e '.[test]'), or run with -n 0"
            )


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Remember each phase's outcome on the item (rp_report_*): fixtures dump logs on failure."""
    report = yield
    setattr(item, f"rp_report_{report.when}", report)
    return report


def has_failed(item: pytest.Item) -> bool:
    """Whether the test's setup or call failed (for fixtures that dump logs on failure)."""
    return any(
        getattr(getattr(item, f"rp_report_{when}", None), "failed", False)
        for when in ("setup", "call")
    )


@pytest.fixture(scope="module")
def multicast_lo() -> None:
    """Real mDNS on loopback: skipped (failed in CI) where lo does not loop multicast back."""
    require(loopback_multicast_works(), "multicast over loopback (127.0.0.1) is not available")


@pytest.fixture(autouse=True)
def _drop_cli_log_handler() -> Iterator[None]:
    """CLI runs install a stderr handler and the runner swaps sys.stderr: drop it afterwards."""
    yield
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, logs.Handler)]:
        root.removeHandler(handler)
