"""The supervisor <-> gofer protocol: length-prefixed msgpack frames over a socketpair.

::

    supervisor                                   gofer
    ----------                                   -----
    Start(spec, rootfs, ...)   ------------>     the launcher makes pid 1 (remote_init.clone),
                                                 the builder joins it: rootfs, spec mounts, devices
    Device/Library/Symlink/... ------------>     each applied as it arrives
    End                        ------------>     ld.so.cache
      (only with hooks_pause)  <------------     Paused(pid)
    run prestart/createRuntime hooks
    Resume                     ------------>     createContainer hooks, pivot_root, masks; pid 1
                                                 gets its process and becomes the user
                               <------------     Ready(spans, pid), then exit (pid 1 waits on
                                                 the exec FIFO until start)
                         (or)  <------------     Error(message, code, op, path), then exit code

Every frame is one tagged Struct (``kind``) validated on decode; a frame that does not
decode is a ProtocolError with the reason, never a half-applied request.
"""

from __future__ import annotations

import socket
import struct
from typing import Annotated

import msgspec

from gofer.spans import Span
from mounts.actions import Binary, Config, Device, Firmware, Ipc, LdCache, Library, ProcFs, Symlink
from mounts.errors import SandboxError
from mounts.spec import Spec

_LEN = struct.Struct("<I")
MAX_FRAME = 64 << 20


class Start(msgspec.Struct, frozen=True, tag_field="kind", tag="start"):
    spec: Spec
    rootfs: str  # host path of the root filesystem
    bundle: str
    trace: bool = False
    overlay_root: bool = False  # GPU files follow: give the whole root a private overlay first
    scratch_size: str | None = None  # size cap of the tmpfs under our overlays (None: Root's)
    id: str = ""
    exec_fifo: str = ""  # the init waits on this FIFO until start
    console_socket: str | None = None  # a new pty; its master goes to this socket
    preserve_fds: Annotated[int, msgspec.Meta(ge=0)] = 0  # the launcher's fds 3 .. 3+N-1 pass on to the container
    hooks_pause: bool = False  # stop before pivot_root for the runtime-namespace hooks
    launcher_fd: int = -1  # our fd of the launcher's connection (gofer/remote_init.py)


class Resume(msgspec.Struct, frozen=True, tag_field="kind", tag="resume"):
    pass


class Paused(msgspec.Struct, frozen=True, tag_field="kind", tag="paused"):
    pid: int  # the container's init as the host sees it


class End(msgspec.Struct, frozen=True, tag_field="kind", tag="end"):
    pass


class Ready(msgspec.Struct, frozen=True, tag_field="kind", tag="ready"):
    spans: list[Span]
    pid: int  # the container's pid as the host sees it


class Error(msgspec.Struct, frozen=True, tag_field="kind", tag="error"):
    """Why the gofer gave up: the one-line message, the exit code the CLI should return,
    and the operation and path where there is one (a SandboxError's fields)."""

    message: str
    code: int = 1
    op: str = ""
    path: str = ""

    def error(self) -> SandboxError:
        return SandboxError(self.message, op=self.op, path=self.path, code=self.code)


def error_frame(e: BaseException) -> Error:
    """The Error frame for any exception: a SandboxError keeps its code, op and path; an
    OSError (a SyscallError names its operation) or anything else is a plain failure."""
    if isinstance(e, SandboxError):
        return Error(str(e), e.exit_code, e.op, e.path)
    return Error(str(e) or type(e).__name__, 1, getattr(e, "op", ""), getattr(e, "filename", None) or "")


ToGofer = Start | End | Resume | Device | Library | Symlink | Binary | Firmware | Ipc | Config | LdCache | ProcFs
FromGofer = Ready | Error | Paused

_encoder = msgspec.msgpack.Encoder()
_to_gofer = msgspec.msgpack.Decoder(ToGofer)
_from_gofer = msgspec.msgpack.Decoder(FromGofer)


class ProtocolError(SandboxError):
    """A frame that is cut, too big or malformed: the reason, one line."""

    def __init__(self, message: str):
        super().__init__(f"the gofer's socket: {message}", op="protocol")


def frame(msg) -> bytes:
    body = _encoder.encode(msg)
    return _LEN.pack(len(body)) + body


def send(sock: socket.socket, msg) -> None:
    sock.sendall(frame(msg))


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            if buf:
                raise ProtocolError(f"peer closed the socket mid-frame ({len(buf)} of {n} bytes)")
            return None
        buf.extend(chunk)
    return bytes(buf)


def _recv(sock: socket.socket, decoder):
    head = _recv_exact(sock, _LEN.size)
    if head is None:
        return None
    (n,) = _LEN.unpack(head)
    if n > MAX_FRAME:
        raise ProtocolError(f"frame of {n} bytes is over the {MAX_FRAME} byte limit")
    body = _recv_exact(sock, n)
    if body is None:
        raise ProtocolError("peer closed the socket mid-frame")
    try:
        return decoder.decode(body)
    except msgspec.DecodeError as e:  # ValidationError included
        raise ProtocolError(f"bad frame: {e}") from None


def recv_request(sock: socket.socket) -> ToGofer | None:
    """The next frame for the gofer, or None at EOF."""
    return _recv(sock, _to_gofer)


def recv_reply(sock: socket.socket) -> FromGofer | None:
    """The next frame from the gofer, or None at EOF (the gofer exec'd or died)."""
    return _recv(sock, _from_gofer)
