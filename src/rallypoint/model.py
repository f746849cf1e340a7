"""Frozen values passed between the pure core and the I/O shell."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Literal

import msgspec

#: Framework names accepted in RALLYPOINT_FRAMEWORKS.
FRAMEWORKS = frozenset({"torch", "tf", "jax"})
#: Served when RALLYPOINT_FRAMEWORKS is unset; jax is served on request (docs/env-contract.md).
DEFAULT_FRAMEWORKS = frozenset({"torch", "tf"})

DEFAULT_MASTER_PORT = 29500
#: Preferred TF worker port: the one TensorFlow's own examples use.
DEFAULT_TF_PORT = 2222
#: Preferred JAX coordinator port: the one JAX's own Cloud TPU cluster detection uses.
DEFAULT_JAX_PORT = 8476
DEFAULT_LOCAL_PORT = 7780
DEFAULT_PEER_PORT = 7781

# -- the bounds a peer's message is decoded within ------------------------------------------
# msgspec checks them when it decodes (wire/fields.load), never when a value is built here.

#: Largest cluster a document may describe.
MAX_NODES = 65536
#: Largest number of addresses one node may report.
MAX_ADDRESSES = 64
#: What each text pattern of a message's fields asks for, in words (wire/fields.load says
#: these instead of the pattern when a peer's field does not match).
PATTERN_WORDS: dict[str, str] = {}


def within(low: float, high: float) -> msgspec.Meta:
    """A number's bounds, both included (msgspec refuses NaN and infinities besides)."""
    return msgspec.Meta(ge=low, le=high)


def at_most(count: int) -> msgspec.Meta:
    """A text's or a list's longest length."""
    return msgspec.Meta(max_length=count)


def matching(pattern: str, words: str) -> msgspec.Meta:
    """A text matching ``pattern`` (whole: start with ^, end with \\Z), ``words`` saying it.

    The words are registered when the annotation is evaluated: msgspec does it as it builds
    a struct's decoder, before that decoder reads any message.
    """
    PATTERN_WORDS[pattern] = words
    return msgspec.Meta(pattern=pattern, description=words)


def one_of(words: Iterable[str]) -> msgspec.Meta:
    """A text that is one of ``words``."""
    words = tuple(words)
    return matching(f"^(?:{'|'.join(map(re.escape, words))})\\Z", f"one of {', '.join(words)}")


Rank = Annotated[int, within(0, MAX_NODES - 1)]
#: A count of nodes.
Nodes = Annotated[int, within(0, MAX_NODES)]
Port = Annotated[int, within(1, 65535)]
#: Generations, epochs and interface names: the characters (query strings match them too).
TOKEN_CHARS = r"[A-Za-z0-9._:-]{1,64}"
TOKEN_WORDS = "1-64 characters of A-Z a-z 0-9 . _ : -"
Token = Annotated[str, matching(rf"^{TOKEN_CHARS}\Z", TOKEN_WORDS)]
#: A session name.
Session = Annotated[str, matching(r"^[\x21-\x7e]{1,256}\Z", "1-256 printable ASCII characters")]


class ClusterSpec(msgspec.Struct, frozen=True):
    """What a provider read from the orchestrator: the nodes, who we are, who is master.

    ``hosts`` is in node-rank order and the master is always node rank 0, because
    torch's env:// init and torchrun's static rendezvous start the TCPStore on rank 0.
    For the ``mdns`` provider ``hosts`` is empty until discovery fills it in.
    """

    provider: str
    hosts: tuple[str, ...]
    rank: int
    nnodes: int
    session: str
    #: Preferred master port from the orchestrator (e.g. BACKENDAI_DIST_MASTER_PORT).
    preferred_port: int | None = None
    #: All nodes share one network stack (single node, demo): loopback answers are fine.
    loopback_ok: bool = False
    #: Provider-specific facts worth showing in /status (role, index, job id ...).
    facts: tuple[tuple[str, str], ...] = ()

    @property
    def master(self) -> str:
        """The master's host name (node rank 0)."""
        return self.hosts[0]

    @property
    def host(self) -> str:
        """This node's host name."""
        return self.hosts[self.rank]

    @property
    def is_master(self) -> bool:
        return self.rank == 0


