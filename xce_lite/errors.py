"""The error tree of xce_lite.

One base, a handful of kinds. Each kind says in its docstring whether retrying can help. Library
errors (apsw, paramiko, OSError) are translated into these where they enter the project, so that the
CLI and the API can turn any of them into a message that says what to do, and an exit code:

    2  bad input: the request was wrong and nothing was stored (SpecError, ConfigError, UsageError)
       or a host's SSH key to check before anything is sent to it (HostKeyError)
    3  the controller is not running or not reachable (ControllerDown)
    4  the job store cannot be used, or cannot take the request now (busy or disk full): nothing was
       stored (StoreError, StoreUnavailable); the message says what is wrong
    1  anything else (a refused transition, a store or host failure)
"""

from __future__ import annotations


class XceError(Exception):
    """Base of every error xce_lite raises on purpose. `exit_code` is what the CLI exits with."""

    exit_code = 1


class SpecError(XceError):
    """A job request is invalid, or could never be satisfied. Retrying the same request cannot help."""

    exit_code = 2


class ConfigError(XceError):
    """A configuration file is invalid. Fix the file; retrying cannot help."""

    exit_code = 2


class HomeError(XceError):
    """The cluster home is missing or unusable (no xce.yaml, a foreign file at the store path)."""

    exit_code = 2


class StoreError(XceError):
    """The job store cannot be used (corrupt, newer than this code). Needs an operator."""

    exit_code = 4


class StoreUnavailable(StoreError):
    """The job store cannot take a write now: another process holds its write lock, or its disk is
    full. Nothing was written. Retrying later helps (the controller's tick does so by itself)."""


class TransitionError(XceError):
    """A job cannot go from its state to the one asked (kill a finished job). Retrying cannot help."""


class NotFound(XceError):
    """No such job (or host, or queue)."""

    exit_code = 2


class ControllerDown(XceError):
    """The controller is not running or does not answer. Start it, then retry."""

    exit_code = 3


class ExecError(XceError):
    """Getting work onto a host failed."""


class HostUnreachable(ExecError):
    """The host or its agent does not answer. Retrying later can help."""


class LaunchRejected(ExecError):
    """The host refused the launch (bad cwd, no such user). Retrying the same launch cannot help."""


class HostKeyError(ExecError):
    """The host's SSH key cannot be trusted, so nothing was sent to it. Retrying cannot help until
    someone acts: the message says what to check and which command accepts the key."""

    exit_code = 2

    def __init__(self, message: str, fingerprint: str | None = None, path: str | None = None,
                 line: int | None = None) -> None:
        super().__init__(message)
        self.fingerprint = fingerprint  # the key the host showed, SHA256:... as OpenSSH prints it
        self.path, self.line = path, line  # the known_hosts line that holds the old key, if any


class HostKeyUnknown(HostKeyError):
    """No known_hosts file lists a key for the host: accept its key (`xce hosts add NAME --accept-new`)
    once its fingerprint is checked."""


class HostKeyChanged(HostKeyError):
    """The host shows a key other than the one listed for it (or a revoked one): someone may be in the
    middle, or the host was reinstalled. Never accepted automatically, not even with --accept-new."""
