"""ports: a held port keeps plain binds out and lets SO_REUSEADDR listeners in."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint.errors import PortError
from rallypoint.net import ports
from rallypoint.net.ports import HeldPort, Skipped, ephemeral_range, reserve
from tests.conftest import require
from tests.support.ports import worker_slice
from tests.support.tcpstore import run_tcpstore, torch_available

#: Starts the product's processes: no machine-measuring test runs beside it (conftest.py).
pytestmark = pytest.mark.starts_processes

# Below the sidecar's own range (20000-29999), which in-process sidecars on other workers
# reserve from, and Linux's ephemeral range; side by side, each worker its own slice. A port
# this module closed and binds again was once taken in between by another worker's test.
TEST_RANGE = worker_slice(12000, 13999)
OTHER_RANGE = worker_slice(14000, 15999)


def ipv6_available() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.fixture
def held() -> Iterator[HeldPort]:
    port = reserve([], TEST_RANGE)
    yield port
    port.close()


def bind(family: socket.AddressFamily, address: str, port: int, *, reuse: bool) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if reuse:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # dual-stack
        sock.bind((address, port))
    except OSError:
        sock.close()
        raise
    return sock


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("32768\t60999\n", (32768, 60999)),
        ("1024 5000", (1024, 5000)),
        ("garbage", ports.DEFAULT_EPHEMERAL_RANGE),
        ("5000 1024", ports.DEFAULT_EPHEMERAL_RANGE),
        ("", ports.DEFAULT_EPHEMERAL_RANGE),
    ],
)
def test_ephemeral_range_reads_the_file(
    tmp_path: Path, text: str, expected: tuple[int, int]
) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    assert ephemeral_range(str(path)) == expected


def test_ephemeral_range_falls_back_when_unreadable(tmp_path: Path) -> None:
    assert ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)


@pytest.mark.parametrize(
    ("family", "address", "v6only"),
    [
        (socket.AF_INET, "0.0.0.0", None),
        (socket.AF_INET, "127.0.0.1", None),
        (socket.AF_INET6, "::", 0),
        (socket.AF_INET6, "::", 1),
        (socket.AF_INET6, "::1", 1),
    ],
    ids=["0.0.0.0", "127.0.0.1", "::-dual-stack", "::-v6only", "::1"],
)
def test_plain_bind_by_another_process_fails(
    held: HeldPort, family: socket.AddressFamily, address: str, v6only: int | None
) -> None:
    if family == socket.AF_INET6:
        require(ipv6_available(), "IPv6 is not available on this host")
    family_name = "AF_INET6" if family == socket.AF_INET6 else "AF_INET"
    v6only_line = (
        ""
        if v6only is None
        else (f"sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, {v6only})")
    )
    script = textwrap.dedent(
        f"""
        import socket, sys
        sock = socket.socket(socket.{family_name}, socket.SOCK_STREAM)
        {v6only_line}
        try:
            sock.bind(({address!r}, {held.port}))
        except OSError as exc:
            sys.exit(f"bind failed: errno {{exc.errno}}")
        print("bound")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 1, done.stdout
    assert "errno 98" in done.stderr


@pytest.mark.parametrize(
    ("family", "address", "connect_to"),
    [
        (socket.AF_INET, "0.0.0.0", "127.0.0.1"),
        (socket.AF_INET6, "::", "127.0.0.1"),  # dual-stack listener, reached over IPv4
        (socket.AF_INET6, "::", "::1"),
    ],
)
def test_reuseaddr_listener_binds_listens_and_accepts(
    held: HeldPort, family: socket.AddressFamily, address: str, connect_to: str
) -> None:
    if family == socket.AF_INET6:
        require(ipv6_available(), "IPv6 is not available on this host")
    with bind(family, address, held.port, reuse=True) as listener:
        listener.listen(8)
        client = socket.create_connection((connect_to, held.port), timeout=5)
        accepted, _ = listener.accept()
        # Leaving the block closes the client first, so TIME_WAIT lands on its port, not ours.
        with accepted, client:
            client.sendall(b"ping")
            assert accepted.recv(4) == b"ping"
    assert held.held


