"""The error tree of sandrl.

Every error sandrl raises on purpose is a :class:`SandrlError`; each carries a
machine-readable ``error_code`` (used verbatim in HTTP error bodies) and a message
that says what went wrong *and what to do about it*.

::

    SandrlError
     ├── ConfigError                 bad user input: arguments, specs, config files
     │    └── InvalidSpecError       a SandboxSpec that cannot be honoured as written
     ├── SandboxError                anything about sandboxes
     │    ├── SandboxUnavailableError   the host cannot run sandboxes (missing bwrap, no cgroups...)
     │    ├── LimitUnsupportedError     a requested limit cannot be enforced on this host
     │    ├── SandboxCreateError        creating one sandbox failed
     │    ├── SandboxClosedError        the sandbox is closed (by the caller, TTL, or a crash)
     │    │    └── SandboxCrashedError  it died or hung on its own; says whether its own processes caused it
     │    ├── SandboxNotFoundError      no sandbox with that id
     │    ├── SandboxPausedError        the sandbox is paused: resume it first
     │    ├── CapacityExhaustedError    the host or pool is full
     │    ├── SandboxFileError          a file operation inside the sandbox failed
     │    │    └── SandboxFileTooLargeError  the file is larger than the read's bound (max_bytes)
     │    ├── SandboxRequestTooLargeError  a request (command, env, path) exceeds the agent's frame limit
     │    ├── ImageNotFoundError        no image of that name in the store
     │    ├── LayerTooLargeError        a snapshot's, fork's or build step's layer is over its bound
     │    ├── SandboxHostLostError      a fleet's sandbox host went away (retry on another host)
     │    └── PortForwardingUnsupportedError  this backend cannot forward a host port into its sandboxes
     ├── TaskError                   a task that cannot be loaded or run
     │    ├── InvalidTaskError       a task directory or instance file that is malformed
     │    └── ImageBuildError        an environment image could not be built (Dockerfile, failed step)
     ├── ImageError                  a registry image could not be had
     │    ├── RegistryError          the registry refused or failed (auth, not found, 429/5xx, unreachable)
     │    └── LayerError             what it served is wrong or hostile (digest mismatch, path escape, over a bound)
     ├── InferenceError              the policy's server failed or answered wrongly
     │    └── SessionNotFoundError   no gateway session with that id
     ├── TrainError                  the trainer could not take a step
     └── ClusterError                the Ray cluster: not reachable, a worker lost too often

A failed *command* inside a sandbox is not an error: it is an ``ExecResult`` with a
non-zero exit code. Errors are for the infrastructure and for bad input.
"""

from __future__ import annotations

from pathlib import Path


