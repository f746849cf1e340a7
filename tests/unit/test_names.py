"""names: the host-name rule, address classes, lookup verdicts, scope and the judgements on them."""

from __future__ import annotations

import ipaddress
import string

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rallypoint.core import links, names
from rallypoint.core.names import AUTO_ALL_MAX_NODES, HostProblem, Resolution, Verdict
from rallypoint.settings import Settings

P = HostProblem


@pytest.mark.parametrize(
    ("host", "ip", "lenient", "problem"),
    [
        ("node-1", False, False, None),
        ("gpu-01.cluster.local", False, False, None),
        ("x" * 63, False, False, None),
        (".".join(["x" * 63] * 3 + ["x" * 61]), False, False, None),  # 253 characters
        ("node.1", False, False, None),  # one alphabetic label is enough to be a name
        ("", False, False, P.EMPTY),
        ("", True, True, P.EMPTY),
        ("a.", False, False, P.TRAILING_DOT),
        ("a.", False, True, None),
        ("a..", False, True, P.TRAILING_DOT),
        (".", False, True, P.EMPTY),
        (".".join(["x" * 63] * 4), False, False, P.TOO_LONG),
        (".".join(["x" * 63] * 3 + ["x" * 61]) + ".", False, True, None),  # root dot not counted
        ("x" * 64, False, False, P.BAD_LABEL),
        ("-a", False, False, P.BAD_LABEL),
        ("a-", False, False, P.BAD_LABEL),
        ("a..b", False, False, P.BAD_LABEL),
        ("a b", False, False, P.BAD_LABEL),
        ("bad_host", False, False, P.BAD_LABEL),
        ("bad_host", False, True, None),
        ("_a_", False, True, None),
        ("nödé", False, True, P.BAD_LABEL),
        ("123", True, False, P.NUMERIC),
        ("999.1.1.1", True, False, P.NUMERIC),
        ("0x7f.1", True, False, P.NUMERIC),
        ("0x7f000001", True, True, P.NUMERIC),
        ("10.0.0.256", True, False, P.NUMERIC),
        ("010.0.0.1", True, False, P.NUMERIC),
        ("10.0.0.1", False, False, P.NUMERIC),
        ("10.0.0.1", True, False, None),
        ("fd00::1", True, False, None),
        ("fd00::1", False, True, P.BAD_LABEL),
        ("::ffff:10.0.0.1", True, False, None),
        ("fe80::1%eth0", True, False, P.ZONE_ID),
        ("fe80::1%eth0", True, True, P.ZONE_ID),
        ("fe80::1%eth0", False, False, P.BAD_LABEL),
        ("[fd00::1]", True, False, P.BAD_LABEL),
    ],
)
def test_host_problem(host: str, ip: bool, lenient: bool, problem: HostProblem | None) -> None:
    assert names.host_problem(host, ip=ip, lenient=lenient) is problem


LABELS = st.from_regex(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?", fullmatch=True)
NAMES = st.lists(LABELS, min_size=1, max_size=6).map(".".join)


def _inet_aton_number(label: str) -> bool:
    if label[:2].lower() == "0x":
        return all(c in string.hexdigits for c in label[2:])
    return label.isdigit()


@given(NAMES)
def test_a_name_is_refused_only_for_length_or_for_looking_like_a_number(host: str) -> None:
    problem = names.host_problem(host)
    if len(host) > 253:
        assert problem is HostProblem.TOO_LONG
    elif all(_inet_aton_number(label) for label in host.split(".")):
        assert problem is HostProblem.NUMERIC
    else:
        assert problem is None


@given(st.text(max_size=80))
def test_the_options_only_widen_the_rule(host: str) -> None:
    strict = names.host_problem(host)
    if strict is None:
        assert names.host_problem(host, ip=True) is None
        assert names.host_problem(host, lenient=True) is None
        assert names.host_problem(host + ".", lenient=True) is None
        assert len(host) <= 253 and not host.endswith(".")
        assert all(0 < len(label) <= 63 for label in host.split("."))


@given(st.ip_addresses())
def test_every_ip_literal_passes_with_ip_and_none_passes_as_a_name(ip: object) -> None:
    text = str(ip)
    assert names.host_problem(text, ip=True) is None
    assert names.host_problem(text) is not None
    assert names.host_problem(text, lenient=True) is not None


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1", True),
        ("127.0.1.1", True),
        ("127.255.255.254", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("::ffff:127.1.2.3", True),
        ("0.0.0.0", True),
        ("::", True),
        ("::ffff:0.0.0.0", True),
        ("10.0.0.1", False),
        ("128.0.0.1", False),
        ("126.255.255.255", False),
        ("::2", False),
        ("::ffff:10.0.0.1", False),
        ("fe80::1%eth0", False),
        ("::1%lo", True),
        ("2001:db8::1", False),
    ],
)
def test_is_loopback(address: str, expected: bool) -> None:
    assert names.is_loopback(address) is expected


