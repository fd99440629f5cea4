"""The mount plan's actions: one frozen msgspec Struct per kind, tagged by ``kind``.

They are both the plan ``sandbox plan --json`` prints and the frames the supervisor streams
to the gofer, so the two can never disagree. ``source`` is a host path, ``target`` a path in
the container (resolved by the gofer inside the rootfs, never outside it).
"""

from __future__ import annotations

import msgspec

from mounts.ldcache import Entry

RO_LIB = ("ro", "nosuid", "nodev")
RO_DEV = ("ro", "nosuid", "noexec")
IPC = ("nosuid", "nodev", "noexec")


class Action(msgspec.Struct, frozen=True, tag_field="kind"):
    source: str
    target: str
    flags: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        return self.__struct_config__.tag  # type: ignore[return-value]  # every subclass tags with a str


class Library(Action, tag="library", frozen=True):
    pass


class Binary(Action, tag="binary", frozen=True):
    pass


class Firmware(Action, tag="firmware", frozen=True):
    pass


class Ipc(Action, tag="ipc", frozen=True):
    pass


class Config(Action, tag="config", frozen=True):
    """A loader's configuration file of the driver's (a Vulkan or EGL ICD, the OpenCL
    vendor file, nvoptix.bin), bound read-only where the loader looks; with ``data``, a file
    of that content (the host's with its library paths made the container's) instead."""

    data: str | None = None


class Device(Action, tag="device", frozen=True):
    major: int = 0
    minor: int = 0


class Symlink(Action, tag="symlink", frozen=True):
    """A link at ``target`` whose content is ``source`` (relative, in the same directory)."""


class LdCache(Action, tag="ldcache", frozen=True):
    """The container's ld.so.cache: the image's own entries plus ``entries``, written by
    the gofer into a private file bound read-only over ``target``."""

    entries: tuple[Entry, ...] = ()


class ProcFs(Action, tag="procfs", frozen=True):
    """A tmpfs at ``target`` with copies of the driver's proc files (``params`` with
    ModifyDeviceFiles set to 0), the selected GPUs' directories and the capability files
    ``files`` (MIG access files, relative to ``source``) bound read-only."""

    gpus: tuple[str, ...] = ()
    files: tuple[str, ...] = ()


AnyAction = Library | Binary | Firmware | Ipc | Config | Device | Symlink | LdCache | ProcFs