def test_listener_without_reuseaddr_is_refused(held: HeldPort) -> None:
    with pytest.raises(OSError) as caught:
        bind(socket.AF_INET, "0.0.0.0", held.port, reuse=False)
    assert caught.value.errno == 98


def test_second_reserve_does_not_share_a_held_port(held: HeldPort) -> None:
    with reserve([held.port], TEST_RANGE) as other:
        assert other.port != held.port
        assert other.skipped == (Skipped(held.port, "in use"),)


def test_close_releases_the_port_and_is_idempotent() -> None:
    port = reserve([], TEST_RANGE)
    number = port.port
    port.close()
    port.close()
    assert not port.held
    with bind(socket.AF_INET, "0.0.0.0", number, reuse=False):
        pass


def test_context_manager_closes() -> None:
    with reserve([], TEST_RANGE) as port:
        number = port.port
        assert port.held
    assert not port.held
    with bind(socket.AF_INET, "0.0.0.0", number, reuse=False):
        pass


def test_free_preferred_port_is_taken_first() -> None:
    with reserve([], TEST_RANGE) as probe:
        free = probe.port
    with reserve([free], OTHER_RANGE) as port:
        assert port.port == free
        assert port.skipped == ()


@pytest.mark.parametrize("thief_address", ["0.0.0.0", "127.0.0.1"])
def test_taken_preferred_port_is_skipped_with_reason(thief_address: str) -> None:
    with reserve([], TEST_RANGE) as probe:
        taken = probe.port
    with bind(socket.AF_INET, thief_address, taken, reuse=False) as thief:
        thief.listen(1)
        with reserve([taken], TEST_RANGE) as port:
            assert port.port != taken
            assert TEST_RANGE[0] <= port.port <= TEST_RANGE[1]
            assert port.skipped == (Skipped(taken, "in use"),)


@pytest.mark.parametrize(
    ("preferred", "reason"),
    [
        (0, "not a port number (1-65535)"),
        (70000, "not a port number (1-65535)"),
    ],
)
def test_invalid_preferred_port_is_skipped(preferred: int, reason: str) -> None:
    with reserve([preferred], TEST_RANGE) as port:
        assert port.skipped == (Skipped(preferred, reason),)


def test_preferred_port_inside_ephemeral_range_is_skipped() -> None:
    low, high = ephemeral_range()
    with reserve([low, high], TEST_RANGE) as port:
        reason = f"inside the ephemeral range {low}-{high}"
        assert port.skipped == (Skipped(low, reason), Skipped(high, reason))
        assert not low <= port.port <= high


def test_range_overlapping_ephemeral_range_skips_it() -> None:
    low, high = ephemeral_range()
    require(low > 2, "ephemeral range starts too low to test around it")
    with reserve([], (low - 2, high)) as port:
        assert port.port < low


def test_avoided_ports_are_skipped() -> None:
    with reserve([], TEST_RANGE) as first:
        avoid = {first.port}
    with reserve([first.port], TEST_RANGE, avoid=avoid) as port:
        assert port.port not in avoid
        assert port.skipped[0].port == first.port
        assert "another port of this sidecar" in port.skipped[0].reason


def test_port_error_when_nothing_is_free(held: HeldPort) -> None:
    with pytest.raises(PortError) as caught:
        reserve([held.port], (held.port, held.port))
    message = str(caught.value)
    low, high = ephemeral_range()
    assert f"{held.port}-{held.port}" in message
    assert f"ephemeral range {low}-{high}" in message
    assert "RALLYPOINT_PORT_RANGE" in message
    assert f"{held.port} in use" in message


def test_port_error_for_an_empty_range() -> None:
    with pytest.raises(PortError, match="29999-20000"):
        reserve([], (29999, 20000))


@pytest.mark.torch
@pytest.mark.parametrize("use_libuv", [True, False], ids=["libuv", "legacy"])
def test_real_tcpstore_binds_the_held_port(held: HeldPort, use_libuv: bool) -> None:
    # CI installs torch, so a missing torch fails there instead of hiding this proof.
    require(torch_available(), "torch is not installed (pip install 'rallypoint[torch]')")
    done = run_tcpstore(held.port, use_libuv)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "ok"
    with pytest.raises(OSError):
        bind(socket.AF_INET, "0.0.0.0", held.port, reuse=False)
