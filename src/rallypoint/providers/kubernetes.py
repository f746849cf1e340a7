"""The Kubernetes provider: an Indexed Job or a StatefulSet, host names from a template.

Kubernetes tells a pod its own index (JOB_COMPLETION_INDEX, or the StatefulSet ordinal at
the end of its host name) but not its peers' names, so every pod renders the same names
from RALLYPOINT_HOST_TEMPLATE for indices 0..RALLYPOINT_NNODES-1. Index 0 is the master.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from rallypoint.errors import ClusterSpecError
from rallypoint.model import ClusterSpec
from rallypoint.providers._common import (
    MAX_NODES,
    build,
    choose_session,
    digest,
    get,
    host_name,
    parse_int,
    require,
    session_id,
    show,
)

NAME = "kubernetes"
INDEX = "JOB_COMPLETION_INDEX"
TEMPLATE = "RALLYPOINT_HOST_TEMPLATE"
NNODES = "RALLYPOINT_NNODES"
JOB = "RALLYPOINT_JOB"
SUBDOMAIN = "RALLYPOINT_SUBDOMAIN"
NAMESPACE = "RALLYPOINT_NAMESPACE"

DEFAULT_TEMPLATE = "{job}-{index}.{subdomain}"
#: Template fields and the variables that fill them (first one set wins).
FIELDS: dict[str, tuple[str, ...]] = {
    "job": (JOB, "JOB_NAME"),
    "subdomain": (SUBDOMAIN,),
    "namespace": (NAMESPACE, "POD_NAMESPACE"),
}
_FIELD = re.compile(r"\{([^{}]*)\}")
_ORDINAL = re.compile(r"([a-z0-9](?:[a-z0-9-]*[a-z0-9])?)-([0-9]{1,9})")


def _ordinal(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """(set name, ordinal) from a StatefulSet-style HOSTNAME such as ``trainer-3``."""
    hostname = get(environ, "HOSTNAME")
    if hostname is None:
        return None
    match = _ORDINAL.fullmatch(hostname.split(".", 1)[0].lower())
    if match is None:
        return None
    return match.group(1), int(match.group(2))


def detects(environ: Mapping[str, str]) -> bool:
    """True for an Indexed Job pod, or a StatefulSet-style HOSTNAME with the template or size set.

    RALLYPOINT_DISCOVERY=mdns states the operator's intent, so a host name that merely ends
    in a number does not take precedence over it.
    """
    if get(environ, INDEX) is not None:
        return True
    if _ordinal(environ) is None:
        return False
    if get(environ, TEMPLATE) is not None:
        return True
    discovery = (get(environ, "RALLYPOINT_DISCOVERY") or "").lower()
    return get(environ, NNODES) is not None and discovery != "mdns"


def read(environ: Mapping[str, str]) -> ClusterSpec:
    """Nodes rendered from the template for every index; this pod is its own index."""
    nnodes_raw = require(
        environ, NNODES, "set it to the number of pods (the Job's completions or the replicas)"
    )
    nnodes = parse_int(NNODES, nnodes_raw, minimum=1, maximum=MAX_NODES)
    ordinal = _ordinal(environ)
    values = {field: _field(environ, keys) for field, keys in FIELDS.items()}

    raw_index = get(environ, INDEX)
    if raw_index is not None:
        kind = "indexed-job"
        index = parse_int(INDEX, raw_index, minimum=0, maximum=MAX_NODES - 1)
        # An Indexed Job pod's host name is "<job>-<index>": the job name is its prefix.
        if values["job"] is None and ordinal is not None and ordinal[1] == index:
            values["job"] = ordinal[0]
    elif ordinal is not None:
        kind = "statefulset"
        values["job"] = values["job"] or ordinal[0]
        index = ordinal[1]
    else:
        raise ClusterSpecError(
            f"neither {INDEX} nor a StatefulSet-style HOSTNAME (name-N) is set; run the sidecar"
            " in an Indexed Job or a StatefulSet, or choose another provider"
        )
    if index >= nnodes:
        source = INDEX if kind == "indexed-job" else "the HOSTNAME ordinal"
        raise ClusterSpecError(
            f"{source} is {index} but {NNODES}={nnodes}; set {NNODES} to the number of pods"
        )

    given = get(environ, TEMPLATE)
    template = given or DEFAULT_TEMPLATE
    label = f"{TEMPLATE}={show(template)}" if given else f"the default {TEMPLATE} {show(template)}"
    if "{" in _FIELD.sub("", template) or "}" in _FIELD.sub("", template):
        raise ClusterSpecError(f"{label} has an unmatched brace; write fields as {{name}}")
    hosts = [_render(template, label, values, i) for i in range(nnodes)]
    if nnodes > 1 and hosts[0] == hosts[1]:
        raise ClusterSpecError(f"{label} gives every pod the same name; include {{index}}")

    facts = [("kind", kind), ("index", str(index))]
    job, namespace = values["job"], values["namespace"]
    if job is not None:
        facts.append(("job", job))
    if namespace is not None:
        facts.append(("namespace", namespace))
    if job is not None:
        scope = f"{namespace}.{job}" if namespace is not None else job
        derived = session_id(f"{JOB} / JOB_NAME", f"k8s-{scope}")
    else:
        derived = f"k8s-{digest(*(host.lower() for host in hosts))}"
    return build(NAME, hosts, index, choose_session(environ, derived), facts=facts)


def _field(environ: Mapping[str, str], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = get(environ, key)
        if value is not None:
            return value
    return None


def _render(template: str, label: str, values: Mapping[str, str | None], index: int) -> str:
    """One host name: {index} and the FIELDS substituted; nothing else is interpreted."""

    def substitute(match: re.Match[str]) -> str:
        field = match.group(1)
        if field == "index":
            return str(index)
        if field not in FIELDS:
            known = ", ".join(["index", *FIELDS])
            raise ClusterSpecError(f"{label} uses unknown field {{{field}}}; known: {known}")
        value = values.get(field)
        if value is None:
            raise ClusterSpecError(f"{label} needs {{{field}}}; set {FIELDS[field][0]}")
        return value

    return host_name(TEMPLATE, _FIELD.sub(substitute, template))
