"""The shipped alert rules under promtool: valid, their unit tests pass (and can fail), and
every metric they read is one the sidecar exposes, in an exposition promtool accepts."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from rallypoint.core.jobs import CAUSES
from rallypoint.metrics import Metrics
from tests.monitoring.prom import RULE_TESTS, RULES
from tests.support.commands import run

pytestmark = pytest.mark.monitoring


def alert_rules() -> list[dict[str, object]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_the_rules_pass_promtool_check(promtool: str) -> None:
    checked = run([promtool, "check", "rules", str(RULES)], timeout_s=60, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in checked.stdout


def test_the_rules_pass_their_unit_tests(promtool: str) -> None:
    tested = run([promtool, "test", "rules", str(RULE_TESTS)], timeout_s=60, check=False)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_the_unit_tests_catch_a_changed_rule(promtool: str, tmp_path: Path) -> None:
    """A peer-down alert that waits 5 minutes instead of 30 s fails the unit tests."""
    text = RULES.read_text()
    assert text.count("for: 30s") == 1
    (tmp_path / RULES.name).write_text(text.replace("for: 30s", "for: 5m"))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    tested = run(
        [promtool, "test", "rules", str(tmp_path / RULE_TESTS.name)], timeout_s=60, check=False
    )
    assert tested.returncode != 0
    assert "RallypointPeerDown" in tested.stdout + tested.stderr


def test_every_rule_has_its_runbook_and_every_alert_a_unit_test() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    expected = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", ())
        if case.get("exp_alerts")
    }
    for rule in alert_rules():
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        assert {"summary", "description", "runbook"} <= set(annotations), rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]  # type: ignore[index]
        assert rule["alert"] in expected, f"{rule['alert']} never fires in the unit tests"


def _populated() -> Metrics:
    """A registry with a sample in every family, as a busy master would have."""
    metrics = Metrics()
    for family in vars(metrics).values():
        if hasattr(family, "label_names") and family.label_names:
            sample = family.labels(*(f"x{i}" for i in range(len(family.label_names))))
            sample.inc() if family.kind == "counter" else sample.set(2)
    metrics.mdns_rejections = lambda: {"session": 1}
    metrics.not_ready_codes = lambda: ["path_mtu", "path_mtu", "deadline_exceeded"]
    metrics.link_warning_codes = lambda: ["slow_link"]
    return metrics


def test_the_exposition_passes_promtool_check_metrics(promtool: str) -> None:
    exposition = _populated().render()
    checked = run(
        [promtool, "check", "metrics"], input=exposition.decode(), timeout_s=60, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout + checked.stderr == ""


def test_every_metric_the_rules_read_is_exposed() -> None:
    exposition = _populated().render().decode()
    exposed = set(re.findall(r"^(rallypoint_\w+?)(?:\{| )", exposition, re.M))
    for rule in alert_rules():
        for name in re.findall(r"rallypoint_\w+", str(rule["expr"])):
            assert name in exposed, f"{rule['alert']} reads {name}, which no sidecar exposes"
    for cause in CAUSES:  # at 0 from the start, so that increase() sees the first
        assert (
            f'rallypoint_job_failures_total{{cause="{cause}"}} 0.0' in Metrics().render().decode()
        )
