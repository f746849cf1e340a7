"""The deployment guides' snippets parse, and say what the shipped examples and the code do."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from rallypoint import providers
from tests.conftest import require

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "docs" / "deploy"
GUIDES = ("compose.md", "kubernetes.md", "backendai.md", "slurm.md")
COMPOSE = REPO / "docker" / "compose.yaml"
COMPOSE_MDNS = REPO / "docker" / "compose.mdns.yaml"

_FENCE = re.compile(r"^```([A-Za-z0-9_-]*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def snippets(guide: str, *languages: str) -> list[str]:
    """The fenced code blocks of a guide in one of the given languages."""
    text = (DEPLOY / guide).read_text(encoding="utf-8")
    return [body for lang, body in _FENCE.findall(text) if lang in languages]


def yaml_docs(guide: str) -> list[Any]:
    """Every YAML document of every yaml snippet of a guide."""
    return [doc for body in snippets(guide, "yaml", "yml") for doc in yaml.safe_load_all(body)]


def all_snippets() -> Iterator[tuple[str, str, int, str]]:
    for guide in GUIDES:
        text = (DEPLOY / guide).read_text(encoding="utf-8")
        for index, (lang, body) in enumerate(_FENCE.findall(text)):
            yield guide, lang, index, body


def load(path: Path) -> dict[str, Any]:
    value = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(value, dict)
    return value


# --- every guide, every snippet ----------------------------------------------------------


@pytest.mark.parametrize("guide", GUIDES)
def test_guide_has_a_runnable_snippet(guide: str) -> None:
    """Each guide carries at least one snippet to copy, and one of them runs rallypoint."""
    own = [body for name, _, _, body in all_snippets() if name == guide]
    assert own, f"{guide} has no code snippet"
    assert any("rallypoint" in body for body in own), f"no snippet of {guide} runs rallypoint"


@pytest.mark.parametrize(
    ("guide", "index", "body"),
    [
        pytest.param(g, i, b, id=f"{g}#{i}")
        for g, lang, i, b in all_snippets()
        if lang in {"yaml", "yml"}
    ],
)
def test_yaml_snippet_parses(guide: str, index: int, body: str) -> None:
    """yaml.safe_load accepts every YAML snippet, and none of its documents is empty."""
    docs = list(yaml.safe_load_all(body))
    assert docs, f"{guide} snippet {index} holds no YAML document"
    assert all(isinstance(doc, dict) and doc for doc in docs), f"{guide} snippet {index}"


@pytest.mark.parametrize(
    ("guide", "index", "body"),
    [
        pytest.param(g, i, b, id=f"{g}#{i}")
        for g, lang, i, b in all_snippets()
        if lang in {"sh", "bash", "shell"}
    ],
)
def test_shell_snippet_parses(guide: str, index: int, body: str) -> None:
    """`bash -n` accepts every shell snippet."""
    bash = shutil.which("bash")
    assert bash is not None
    done = subprocess.run([bash, "-n"], input=body, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{guide} snippet {index}: {done.stderr}"


# --- compose -------------------------------------------------------------------------------


def test_compose_guide_quotes_the_shipped_file() -> None:
    """The compose file printed in compose.md is docker/compose.yaml, value for value."""
    quoted = [doc for doc in yaml_docs("compose.md") if isinstance(doc, dict) and "services" in doc]
    assert len(quoted) == 1, "compose.md should quote docker/compose.yaml once"
    assert quoted[0] == load(COMPOSE)


def test_compose_guide_reports_the_image_size() -> None:
    text = (DEPLOY / "compose.md").read_text(encoding="utf-8")
    assert re.search(r"rallypoint:local[^\n]*\b\d+(\.\d+)? ?MB", text), "image size missing"


NODES = {COMPOSE: ("main1", "sub1", "sub2"), COMPOSE_MDNS: ("node-a", "node-b", "node-c")}


@pytest.mark.parametrize("path", list(NODES), ids=lambda p: p.name)
def test_compose_nodes_run_sidecar_init_trainer_in_order(path: Path) -> None:
    """Per node: a healthchecked sidecar, an init in its namespace, a trainer after the init."""
    services = load(path)["services"]
    assert set(services) == {f"{n}{s}" for n in NODES[path] for s in ("", "-init", "-trainer")}
    for node in NODES[path]:
        sidecar, init, trainer = (services[f"{node}{s}"] for s in ("", "-init", "-trainer"))
        assert sidecar["hostname"] == node
        assert sidecar["command"] == ["serve"]
        assert sidecar["healthcheck"]["test"] == ["CMD", "rallypoint", "check"]
        assert sidecar["read_only"] is True

        assert init["network_mode"] == f"service:{node}"
        assert init["command"][0] == "wait"
        assert init["command"][init["command"].index("--format") + 1] == "sh"
        out = init["command"][init["command"].index("--out") + 1]
        assert init["depends_on"][node]["condition"] in {"service_started", "service_healthy"}

        assert trainer["network_mode"] == f"service:{node}"
        assert trainer["depends_on"] == {
            f"{node}-init": {"condition": "service_completed_successfully"}
        }
        assert out in " ".join(trainer["entrypoint"])
        # Both see the same volume: the init writes it, the trainer reads it.
        volume = init["volumes"][0].split(":")[0]
        assert trainer["volumes"] == [f"{volume}:{Path(out).parent}:ro"]


def test_compose_mdns_runs_on_a_bridge_that_carries_multicast() -> None:
    data = load(COMPOSE_MDNS)
    for network in data["networks"].values():
        assert not (network or {}).get("internal", False), "internal networks drop multicast"
    for node in NODES[COMPOSE_MDNS]:
        env = data["services"][node]["environment"]
        assert env["RALLYPOINT_DISCOVERY"] == "mdns"
        assert env["RALLYPOINT_NNODES"] == "3"


def _sidecar_env(service: Mapping[str, Any]) -> dict[str, str]:
    env = dict(service["environment"])
    env["HOSTNAME"] = service["hostname"]
    return {key: str(value) for key, value in env.items() if "${" not in str(value)}


def test_compose_backendai_session_makes_main1_the_master() -> None:
    """The host list reads sub1,main1,sub2, and every node still agrees main1 is rank 0."""
    services = load(COMPOSE)["services"]
    specs = {node: providers.detect(_sidecar_env(services[node])) for node in NODES[COMPOSE]}
    assert services["main1"]["environment"]["BACKENDAI_CLUSTER_HOSTS"] == "sub1,main1,sub2"
    assert {spec.provider for spec in specs.values()} == {"backendai"}
    assert {spec.hosts for spec in specs.values()} == {("main1", "sub1", "sub2")}
    assert len({spec.session for spec in specs.values()}) == 1
    assert {node: spec.rank for node, spec in specs.items()} == {"main1": 0, "sub1": 1, "sub2": 2}


# --- kubernetes ----------------------------------------------------------------------------


def _kinds(guide: str) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml_docs(guide) if isinstance(doc, dict) and "kind" in doc}


def _sidecar(job: Mapping[str, Any]) -> dict[str, Any]:
    inits = job["spec"]["template"]["spec"]["initContainers"]
    native = [c for c in inits if c.get("restartPolicy") == "Always"]
    assert len(native) == 1, "one native sidecar (initContainer with restartPolicy: Always)"
    return dict(native[0])


def test_kubernetes_headless_service_publishes_not_ready_pods() -> None:
    kinds = _kinds("kubernetes.md")
    service, job = kinds["Service"], kinds["Job"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert job["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}


def test_kubernetes_sidecar_gates_startup_not_readiness() -> None:
    """The startup probe runs `rallypoint check` long enough; no readiness probe on peers."""
    job = _kinds("kubernetes.md")["Job"]
    sidecar = _sidecar(job)
    assert "serve" in sidecar["args"]
    probe = sidecar["startupProbe"]
    assert probe["exec"]["command"] == ["rallypoint", "check"]
    env = {item["name"]: item.get("value") for item in sidecar["env"]}
    deadline = float(env.get("RALLYPOINT_DEADLINE") or 300)
    assert probe["periodSeconds"] * probe["failureThreshold"] >= deadline
    assert "readinessProbe" not in sidecar
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == int(env["RALLYPOINT_NNODES"])


def test_kubernetes_pods_render_the_headless_service_names() -> None:
    """What the provider derives for each pod of the Job names the pods' DNS records."""
    kinds = _kinds("kubernetes.md")
    job = kinds["Job"]
    sidecar = _sidecar(job)
    env = {item["name"]: item["value"] for item in sidecar["env"] if "value" in item}
    name, nnodes = job["metadata"]["name"], job["spec"]["completions"]
    subdomain = job["spec"]["template"]["spec"]["subdomain"]
    expected = tuple(f"{name}-{i}.{subdomain}" for i in range(nnodes))
    for index in range(nnodes):
        pod_env = {**env, "JOB_COMPLETION_INDEX": str(index), "HOSTNAME": f"{name}-{index}"}
        spec = providers.detect(pod_env)
        assert (spec.provider, spec.hosts, spec.rank) == ("kubernetes", expected, index)