def test_is_loopback_rejects_names() -> None:
    with pytest.raises(ValueError):
        names.is_loopback("localhost")


@given(st.ip_addresses(v=4))
def test_a_mapped_address_is_loopback_exactly_when_its_ipv4_is(ip: ipaddress.IPv4Address) -> None:
    assert names.is_loopback(f"::ffff:{ip}") is names.is_loopback(str(ip))
    assert names.canonical(f"::ffff:{ip}") == str(ip)


@pytest.mark.parametrize(
    ("address", "canonical"),
    [
        ("FD00:0:0::2", "fd00::2"),
        ("fe80::1%eth0", "fe80::1"),
        ("::ffff:10.0.0.1", "10.0.0.1"),
        ("10.0.0.1", "10.0.0.1"),
        ("node1", "node1"),
    ],
)
def test_canonical(address: str, canonical: str) -> None:
    assert names.canonical(address) == canonical


@given(st.ip_addresses())
def test_canonical_is_idempotent(ip: object) -> None:
    once = names.canonical(str(ip))
    assert names.canonical(once) == once


@pytest.mark.parametrize(
    ("found", "expected", "verdict"),
    [
        ([], None, Verdict.NOT_FOUND),
        (["10.0.0.2"], None, Verdict.OK),
        (["10.0.0.2"], [], Verdict.OK),
        (["10.0.0.2"], ["10.0.0.2"], Verdict.OK),
        (["10.0.0.2"], ["::ffff:10.0.0.2"], Verdict.OK),
        (["fd00::2"], ["FD00:0::2"], Verdict.OK),
        (["::ffff:10.0.0.2"], ["10.0.0.2"], Verdict.OK),
        (["10.0.0.2", "10.0.0.3"], ["10.0.0.3"], Verdict.OK),
        (["10.0.0.2"], ["10.0.0.9"], Verdict.MISMATCH),
        (["127.0.1.1"], None, Verdict.LOOPBACK),
        (["10.0.0.2", "127.0.1.1"], ["10.0.0.2"], Verdict.LOOPBACK),  # any, not only the first
        (["127.0.1.1"], ["10.0.0.9"], Verdict.LOOPBACK),  # loopback outranks a mismatch
    ],
)
def test_classify(found: list[str], expected: list[str] | None, verdict: Verdict) -> None:
    res = names.classify("node1", found, expected, elapsed_s=0.5)
    assert res.verdict is verdict
    assert (res.host, res.attempts, res.elapsed_s) == ("node1", 1, 0.5)
    assert res.addresses == tuple(found)
    assert "node1" in res.detail


def test_classify_drops_repeated_answers_in_order() -> None:
    res = names.classify("n", ["10.0.0.3", "10.0.0.2", "10.0.0.3"], None, elapsed_s=0.0)
    assert res.addresses == ("10.0.0.3", "10.0.0.2")


def test_failed_lookups_say_what_happened() -> None:
    assert names.timed_out("n", 2.0, elapsed_s=2.1).verdict is Verdict.TIMED_OUT
    assert "within 2s" in names.timed_out("n", 2.0, elapsed_s=2.1).detail
    gone = names.not_found("n", "Name or service not known", elapsed_s=0.1)
    assert (gone.verdict, gone.detail) == (
        Verdict.NOT_FOUND,
        "n does not resolve: Name or service not known",
    )
    assert names.no_attempt("n").attempts == 0


def _res(verdict: Verdict, *addresses: str, host: str = "node1") -> Resolution:
    return Resolution(host, verdict, addresses, f"{host} answers {addresses}", 1, 0.0)


@pytest.mark.parametrize("verdict", list(Verdict))
@pytest.mark.parametrize("accept", [False, True])
def test_settle_turns_only_an_accepted_loopback_into_ok(verdict: Verdict, accept: bool) -> None:
    res = _res(verdict, "127.0.1.1")
    settled = names.with_loopback_accepted(res, accept_loopback=accept)
    if accept and verdict is Verdict.LOOPBACK:
        assert settled.verdict is Verdict.OK and "accepted" in settled.detail
        assert msgspec.structs.replace(settled, verdict=res.verdict, detail=res.detail) == res
    else:
        assert settled is res


