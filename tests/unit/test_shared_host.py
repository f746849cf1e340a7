"""A shared host: each Slurm job's own port pair, and local writes that prove the token.

Two jobs on one node (Slurm without containers) would both want 7780/7781. With neither
port set, a job's sidecar and clients take the pair of its SLURM_JOB_ID (settings.job_ports);
a port set by flag or variable wins. With a session token, `run`'s writes carry the token's
proof (auth.Authenticator.local_proof) and anything else gets 403.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rallypoint import settings
from rallypoint.auth import Authenticator
from rallypoint.cli import config as cli_config
from rallypoint.cli import setup as cli_setup
from rallypoint.cli.commands import app
from rallypoint.errors import AuthError
from rallypoint.model import DEFAULT_LOCAL_PORT, DEFAULT_PEER_PORT
from rallypoint.settings import Settings


def built(command: str, args: list[str], environ: dict[str, str]) -> Settings:
    with app.commands[command].make_context(command, args) as ctx:
        return cli_config.build(ctx.params, cli_setup.from_env(ctx), environ)


@given(st.integers(min_value=0, max_value=10**12))
def test_a_job_s_pair_is_its_own_within_the_range(job: int) -> None:
    pair = settings.job_ports({"SLURM_JOB_ID": str(job)})
    assert pair is not None
    local, peer = pair
    assert peer == local + 1 and local % 2 == 0
    top = settings.JOB_PORT_BASE + 2 * settings.JOB_PORT_PAIRS
    assert settings.JOB_PORT_BASE <= local < peer < top
    # Consecutive jobs (Slurm numbers them in turn) never share a pair.
    assert settings.job_ports({"SLURM_JOB_ID": str(job + 1)}) != pair


@pytest.mark.parametrize("value", ["", "  ", "12a", "-3", "\uff11\uff12", "12.5"])
def test_no_job_id_gives_no_pair(value: str) -> None:
    assert settings.job_ports({"SLURM_JOB_ID": value}) is None
    assert settings.job_ports({}) is None


def test_the_pair_is_outside_the_ports_the_job_takes() -> None:
    low, _ = Settings().port_range
    top = settings.JOB_PORT_BASE + 2 * settings.JOB_PORT_PAIRS
    assert top <= low and top <= 32768  # below the master range and the ephemeral range


@pytest.mark.parametrize("command", ["serve", "wait", "run", "status", "check"])
def test_under_slurm_every_command_takes_the_job_s_pair(command: str) -> None:
    args = ["--", "true"] if command == "run" else []
    local, peer = settings.job_ports({"SLURM_JOB_ID": "4242"}) or (0, 0)
    got = built(command, args, {"SLURM_JOB_ID": "4242"})
    assert got.local_port == local
    if command == "serve":
        assert got.peer_port == peer
    outside = built(command, args, {})
    assert (outside.local_port, outside.peer_port) == (DEFAULT_LOCAL_PORT, DEFAULT_PEER_PORT)


def test_a_port_set_by_flag_or_variable_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    job = {"SLURM_JOB_ID": "4242"}
    _, peer = settings.job_ports(job) or (0, 0)
    got = built("serve", ["--local-port", "7790"], job)
    assert (got.local_port, got.peer_port) == (7790, peer)
    monkeypatch.setenv("RALLYPOINT_PEER_PORT", "7791")
    got = built("serve", [], job)
    assert got.peer_port == 7791


def test_run_reads_the_token_like_the_sidecar(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("s3cret\n")
    assert built("run", ["--", "true"], {"RALLYPOINT_TOKEN": "direct"}).token == "direct"
    assert built("run", ["--token-file", str(secret), "--", "true"], {}).token == "s3cret"


def test_a_local_write_proves_the_token_and_nothing_else_passes() -> None:
    auth = Authenticator("s3cret")
    proof = auth.local_proof()
    assert "s3cret" not in proof and len(proof) == 64
    auth.check_local(f"Bearer {proof}")
    auth.check_local(f"bearer {proof}")
    for header in (
        None,
        "",
        "Bearer",
        f"Basic {proof}",
        "Bearer " + Authenticator("x").local_proof(),
    ):
        with pytest.raises(AuthError) as caught:
            auth.check_local(header)
        assert "token" in str(caught.value) and "\n" not in str(caught.value)


def test_without_a_token_every_local_write_passes() -> None:
    Authenticator(None).check_local(None)
    Authenticator(None).check_local("Bearer anything")
