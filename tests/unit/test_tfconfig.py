"""TF_CONFIG: building every layout and validating by TensorFlow's rules, path in every error."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint.core import names
from rallypoint.errors import ConfigError, TFConfigError
from rallypoint.served import tfconfig

A = [f"n{i}:2222" for i in range(6)]


def tf(cluster: Any, task: Any) -> dict[str, Any]:
    return {"cluster": cluster, "task": task}


@pytest.mark.parametrize(
    ("host", "port", "expected"),
    [
        ("node-1", 2222, "node-1:2222"),
        ("10.0.0.7", 1, "10.0.0.7:1"),
        ("fd00::7", 2222, "[fd00::7]:2222"),
        ("::1", 65535, "[::1]:65535"),
        ("[fd00::7]", 2222, "[fd00::7]:2222"),
    ],
)
def test_format_address_brackets_ipv6(host: str, port: int, expected: str) -> None:
    assert tfconfig.format_address(host, port) == expected


W = "worker"
LAYOUT_CASES = [
    # layout, nnodes, rank, cluster, task
    ("workers", 1, 0, {W: A[:1]}, (W, 0)),
    ("workers", 3, 2, {W: A[:3]}, (W, 2)),
    ("chief", 1, 0, {"chief": A[:1]}, ("chief", 0)),
    ("chief", 3, 0, {"chief": A[:1], W: A[1:3]}, ("chief", 0)),
    ("chief", 3, 1, {"chief": A[:1], W: A[1:3]}, (W, 0)),
    ("chief", 3, 2, {"chief": A[:1], W: A[1:3]}, (W, 1)),
    ("evaluator", 2, 0, {W: A[:1]}, (W, 0)),
    ("evaluator", 4, 2, {W: A[:3]}, (W, 2)),
    ("evaluator", 4, 3, {W: A[:3]}, ("evaluator", 0)),
    ("ps:1", 3, 0, {"chief": A[:1], W: A[1:2], "ps": A[2:3]}, ("chief", 0)),
    ("ps:1", 3, 1, {"chief": A[:1], W: A[1:2], "ps": A[2:3]}, (W, 0)),
    ("ps:1", 3, 2, {"chief": A[:1], W: A[1:2], "ps": A[2:3]}, ("ps", 0)),
    ("ps:2", 6, 3, {"chief": A[:1], W: A[1:4], "ps": A[4:6]}, (W, 2)),
    ("ps:2", 6, 5, {"chief": A[:1], W: A[1:4], "ps": A[4:6]}, ("ps", 1)),
]


@pytest.mark.parametrize(("layout", "nnodes", "rank", "cluster", "task"), LAYOUT_CASES)
def test_build_layouts(
    layout: str, nnodes: int, rank: int, cluster: dict[str, list[str]], task: tuple[str, int]
) -> None:
    built = tfconfig.build(A[:nnodes], rank, layout)
    assert built == {"cluster": cluster, "task": {"type": task[0], "index": task[1]}}
    assert tfconfig.validate(built) == built


def test_evaluator_is_not_in_its_own_cluster() -> None:
    built = tfconfig.build(A[:3], 2, "evaluator")
    assert A[2] not in json.dumps(built["cluster"])


@pytest.mark.parametrize("layout", ["workers", "chief", "evaluator", "ps:1", "ps:2"])
@pytest.mark.parametrize("nnodes", [1, 2, 3, 4, 5])
def test_every_built_config_validates(layout: str, nnodes: int) -> None:
    for rank in range(nnodes):
        try:
            built = tfconfig.build(A[:nnodes], rank, layout)
        except ConfigError as exc:
            assert "needs at least" in str(exc)
            continue
        tfconfig.validate(built)
        tfconfig.validate(tfconfig.dumps(built))


@pytest.mark.parametrize(
    "layout", ["", "worker", "chiefs", "ps", "ps:", "ps:0", "ps:-1", "ps:x", "PS:1", " workers"]
)
def test_unknown_layout_is_config_error(layout: str) -> None:
    with pytest.raises(ConfigError, match="TF layout"):
        tfconfig.build(A[:4], 0, layout)


@pytest.mark.parametrize(
    ("nnodes", "rank", "layout", "match"),
    [
        (1, 0, "evaluator", "at least 2 nodes"),
        (3, 0, "ps:2", "at least 4 nodes"),
        (3, 3, "workers", "out of range"),
        (3, -1, "workers", "out of range"),
        (0, 0, "workers", "at least one"),
    ],
)
def test_build_refuses_impossible_layouts(nnodes: int, rank: int, layout: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        tfconfig.build(A[:nnodes], rank, layout)


VALID = [
    tf({W: ["a:1", "b:1"]}, {"type": W, "index": 1}),
    tf({"chief": ["a:1"], W: ["b:1"], "ps": ["c:1", "d:1"]}, {"type": "ps", "index": 1}),
    tf({W: ["a:1"]}, {"type": "evaluator", "index": 0}),
    tf({W: ["a:1"], "evaluator": ["e:1"]}, {"type": "evaluator", "index": 0}),
    tf({W: ["[fd00::1]:2222", "[fd00::2]:2222"]}, {"type": W, "index": 0}),
    tf({W: ["10.0.0.1:2222", "10.0.0.1:2223"]}, {"type": W, "index": 0}),
    {**tf({W: ["a.example.com:1"]}, {"type": W, "index": 0}), "rpc_layer": "grpc"},
]


@pytest.mark.parametrize("config", VALID)
def test_valid_configs_pass_as_dict_and_string(config: dict[str, Any]) -> None:
    assert tfconfig.validate(config) == config
    assert tfconfig.validate(json.dumps(config)) == config


OK_TASK = {"type": W, "index": 0}
INVALID = [
    # (TF_CONFIG, path named in the message, a word of the problem)
    ("", "TF_CONFIG", "not valid JSON"),
    ("{", "TF_CONFIG", "not valid JSON"),
    ("[]", "TF_CONFIG", "JSON object"),
    ('"x"', "TF_CONFIG", "JSON object"),
    ('{"cluster": {}, "cluster": {}, "task": {}}', "TF_CONFIG", "appears twice"),
    ({"task": OK_TASK}, "TF_CONFIG.cluster", "missing"),
    (tf([], OK_TASK), "TF_CONFIG.cluster", "object"),
    (tf({"master": ["a:1"]}, OK_TASK), "TF_CONFIG.cluster.master", "not one of"),
    (tf({"my job": ["a:1"]}, OK_TASK), 'TF_CONFIG.cluster["my job"]', "not one of"),
    (tf({W: "a:1"}, OK_TASK), "TF_CONFIG.cluster.worker", "must be a list"),
    (tf({W: []}, OK_TASK), "TF_CONFIG.cluster.worker", "empty"),
    (tf({"chief": ["a:1", "b:1"], W: ["c:1"]}, OK_TASK), "TF_CONFIG.cluster.chief", "at most one"),
    (
        tf({W: ["c:1"], "evaluator": ["a:1", "b:1"]}, OK_TASK),
        "TF_CONFIG.cluster.evaluator",
        "at most one",
    ),
    (tf({W: ["a:1", 7]}, OK_TASK), "TF_CONFIG.cluster.worker[1]", "string"),
    (tf({W: ["a:1", "b:1", "c"]}, OK_TASK), "TF_CONFIG.cluster.worker[2]", "not host:port"),
    (tf({W: [":1"]}, OK_TASK), "TF_CONFIG.cluster.worker[0]", "not host:port"),
    (tf({W: ["a:0"]}, OK_TASK), "TF_CONFIG.cluster.worker[0]", "1..65535"),
    (tf({W: ["a:65536"]}, OK_TASK), "TF_CONFIG.cluster.worker[0]", "1..65535"),
    (tf({W: ["a:+1"]}, OK_TASK), "TF_CONFIG.cluster.worker[0]", "1..65535"),
    (tf({W: ["a:"]}, OK_TASK), "TF_CONFIG.cluster.worker[0]", "1..65535"),
    (tf({W: ["fd00::1:2222"]}, OK_TASK), "TF_CONFIG.cluster.worker[0]", "brackets"),
    (tf({W: ["[fd00::zz]:2222"]}, OK_TASK), "TF_CONFIG.cluster.worker[0]", "bracketed IPv6"),
    (tf({W: ["[10.0.0.1]:2222"]}, OK_TASK), "TF_CONFIG.cluster.worker[0]", "bracketed IPv6"),
    (tf({W: ["bad_host:1"]}, OK_TASK), "TF_CONFIG.cluster.worker[0]", "RFC 1123"),
    (tf({W: ["grpc://a:1"]}, OK_TASK), "TF_CONFIG.cluster.worker[0]", "no scheme"),
    (tf({W: ["a:1", "A:1"]}, OK_TASK), "TF_CONFIG.cluster.worker[1]", "repeats"),
    (tf({W: ["a:1"], "ps": ["a:1"]}, OK_TASK), "TF_CONFIG.cluster.ps[0]", "repeats"),
    (tf({W: ["[fd00::1]:1", "[fd00:0::1]:1"]}, OK_TASK), "TF_CONFIG.cluster.worker[1]", "repeats"),
    ({"cluster": {W: ["a:1"]}}, "TF_CONFIG.task", "missing"),
    (tf({W: ["a:1"]}, [W, 0]), "TF_CONFIG.task", "object"),
    (tf({W: ["a:1"]}, {"index": 0}), "TF_CONFIG.task.type", "missing"),
    (tf({W: ["a:1"]}, {"type": "master", "index": 0}), "TF_CONFIG.task.type", "not one of"),
    (tf({W: ["a:1"]}, {"type": 1, "index": 0}), "TF_CONFIG.task.type", "not one of"),
    (tf({W: ["a:1"]}, {"type": "chief", "index": 0}), "TF_CONFIG.task.type", "no job"),
    (tf({W: ["a:1"]}, {"type": "ps", "index": 0}), "TF_CONFIG.task.type", "no job"),
    (tf({W: ["a:1"]}, {"type": W}), "TF_CONFIG.task.index", "missing"),
    (tf({W: ["a:1"]}, {"type": W, "index": "0"}), "TF_CONFIG.task.index", "integer"),
    (tf({W: ["a:1"]}, {"type": W, "index": True}), "TF_CONFIG.task.index", "integer"),
    (tf({W: ["a:1"]}, {"type": W, "index": 0.0}), "TF_CONFIG.task.index", "integer"),
    (tf({W: ["a:1"]}, {"type": W, "index": None}), "TF_CONFIG.task.index", "integer"),
    (tf({W: ["a:1", "b:1"]}, {"type": W, "index": 2}), "TF_CONFIG.task.index", "out of range"),
    # TensorFlow itself accepts -1 (Python indexing wraps it to the last task).
    (tf({W: ["a:1", "b:1"]}, {"type": W, "index": -1}), "TF_CONFIG.task.index", "out of range"),
    (tf({W: ["a:1"]}, {"type": "evaluator", "index": 1}), "TF_CONFIG.task.index", "out of range"),
    ({**tf({W: ["a:1"]}, OK_TASK), "rpc_layer": 1}, "TF_CONFIG.rpc_layer", "string"),
]


@pytest.mark.parametrize(("config", "path", "problem"), INVALID)
def test_each_rule_names_the_json_path(config: Any, path: str, problem: str) -> None:
    text = config if isinstance(config, str) else json.dumps(config)
    with pytest.raises(TFConfigError) as info:
        tfconfig.validate(text)
    message = str(info.value)
    assert message.startswith(path), message
    assert problem in message
    assert "\n" not in message


def test_mapping_input_that_is_not_json_is_refused() -> None:
    with pytest.raises(TFConfigError, match="JSON"):
        tfconfig.validate({"cluster": {W: [object()]}, "task": OK_TASK})


def test_deep_nesting_is_a_clear_error() -> None:
    with pytest.raises(TFConfigError):
        tfconfig.validate("[" * 100_000 + "]" * 100_000)


@pytest.mark.parametrize(
    ("host", "valid"),
    [
        ("node-1", True),
        ("a.b-c.example", True),
        ("x" * 63, True),
        ("x" * 64, False),
        ("-a", False),
        ("a-", False),
        ("a..b", False),
        ("a.", False),
        ("", False),
        ("bad_host", False),
        ("999.1.1.1", False),
        ("0x7f.1", False),
        ("10.0.0.1", True),
        ("fd00::1", True),
        ("fe80::1%eth0", False),
        ("[fd00::1]", False),
    ],
)
def test_valid_host(host: str, valid: bool) -> None:
    # TF hosts and MASTER_ADDR follow names.host_problem with IP literals allowed.
    assert (names.host_problem(host, ip=True) is None) is valid


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
ADDRESS = st.one_of(
    st.sampled_from(["a:1", "b:2222", "[::1]:1", "::1:1", "10.0.0.1:0", "a:1", "x", 3]),
    st.text(max_size=12),
)
TFISH = st.fixed_dictionaries(
    {
        "cluster": st.dictionaries(
            st.sampled_from([*tfconfig.JOBS, "master", ""]), st.lists(ADDRESS, max_size=3) | JSON
        )
        | JSON,
        "task": st.fixed_dictionaries(
            {},
            optional={
                "type": st.sampled_from([*tfconfig.JOBS, "client"]) | JSON,
                "index": st.integers(-2, 3) | JSON,
            },
        )
        | JSON,
    }
)


def _validate_or_error(config: object) -> None:
    try:
        result = tfconfig.validate(config if isinstance(config, str) else json.dumps(config))
    except TFConfigError as exc:
        assert str(exc).startswith("TF_CONFIG")
        assert "\n" not in str(exc)
    else:
        assert isinstance(result, dict)


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_arbitrary_json_gives_dict_or_tfconfigerror(config: object) -> None:
    _validate_or_error(config)


@settings(max_examples=200, deadline=None)
@given(TFISH)
def test_tf_config_shaped_json_gives_dict_or_tfconfigerror(config: object) -> None:
    _validate_or_error(config)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_arbitrary_text_gives_dict_or_tfconfigerror(text: str) -> None:
    _validate_or_error(text)