@pytest.mark.parametrize(
    ("verdict", "accept", "code"),
    [
        (Verdict.OK, False, None),
        (Verdict.LOOPBACK, False, "loopback_peer"),
        (Verdict.LOOPBACK, True, None),
        (Verdict.MISMATCH, False, "address_mismatch"),
        (Verdict.MISMATCH, True, "address_mismatch"),
        (Verdict.NOT_FOUND, False, "resolve_failed"),
        (Verdict.TIMED_OUT, True, "resolve_failed"),
    ],
)
def test_peer_reason(verdict: Verdict, accept: bool, code: str | None) -> None:
    reason = names.peer_reason(_res(verdict, "127.0.1.1"), accept_loopback=accept)
    assert (None if reason is None else reason.code) == code
    if reason is not None:
        assert reason.host == "node1" and "node1" in reason.message


@pytest.mark.parametrize(
    ("verdict", "accept", "code"),
    [
        (Verdict.OK, False, None),
        (Verdict.MISMATCH, False, None),  # the master reported nothing to mismatch yet
        (Verdict.LOOPBACK, False, "loopback_peer"),
        (Verdict.LOOPBACK, True, None),
        (Verdict.NOT_FOUND, True, "resolve_failed"),
        (Verdict.TIMED_OUT, False, "resolve_failed"),
    ],
)
def test_master_reason(verdict: Verdict, accept: bool, code: str | None) -> None:
    reason = names.master_reason(_res(verdict, host="master"), accept_loopback=accept)
    assert (None if reason is None else reason.code) == code
    if reason is not None:
        assert reason.host == "master" and "master" in reason.message


@pytest.mark.parametrize("verdict", list(Verdict))
def test_only_an_unaccepted_loopback_dials_self(verdict: Verdict) -> None:
    res = _res(verdict)
    assert names.dials_self(res, accept_loopback=False) is (verdict is Verdict.LOOPBACK)
    assert names.dials_self(res, accept_loopback=True) is False


@given(st.sampled_from(list(Verdict)), st.booleans(), st.sampled_from([None, "eth0"]))
def test_judge_own_without_strict_self_fails_only_on_an_unpinned_loopback(
    verdict: Verdict, accept: bool, ifname: str | None
) -> None:
    reason, warning = names.judge_own(
        _res(verdict, "127.0.1.1"),
        Settings().own_name_rules(),
        accept_loopback=accept,
        ifname=ifname,
    )
    fatal = verdict is Verdict.LOOPBACK and not accept and ifname is None
    assert (reason is not None) is fatal
    assert reason is None or (reason.code == "self_loopback" and warning is None)
    assert (warning is None) is (
        verdict is Verdict.OK or fatal or (verdict is Verdict.LOOPBACK and accept)
    )


@pytest.mark.parametrize(
    ("verdict", "accept", "lone", "ifname", "needle"),
    [
        (Verdict.OK, True, True, "eth0", None),
        (Verdict.MISMATCH, True, True, "eth0", None),  # a warning at best, never "fine"
        (Verdict.LOOPBACK, False, False, None, None),  # a problem: self_loopback
        (Verdict.LOOPBACK, False, True, None, "a single node"),
        (Verdict.LOOPBACK, True, False, None, "loopback is accepted"),
        (Verdict.LOOPBACK, False, False, "eth0", "gloo binds eth0 (GLOO_SOCKET_IFNAME)"),
    ],
)
def test_excuse_says_why_a_passed_verdict_is_fine(
    verdict: Verdict, accept: bool, lone: bool, ifname: str | None, needle: str | None
) -> None:
    text = names.why_acceptable(_res(verdict), accept_loopback=accept, lone=lone, ifname=ifname)
    assert (text is None) is (needle is None)
    assert text is None or needle in text


@pytest.mark.parametrize(
    ("emit_ifname", "jax", "needle"),
    [
        (True, False, "no interface that routes to the master"),
        (False, False, "drop --no-emit-ifname"),
        (True, True, "JAX's gloo ignores GLOO_SOCKET_IFNAME"),
        (False, True, "JAX's gloo ignores GLOO_SOCKET_IFNAME"),
    ],
)
def test_self_loopback_remedy(emit_ifname: bool, jax: bool, needle: str) -> None:
    reason = names.self_loopback_reason(
        "node1", ["127.0.1.1"], detail="d", emit_ifname=emit_ifname, jax=jax
    )
    assert reason.code == "self_loopback" and reason.detail == "d"
    assert needle in reason.message and "(127.0.1.1)" in reason.message


