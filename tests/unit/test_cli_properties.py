"""Arbitrary environments fed to `rallypoint derive`: an env or one clear line, never a crash."""

from __future__ import annotations

import json

from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rallypoint.cli.commands import app
from tests.support.env import clean_env

# Variables the providers, the derivation and the CLI read (RALLYPOINT_VERBOSE is left out:
# it adds a traceback to errors on purpose).
KEYS = (
    "RALLYPOINT_HOSTS", "RALLYPOINT_NODE_RANK", "RALLYPOINT_MASTER", "RALLYPOINT_NNODES",
    "RALLYPOINT_SESSION", "RALLYPOINT_DISCOVERY", "RALLYPOINT_HOST_TEMPLATE",
    "RALLYPOINT_PROVIDER", "RALLYPOINT_MASTER_PORT", "RALLYPOINT_TF_PORT",
    "RALLYPOINT_PORT_RANGE", "RALLYPOINT_FRAMEWORKS", "RALLYPOINT_NPROC_PER_NODE",
    "RALLYPOINT_TF_LAYOUT", "RALLYPOINT_SET", "RALLYPOINT_RESOLVE_SCOPE", "RALLYPOINT_DEADLINE",
    "RALLYPOINT_LOCAL_PORT", "RALLYPOINT_PEER_PORT", "RALLYPOINT_STRICT_SELF",
    "RALLYPOINT_MDNS", "RALLYPOINT_LOG_FORMAT", "RALLYPOINT_TOKEN",
    "BACKENDAI_CLUSTER_HOSTS", "BACKENDAI_CLUSTER_HOST", "BACKENDAI_CLUSTER_SIZE",
    "BACKENDAI_CLUSTER_ROLE", "BACKENDAI_CLUSTER_IDX", "BACKENDAI_CLUSTER_LOCAL_RANK",
    "BACKENDAI_CLUSTER_REPLICAS", "BACKENDAI_SESSION_ID", "BACKENDAI_DIST_MASTER_PORT",
    "SLURM_JOB_NODELIST", "SLURM_NODEID", "SLURM_NNODES", "SLURM_JOB_ID",
    "JOB_COMPLETION_INDEX", "HOSTNAME",
    "MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "WORLD_SIZE", "RANK",
    "PET_NPROC_PER_NODE", "TF_CONFIG", "LOCAL_RANK",
)  # fmt: skip

# Environment values cannot hold NUL or lone surrogates.
_text = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=40)
_plausible = st.one_of(
    st.integers(-3, 70000).map(str),
    st.sampled_from(["main1", "sub1,main1,sub2", "gpu[01-04,07],login1", "a,b,c", "main", "sub",
                     "mdns", "all", "torch", "tf", "ps:2", "1-2", "true", "json", "explicit",
                     '{"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":0}}']),
    _text,
)  # fmt: skip
environments = st.dictionaries(st.sampled_from(KEYS), _plausible, max_size=10)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(environ=environments, fmt=st.sampled_from(["json", "sh", "dotenv"]))
def test_derive_ends_in_an_env_or_one_error_line(environ: dict[str, str], fmt: str) -> None:
    env = clean_env(environ)
    result = CliRunner().invoke(app, ["derive", "--format", fmt], env=env)
    assert result.exit_code in (0, 2), (result.exit_code, result.stderr, result.exception)
    assert "Traceback" not in result.stderr
    event(f"exit {result.exit_code}")
    if result.exit_code == 2:
        lines = result.stderr.splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("error: ")
        assert result.stdout == ""
    elif fmt == "json":
        values = json.loads(result.stdout)
        assert {"NNODES", "NODE_RANK", "RALLYPOINT_GENERATION"} <= set(values)
        assert all(isinstance(value, str) for value in values.values())