# --- slurm ---------------------------------------------------------------------------------


def test_slurm_script_runs_one_task_per_node_and_stops_the_sidecar() -> None:
    (script,) = [b for b in snippets("slurm.md", "sh", "bash") if "#SBATCH" in b]
    assert "--ntasks-per-node=1" in script
    assert "rallypoint serve &" in script
    assert re.search(r"rallypoint run (--\S+ \S+ )*-- torchrun", script), "the job runs supervised"
    assert "--restarts" in script, "a crash restarts inside the allocation (docs/run.md)"
    assert "--requeue" in script
    assert re.search(r"trap .*kill", script), "the sidecar must be stopped when training ends"


def test_kubernetes_job_runs_supervised_and_maps_run_s_statuses() -> None:
    """The trainer starts under `rallypoint run`; 75 recreates the pod, anything else fails."""
    job = _kinds("kubernetes.md")["Job"]
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never", "podFailurePolicy requires restartPolicy: Never"
    (trainer,) = pod["containers"]
    command = [*trainer.get("command", []), *trainer.get("args", [])]
    assert command[:2] == ["rallypoint", "run"] and "--" in command
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[0]["action"] == "Ignore"
    assert rules[0]["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
    by_code = {
        (rule["action"], rule["onExitCodes"]["operator"]): rule["onExitCodes"]
        for rule in rules
        if "onExitCodes" in rule
    }
    assert by_code[("Ignore", "In")]["values"] == [75]
    assert by_code[("FailJob", "NotIn")]["values"] == [75]
    assert all(codes["containerName"] == trainer["name"] for codes in by_code.values())
    # The Ignore on 75 comes before the FailJob on everything else: the first match decides.
    actions = [rule["action"] for rule in rules if "onExitCodes" in rule]
    assert actions == ["Ignore", "FailJob"]


def test_every_trainer_has_its_sidecar_s_token() -> None:
    """`run` proves the session secret on its writes: a trainer without it cannot start."""
    job = _kinds("kubernetes.md")["Job"]
    (trainer,) = job["spec"]["template"]["spec"]["containers"]
    secret = [item for item in _sidecar(job)["env"] if item["name"] == "RALLYPOINT_TOKEN"]
    assert [item for item in trainer.get("env", []) if item["name"] == "RALLYPOINT_TOKEN"] == secret
    for name in ("compose.yaml", "compose.mdns.yaml"):
        text = (Path(__file__).parents[2] / "docker" / name).read_text()
        compose = yaml.safe_load(text)
        for service, body in compose["services"].items():
            if service.endswith("-trainer"):
                env = body["environment"]
                assert env["RALLYPOINT_TOKEN"] == "${RALLYPOINT_TOKEN:-compose-demo-token}", service


def test_backendai_guide_launches_the_training_under_run() -> None:
    bodies = snippets("backendai.md", "sh", "bash")
    assert any("rallypoint run -- torchrun" in body for body in bodies)


#: The oldest Kubernetes the guide's manifests are for (podFailurePolicy is GA from 1.31;
#: native sidecars, initContainers with restartPolicy: Always, from 1.29) and the newest.
K8S_VERSIONS = ("1.31", "1.37")


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kubernetes_manifests_are_valid_for_kubernetes(version: str) -> None:
    require(
        importlib.util.find_spec("kubernetes_validate") is not None,
        "kubernetes-validate is not installed (pip install -e '.[test]')",
    )
    import kubernetes_validate

    docs = [d for d in yaml_docs("kubernetes.md") if isinstance(d, dict) and "kind" in d]
    builtin = [d for d in docs if "." not in d.get("apiVersion", "").split("/")[0]]
    assert {d["kind"] for d in builtin} >= {"Job", "Service"}
    for doc in builtin:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']} {doc['metadata'].get('name')}: {exc.message}")