def test_loopback_reason_names_every_answer() -> None:
    reason = names.loopback_reason("node1", _res(Verdict.LOOPBACK, "10.0.0.2", "127.0.1.1"))
    assert "(10.0.0.2, 127.0.1.1)" in reason.message
    assert (reason.code, reason.host) == ("loopback_peer", "node1")


@given(
    st.integers(1, 300).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1))),
    st.sampled_from(names.SCOPES),
    st.text(max_size=8),
)
def test_scope_ranks_always_hold_the_master_and_this_node(
    size: tuple[int, int], scope: str, seed: str
) -> None:
    nnodes, rank = size
    ranks = names.scope_ranks(nnodes, rank, scope, seed=seed)
    assert ranks == sorted(set(ranks))
    assert {0, rank} <= set(ranks) <= set(range(nnodes))
    assert ranks == names.scope_ranks(nnodes, rank, scope, seed=seed)
    if scope == "all" or (scope == "auto" and nnodes <= AUTO_ALL_MAX_NODES):
        assert ranks == list(range(nnodes))
    elif scope == "master":
        assert set(ranks) == {0, rank}
    else:
        assert len(ranks) <= 5 + 8  # master, self, two neighbours, the stride peer, sample
        assert {(rank - 1) % nnodes, (rank + 1) % nnodes} <= set(ranks)
        assert set(links.measured_peers(nnodes, rank)) <= set(ranks)


def test_scope_all_and_small_auto_cover_every_rank_including_self() -> None:
    assert names.scope_ranks(4, 2, "all") == [0, 1, 2, 3]
    assert names.scope_ranks(AUTO_ALL_MAX_NODES, 5, "auto") == list(range(AUTO_ALL_MAX_NODES))


@pytest.mark.parametrize(("rank", "expected"), [(0, [0]), (3, [0, 3])])
def test_scope_master(rank: int, expected: list[int]) -> None:
    assert names.scope_ranks(10, rank, "master") == expected


@pytest.mark.parametrize("rank", [0, 1, 2047, 4095])
def test_scope_auto_large_session(rank: int) -> None:
    nnodes = 4096
    ranks = names.scope_ranks(nnodes, rank, "auto", sample=8, seed="job-17")
    stride = links.stride(nnodes)  # the second ring of measured links
    fixed = {0, rank, (rank - 1) % nnodes, (rank + 1) % nnodes, (rank + stride) % nnodes}
    assert fixed <= set(ranks)
    assert len(ranks) == len(fixed) + 8
    assert ranks == sorted(set(ranks))
    assert all(0 <= r < nnodes for r in ranks)
    # Deterministic for the same session, different for another one.
    assert names.scope_ranks(nnodes, rank, "auto", sample=8, seed="job-17") == ranks
    assert names.scope_ranks(nnodes, rank, "auto", sample=8, seed="job-18") != ranks


def test_scope_auto_spreads_the_sample_across_ranks() -> None:
    nnodes = 1000
    samples = [set(names.scope_ranks(nnodes, r, "auto", sample=8, seed="s")) for r in range(50)]
    assert len(set.union(*samples)) > 200


def test_scope_auto_sample_larger_than_the_rest() -> None:
    assert names.scope_ranks(70, 3, "auto", sample=1000) == list(range(70))


@pytest.mark.parametrize(
    ("nnodes", "rank", "scope", "sample"),
    [
        (0, 0, "all", 8),
        (4, 4, "all", 8),
        (4, -1, "all", 8),
        (4, 0, "some", 8),
        (100, 0, "auto", -1),
    ],
)
def test_scope_rejects_bad_input(nnodes: int, rank: int, scope: str, sample: int) -> None:
    with pytest.raises(ValueError):
        names.scope_ranks(nnodes, rank, scope, sample=sample)


@given(
    st.lists(
        st.integers(0, 300).map(str) | st.sampled_from(["00", "01", "010", "0x7f", "", "256"]),
        min_size=1,
        max_size=5,
    ).map(".".join)
)
def test_a_dotted_number_is_an_ip_exactly_when_ipaddress_reads_one(host: str) -> None:
    """host_problem reads IPv4 by a pattern, not ipaddress: the two must agree."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        is_ip = False
    else:
        is_ip = True
    assert (names.host_problem(host, ip=True) is None) is is_ip
    assert (names.host_problem(host, ip=True, lenient=True) is None) is is_ip