class Member(msgspec.Struct, frozen=True):
    """One node as it reported itself when it joined the rendezvous."""

    rank: Rank
    #: A host name or an IP literal (wire/fields.host_name checks it after decoding).
    host: str
    #: IP addresses (wire/fields.address checks and canonicalizes them after decoding).
    addresses: Annotated[tuple[str, ...], at_most(MAX_ADDRESSES)]
    #: The TF worker port this node's sidecar reserved, when TF_CONFIG is served.
    tf_port: Port | None = None
    #: The JAX coordinator port the master's sidecar reserved (rank 0 only, with jax served).
    jax_port: Port | None = None
    #: The ephemeral-range port its sidecar holds for connection probes (None: no probes).
    probe_port: Port | None = None


class ClusterDoc(msgspec.Struct, frozen=True):
    """The master's answer once every node joined: the rendezvous result."""

    session: Session
    generation: Token
    master_host: str
    master_port: Port
    members: Annotated[tuple[Member, ...], msgspec.Meta(min_length=1, max_length=MAX_NODES)]

    def member(self, rank: int) -> Member:
        return self.members[rank]


OverrideSource = Literal["environment", "--set"]


class Override(msgspec.Struct, frozen=True):
    """A contract variable the user set, which wins over the derived value."""

    key: str
    value: str
    derived: str | None
    source: OverrideSource


class DeriveOptions(msgspec.Struct, frozen=True):
    """Everything derivation needs besides the spec and the cluster document."""

    nproc_per_node: int = 1
    frameworks: frozenset[str] = DEFAULT_FRAMEWORKS
    #: TF_CONFIG layout: "workers", "chief", "ps:N", "evaluator" (see served/tfconfig.py).
    tf_layout: str = "workers"
    #: The master's verified address, served as MASTER_ADDR instead of its name.
    master_ip: str | None = None
    #: The local interface that routes to the master, served as GLOO_SOCKET_IFNAME.
    ifname: str | None = None
    #: Serve ``ifname`` as NCCL_SOCKET_IFNAME too (--emit-ifname; NCCL picks its own).
    nccl_ifname: bool = False
    #: User-set values of contract variables: key -> (value, source).
    user: Mapping[str, tuple[str, OverrideSource]] = msgspec.field(default_factory=dict)
    #: Offline only (no cluster document): the master port shown; None means the
    #: spec's preferred port, else DEFAULT_MASTER_PORT.
    master_port: int | None = None
    #: Offline only (no cluster document): every node's TF worker port.
    tf_port: int = DEFAULT_TF_PORT
    #: Offline only (no cluster document): the JAX coordinator port shown.
    jax_port: int = DEFAULT_JAX_PORT


class Env(msgspec.Struct, frozen=True):
    """The finished environment: contract variables only, in a stable order."""

    values: tuple[tuple[str, str], ...]
    overrides: tuple[Override, ...] = ()
    warnings: tuple[str, ...] = ()
    #: False for `rallypoint derive`: ports are the preferred ones, not reserved.
    reserved: bool = True

    def as_dict(self) -> dict[str, str]:
        return dict(self.values)

    def get(self, key: str) -> str | None:
        return dict(self.values).get(key)


def master_ports(
    preferred: int | None, provider: int | None, default: int = DEFAULT_MASTER_PORT
) -> list[int]:
    """The master ports to try, best first: --master-port, the provider's, the default.

    A user-set MASTER_PORT is not among them: it wins over all three and is taken
    exactly, never replaced by another port (overrides.user_port reads it).
    """
    return [port for port in (preferred, provider, default) if port is not None]
