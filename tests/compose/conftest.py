"""What every compose test needs: a Docker engine, a compose client, a fresh image."""

from __future__ import annotations

import pytest

from tests.compose import engine
from tests.conftest import require


@pytest.fixture(scope="session")
def tools() -> tuple[str, list[str]]:
    """A Docker engine, a compose client and a freshly (cache-)built rallypoint image."""
    docker = engine.docker_cli()
    require(docker is not None, "docker CLI not installed (scripts/setup-system.sh)")
    require(engine.engine_answers(docker), "no Docker engine answers (scripts/setup-system.sh)")
    compose = engine.compose_cli(docker)
    require(compose is not None, "neither docker-compose nor the compose plugin is installed")
    assert docker is not None and compose is not None
    # Always run the script once per run: it is cached, and a stale image would test old code.
    engine.build_images()
    return docker, compose