class SandrlError(Exception):
    """Base of every error sandrl raises on purpose."""

    error_code: str = "internal_error"
    http_status: int = 500

    def __init__(self, message: str, *, error_code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if error_code is not None:
            self.error_code = error_code

    def __str__(self) -> str:
        return self.message


class ConfigError(SandrlError):
    """Bad user input: command-line arguments, specs, config files."""

    error_code = "invalid_config"
    http_status = 400


class InvalidSpecError(ConfigError):
    """A SandboxSpec that cannot be honoured as written."""

    error_code = "invalid_spec"


class SandboxError(SandrlError):
    """Anything that went wrong with a sandbox."""

    error_code = "sandbox_error"


class InvalidCommandError(SandboxError):
    """A command that cannot be run as given: a NUL byte, an empty or oversized argv, an argument that is
    not a string (:func:`sandrl.sandbox.command.check_command`). Nothing was started."""

    error_code = "invalid_command"
    http_status = 400


class SandboxUnavailableError(SandboxError):
    """This host cannot run sandboxes of this kind (a tool, permission or kernel feature is missing)."""

    error_code = "sandbox_unavailable"
    http_status = 503


class LimitUnsupportedError(SandboxError):
    """A requested limit cannot be enforced on this host."""

    error_code = "limit_unsupported"
    http_status = 400


class SandboxCreateError(SandboxError):
    """Creating one sandbox failed."""

    error_code = "create_failed"


class SandboxClosedError(SandboxError):
    """The sandbox is closed: by the caller, by its TTL, or because its processes died."""

    error_code = "sandbox_closed"
    http_status = 410


class SandboxCrashedError(SandboxClosedError):
    """The sandbox ended, or stopped answering, without being closed by its caller or its TTL.

    ``caused_by_sandbox`` is True when the evidence (the memory cgroup's OOM kills, the agent's exit
    status) shows that the sandbox's own processes brought it down: for an RL episode that is the
    policy's failure, not the host's, and must not be retried away. The message holds the evidence.

    Over the wire only a crash the sandbox caused keeps this class (``sandbox_crashed``); one it did
    not cause travels as ``sandbox_closed``, which a client treats as the host's failure, as it is.
    """

    error_code = "sandbox_crashed"

    def __init__(self, message: str, *, caused_by_sandbox: bool = True, error_code: str | None = None) -> None:
        if error_code is None and not caused_by_sandbox:
            error_code = SandboxClosedError.error_code
        super().__init__(message, error_code=error_code)
        self.caused_by_sandbox = caused_by_sandbox


class SandboxNotFoundError(SandboxError):
    """No sandbox with that id."""

    error_code = "sandbox_not_found"
    http_status = 404


class SandboxPausedError(SandboxError):
    """The sandbox is paused (its processes frozen): commands and file calls wait for a resume."""

    error_code = "sandbox_paused"
    http_status = 409


class CapacityExhaustedError(SandboxError):
    """The host or the pool has no room for another sandbox."""

    error_code = "capacity_exhausted"
    http_status = 429


class SandboxFileError(SandboxError):
    """A file operation inside the sandbox failed (missing file, a directory, permissions...)."""

    error_code = "file_error"
    http_status = 400

    def __init__(self, message: str, *, errno: int = 0, error_code: str | None = None) -> None:
        super().__init__(message, error_code=error_code)
        self.errno = errno


class SandboxFileTooLargeError(SandboxFileError):
    """A file is larger than the bound its read was given (``max_bytes``); the read stopped one byte past it."""

    error_code = "file_too_large"
    http_status = 413


class SandboxRequestTooLargeError(SandboxError):
    """A request to a sandbox (a command with its env and cwd, a path) is larger than the agent's frame limit.

    Nothing was sent; the sandbox is unharmed. Large inputs go through ``stdin`` or ``write_file``,
    which are sent in chunks.
    """

    error_code = "request_too_large"
    http_status = 413


class ImageNotFoundError(SandboxError):
    """No image of that name in the image store."""

    error_code = "image_not_found"
    http_status = 404


class LayerTooLargeError(SandboxError):
    """A new layer (a snapshot's, a fork's, a build step's) would write more into the image store than
    it may: more than the sandbox's ``disk_mb`` as the store counts it, more files or deeper nesting
    than a layer holds, a file the store's filesystem cannot hold, or more than the store's free space
    less its reserve. Nothing of the layer is left in the store; the sandbox runs on."""

    error_code = "layer_too_large"
    http_status = 507


class SandboxHostLostError(SandboxError):
    """A sandbox host of a fleet stopped answering: its sandboxes are gone; another host may take the work."""

    error_code = "sandbox_host_lost"
    http_status = 503


class PortForwardingUnsupportedError(SandboxError):
    """Something that runs inside a sandbox needs a host service (a CLI agent, the session gateway)
    through a port forwarded into it, and this backend's sandboxes cannot have one."""

    error_code = "port_forwarding_unsupported"
    http_status = 400


class TaskError(SandrlError):
    """A task that cannot be loaded or run."""

    error_code = "task_error"
    http_status = 400


class InvalidTaskError(TaskError):
    """A task that cannot be loaded: a missing file, bad TOML/YAML/JSON, a wrong type, an unknown format.

    The message names the file, what is wrong and how to fix it; ``path`` is the task's path.
    """

    error_code = "invalid_task"

    def __init__(self, message: str, *, path: Path | None = None, error_code: str | None = None) -> None:
        super().__init__(message, error_code=error_code)
        self.path = path


class ImageBuildError(TaskError):
    """An image could not be built from a Dockerfile: an unsupported or malformed instruction
    (the message names the file and line), a missing build-context file, or a step that failed
    (its number, exit code and the end of its output)."""

    error_code = "image_build_failed"


class ImageError(SandrlError):
    """A container image could not be had from its registry (:mod:`sandrl.images`)."""

    error_code = "image_error"
    http_status = 502


class RegistryError(ImageError):
    """The registry refused or failed: bad credentials, no such repository or tag, rate limits or
    server errors that outlasted the retries, or no answer at all. The message names the
    reference, the registries tried and what to do."""

    error_code = "registry_error"


class LayerError(ImageError):
    """What a registry served is wrong or hostile: a manifest or blob whose digest is not the one
    asked for, a layer that writes outside its root, or one over a size bound. Nothing of it is kept."""

    error_code = "bad_layer"


class InferenceError(SandrlError):
    """The policy's inference server failed or answered wrongly."""

    error_code = "inference_error"
    http_status = 502


class SessionNotFoundError(InferenceError):
    """No session gateway session with that id (never opened, or deleted)."""

    error_code = "session_not_found"
    http_status = 404


class TrainError(SandrlError):
    """The trainer could not take a step."""

    error_code = "train_error"


class ClusterError(SandrlError):
    """The Ray cluster failed: it cannot be reached, or a rollout worker was lost more often than allowed."""

    error_code = "cluster_error"
    http_status = 503
