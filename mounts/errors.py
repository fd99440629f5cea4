"""Typed errors of the computation side. Each prints as one line a user can act on."""


class SandboxError(Exception):
    """Base of every error the CLI turns into a one-line message and an exit code."""

    exit_code = 1


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
