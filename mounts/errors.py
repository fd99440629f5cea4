"""The one error model of all three packages. Every error a user can meet is a SandboxError:
it prints as one line a user can act on (what, which file, field or path, why) and carries the
exit code the CLI returns. Nothing below the CLI prints or exits (docs/design.md, "Errors")."""


class SandboxError(Exception):
    """Base of every error the CLI turns into a one-line message and an exit code.

    ``op`` and ``path`` name the failed operation and the path it was about, where there is
    one: the gofer sends both across the process boundary in its Error frame."""

    exit_code = 1

    def __init__(self, message: str, *, op: str = "", path: str = "", code: int | None = None):
        super().__init__(message)
        self.op = op
        self.path = path
        if code is not None:
            self.exit_code = code


class BundleError(SandboxError):
    """The bundle (config.json, rootfs) is missing or invalid: names the file and field."""

    exit_code = 2


class RequestError(SandboxError):
    """The GPU request is invalid: unknown device, capability, or a failed requirement."""

    exit_code = 2


class DriverError(SandboxError):
    """The driver root is unusable: names the path and what is wrong with it."""


class LdCacheError(SandboxError):
    """An ld.so.cache file is malformed: names the file and the offset."""


class ElfError(SandboxError):
    """An ELF file is truncated or malformed: names the file."""


class MountError(SandboxError):
    """A step that changes the container's view failed: names the container path, the
    operation and the reason."""

    def __init__(self, target: str, message: str, op: str = "mount"):
        super().__init__(f"{target}: {message}", op=op, path=target)
        self.target = target


class ProcessError(SandboxError):
    """The container's process could not be set up as the spec asks (user, capabilities,
    rlimits, cwd)."""


class ExecError(ProcessError):
    """execve failed: the container's command could not start (exit status 127, as shells)."""

    exit_code = 127
