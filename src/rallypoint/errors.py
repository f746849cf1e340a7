"""One base error and a leaf per failure; only the cli package maps them to exit codes."""

from __future__ import annotations


class RallypointError(Exception):
    """Base of every error rallypoint raises on purpose; its message is one line."""


class ConfigError(RallypointError):
    """Raised when flags, settings or the environment are unusable (exit code 2)."""


class ClusterSpecError(ConfigError):
    """Raised when a provider's variables are missing, malformed or contradict each other."""


class TFConfigError(ConfigError):
    """Raised when a TF_CONFIG breaks TensorFlow's rules; names the JSON path at fault."""


class OverrideError(ConfigError):
    """Raised when a user-set value (environment or --set) fails validation."""


class PortError(RallypointError):
    """Raised when no port can be reserved and held."""


class AuthError(RallypointError):
    """Raised when a peer message is unsigned, stale, replayed or carries a bad signature."""

    def __init__(self, message: str, *, reason: str = "other", skew_s: float | None = None) -> None:
        super().__init__(message)
        #: A stable label: unsigned, malformed, stale, replayed, bad_signature, refused, other.
        self.reason = reason
        #: Set when the message was refused for its timestamp alone: the sender's clock minus
        #: the receiver's, in seconds (positive: the sender is ahead; docs/readiness.md#clocks).
        self.skew_s = skew_s


class PeerMessageError(RallypointError):
    """Raised when a peer message (join, cluster document, announcement) is malformed."""


class JoinRejected(PeerMessageError):
    """Raised when a peer request is well-formed but refused (wrong session, impostor ...)."""

    def __init__(self, status: int, code: str, message: str, *, said: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        #: The refusing peer's own words (its error line), when it gave them.
        self.said = message if said is None else said


class PeerDown(Exception):
    """Raised by the peer client when a peer cannot be reached (refused, reset, timed out).

    ``cause`` sorts it for the keep-alive (liveness.CAUSES): refused, timed_out, unreachable
    or failed.
    """

    def __init__(self, message: str, *, cause: str = "failed") -> None:
        super().__init__(message)
        self.cause = cause

    # Not a RallypointError: the rendezvous always catches it and retries, so it never
    # reaches the CLI's exit codes.


class RendezvousTimeout(RallypointError):
    """Raised when the rendezvous or a wait does not finish before its deadline (exit 3)."""


class NotReady(RallypointError):
    """Raised by clients when the local sidecar answers but is not ready (exit 1)."""

    def __init__(self, message: str, *, reasons: tuple[dict[str, object], ...] = ()) -> None:
        super().__init__(message)
        #: The sidecar's reasons as its API gives them ({"code", "message", ...}).
        self.reasons = reasons


class SidecarUnreachable(RallypointError):
    """Raised by clients when nothing answers on the local API address (exit 1)."""


class MeshUnavailable(RallypointError):
    """Raised when a node cannot show the mesh: it has not reached its master yet (409), or
    asking the master failed (502); ``status`` is the answer the APIs give."""

    def __init__(self, message: str, *, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


class SidecarError(RallypointError):
    """Raised by clients when the local API answers outside its contract (exit 1)."""


class WriteRefused(ConfigError):
    """Raised by `run` when its sidecar refuses a write (403): it does not have the
    sidecar's session token (exit 2; retrying cannot help)."""


class HostfileError(ConfigError):
    """Raised when no hostfile can be written: the slots per node are not a number."""
