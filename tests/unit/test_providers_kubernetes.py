"""The Kubernetes provider: Indexed Jobs and StatefulSets, names from the host template."""

from __future__ import annotations

import pytest

from rallypoint.errors import ClusterSpecError
from rallypoint.providers import detect
from tests.support.providers import assert_one_line_error

Env = dict[str, str]

# An Indexed Job pod: Kubernetes sets JOB_COMPLETION_INDEX and the host name <job>-<index>.
INDEXED = {
    "JOB_COMPLETION_INDEX": "2",
    "HOSTNAME": "train-2",
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "RALLYPOINT_NNODES": "4",
    "RALLYPOINT_SUBDOMAIN": "train-svc",
}


@pytest.mark.parametrize(
    ("environ", "hosts", "rank", "facts"),
    [
        (
            INDEXED,
            [f"train-{i}.train-svc" for i in range(4)],
            2,
            {"kind": "indexed-job", "index": "2", "job": "train"},
        ),
        (
            {**INDEXED, "RALLYPOINT_JOB": "llm", "HOSTNAME": "whatever"},
            [f"llm-{i}.train-svc" for i in range(4)],
            2,
            {"kind": "indexed-job", "index": "2", "job": "llm"},
        ),
        (
            {**INDEXED, "JOB_NAME": "ft", "POD_NAMESPACE": "ml"},
            [f"ft-{i}.train-svc" for i in range(4)],
            2,
            {"kind": "indexed-job", "index": "2", "job": "ft", "namespace": "ml"},
        ),
        (
            {
                **INDEXED,
                "RALLYPOINT_HOST_TEMPLATE": "{job}-{index}.{subdomain}.{namespace}.svc",
                "RALLYPOINT_NAMESPACE": "ml",
            },
            [f"train-{i}.train-svc.ml.svc" for i in range(4)],
            2,
            {"kind": "indexed-job", "index": "2", "job": "train", "namespace": "ml"},
        ),
        (
            {
                "JOB_COMPLETION_INDEX": "0",
                "RALLYPOINT_NNODES": "2",
                "RALLYPOINT_HOST_TEMPLATE": "w{index}",
            },
            ["w0", "w1"],
            0,
            {"kind": "indexed-job", "index": "0"},
        ),
        # StatefulSet: the ordinal comes from the pod's host name.
        (
            {"HOSTNAME": "trainer-1", "RALLYPOINT_NNODES": "3", "RALLYPOINT_SUBDOMAIN": "trainer"},
            [f"trainer-{i}.trainer" for i in range(3)],
            1,
            {"kind": "statefulset", "index": "1", "job": "trainer"},
        ),
        (
            {
                "HOSTNAME": "db-x-0",
                "RALLYPOINT_HOST_TEMPLATE": "{job}-{index}.h",
                "RALLYPOINT_NNODES": "1",
            },
            ["db-x-0.h"],
            0,
            {"kind": "statefulset", "index": "0", "job": "db-x"},
        ),
    ],
)
def test_pods(environ: Env, hosts: list[str], rank: int, facts: dict[str, str]) -> None:
    spec = detect(environ)
    assert (spec.provider, spec.hosts, spec.rank) == ("kubernetes", tuple(hosts), rank)
    assert dict(spec.facts) == facts


def test_every_pod_agrees_on_session_and_hosts() -> None:
    specs = [
        detect({**INDEXED, "JOB_COMPLETION_INDEX": str(i), "HOSTNAME": f"train-{i}"})
        for i in range(4)
    ]
    assert [spec.rank for spec in specs] == [0, 1, 2, 3]
    assert {spec.session for spec in specs} == {"k8s-train"}
    assert len({spec.hosts for spec in specs}) == 1
    namespaced = detect({**INDEXED, "POD_NAMESPACE": "ml"})
    assert namespaced.session == "k8s-ml.train"


@pytest.mark.parametrize(
    ("environ", "fragments"),
    [
        ({**INDEXED, "RALLYPOINT_NNODES": ""}, ["RALLYPOINT_NNODES is not set"]),
        ({**INDEXED, "RALLYPOINT_NNODES": "0"}, ["RALLYPOINT_NNODES='0'"]),
        (
            {**INDEXED, "RALLYPOINT_NNODES": "2"},
            ["JOB_COMPLETION_INDEX is 2", "RALLYPOINT_NNODES=2"],
        ),
        ({**INDEXED, "JOB_COMPLETION_INDEX": "-1"}, ["JOB_COMPLETION_INDEX='-1'"]),
        (
            {**INDEXED, "RALLYPOINT_SUBDOMAIN": ""},
            ["default RALLYPOINT_HOST_TEMPLATE", "{subdomain}", "RALLYPOINT_SUBDOMAIN"],
        ),
        ({**INDEXED, "HOSTNAME": "pod-x"}, ["{job}", "RALLYPOINT_JOB"]),
        (
            {**INDEXED, "RALLYPOINT_HOST_TEMPLATE": "{job}-{idx}"},
            ["unknown field {idx}", "index, job"],
        ),
        ({**INDEXED, "RALLYPOINT_HOST_TEMPLATE": "{job.__class__}-{index}"}, ["unknown field"]),
        ({**INDEXED, "RALLYPOINT_HOST_TEMPLATE": "{job}-{index"}, ["unmatched brace"]),
        ({**INDEXED, "RALLYPOINT_HOST_TEMPLATE": "{job}}-{index}"}, ["unmatched brace"]),
        ({**INDEXED, "RALLYPOINT_HOST_TEMPLATE": "{job}.{subdomain}"}, ["same name", "{index}"]),
        (
            {**INDEXED, "RALLYPOINT_HOST_TEMPLATE": "{job}_{index}"},
            ["RALLYPOINT_HOST_TEMPLATE", "'train_0'"],
        ),
        ({**INDEXED, "RALLYPOINT_HOST_TEMPLATE": "{index}"}, ["looks like a number"]),
        ({**INDEXED, "RALLYPOINT_JOB": "a b"}, ["'a b-0.train-svc'"]),
        ({**INDEXED, "RALLYPOINT_SESSION": "?"}, ["RALLYPOINT_SESSION='?'"]),
    ],
)
def test_errors(environ: Env, fragments: list[str]) -> None:
    assert_one_line_error(environ, fragments)


def test_forced_without_an_index_or_ordinal() -> None:
    with pytest.raises(ClusterSpecError, match="JOB_COMPLETION_INDEX"):
        detect({"RALLYPOINT_NNODES": "2", "HOSTNAME": "laptop"}, "kubernetes")
