"""A Prometheus of the test's own, in a namespace on a namespace cluster's bridge.

Debian's `prometheus` binary, started with a configuration, storage directory and port of
its own (the packaged service is never used): it scrapes the sidecars' metrics listeners
by host name, as a cluster's Prometheus would, with the shipped alert rules loaded.
Importable without pytest.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.support.cluster.build import Cluster
from tests.support.cluster.layout import SUBNET
from tests.support.cluster.netio import Reply, http_get
from tests.support.cluster.procs import base_environ
from tests.support.netns import die_with_parent, in_namespace, wait_for

ROOT = Path(__file__).resolve().parents[2]
#: The shipped alert rules and their promtool unit tests.
RULES = ROOT / "deploy" / "prometheus" / "rallypoint-rules.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "rallypoint-rules.test.yaml"
#: The port Prometheus listens on inside its own namespace (nothing else is there).
PORT = 9090
#: The namespace's address on the cluster's bridge: above every node's (.10 and up).
HOST_OCTET = 250


def prerequisites() -> str | None:
    """Why Prometheus cannot run here, or None when it can."""
    missing = [tool for tool in ("prometheus", "promtool") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not on PATH (apt-get install prometheus)"
    return None


class Prometheus:
    """One Prometheus scraping ``targets`` (host:port) every ``interval_s``; a context manager.

    Its namespace joins ``cluster``'s bridge with the cluster's hosts file, so targets are
    named like the nodes and alerts carry ``instance="main1:7782"``.
    """

    def __init__(
        self,
        cluster: Cluster,
        workdir: Path,
        targets: Sequence[str],
        *,
        interval_s: float = 1.0,
        rules: Path = RULES,
    ) -> None:
        self.cluster = cluster
        self.workdir = Path(workdir)
        self.targets = tuple(targets)
        self.interval_s = interval_s
        self.rules = rules
        self.ns = f"{cluster.id}-prom"
        self.veth = f"{cluster.id}vp"
        self.address = f"{SUBNET}.{HOST_OCTET}"
        self.log_path = self.workdir / "prometheus.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._joined = False

    def __enter__(self) -> Prometheus:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def config(self) -> str:
        """prometheus.yml: the shipped rules, one job scraping every target."""
        interval = f"{self.interval_s:g}s"
        doc = {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": interval,
            },
            "rule_files": [str(self.rules)],
            "scrape_configs": [
                {"job_name": "rallypoint", "static_configs": [{"targets": list(self.targets)}]}
            ],
        }
        return json.dumps(doc, indent=2)  # JSON is YAML

    def start(self) -> None:
        """Join the bridge, write the configuration, start Prometheus and wait until ready."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cluster.bridge.add_host(
            self.ns, self.veth, f"{self.cluster.id}pp", [self.address],
            self.cluster.hosts_text({}),
        )  # fmt: skip
        self._joined = True
        config = self.workdir / "prometheus.yml"
        config.write_text(self.config())
        argv = [
            shutil.which("prometheus") or "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{PORT}",
            "--log.level=warn",
        ]
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                in_namespace(self.ns, "prometheus", argv),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=base_environ(), start_new_session=True, preexec_fn=die_with_parent,
            )  # fmt: skip
        wait_for(self._ready, timeout_s=30.0, what="Prometheus ready", describe=self.log)

    def _ready(self) -> bool:
        if self._proc is not None and self._proc.poll() is not None:
            raise RuntimeError(f"prometheus exited {self._proc.returncode}: {self.log()}")
        try:
            return self.get("/-/ready").status == 200
        except OSError:
            return False

    def get(self, path: str) -> Reply:
        """GET path from Prometheus' HTTP API, inside its namespace."""
        return http_get(self.ns, "127.0.0.1", PORT, path)

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of an API answer (``/api/v1/...``); AssertionError on an error."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        reply = self.get(f"/api/v1/{path}{query}")
        body = reply.json()
        assert reply.status == 200 and body.get("status") == "success", (reply.status, body)
        return body["data"]

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert Prometheus holds now, pending or firing."""
        alerts: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return alerts

    def firing(self, name: str) -> list[dict[str, Any]]:
        """The alerts named ``name`` that fire now."""
        alerts = self.alerts()
        return [a for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector."""
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def rules_loaded(self) -> list[dict[str, Any]]:
        """Every alerting rule Prometheus loaded, with its health and last error."""
        groups = self.api("rules", type="alert")["groups"]
        return [rule for group in groups for rule in group["rules"]]

    def targets_up(self) -> bool:
        """Whether every target was scraped successfully at least once."""
        active = self.api("targets", state="active")["activeTargets"]
        return len(active) == len(self.targets) and all(t["health"] == "up" for t in active)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""

    def close(self) -> None:
        """Stop Prometheus and take its namespace off the bridge; safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        if self._joined:
            self._joined = False
            self.cluster.bridge.remove_host(self.ns, self.veth)
