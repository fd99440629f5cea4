"""The supervisor (anyio on trio): streams the plan to the gofer, forwards signals, waits.

Sequence (the gofer's side is in gofer/protocol.py):
  1. parse the bundle and the GPU request; send Start so the gofer can begin unsharing
     and mounting the spec's mounts;                                   (sandbox/stream.py)
  2. discover the driver and walk the library closure, sending each action the moment it
     is known (the gofer applies them while we read the next ELF header), then End;
  3. here: read Ready (the gofer's spans) or Error; wait for the container and forward
     SIGINT/SIGTERM/SIGHUP to it; exit with its status (128+N for signal N).
The supervisor itself never unshares or mounts anything.
"""

from __future__ import annotations

import os
import signal
import socket
import time

import anyio

from gofer import protocol
from gofer.spans import Spans
from mounts.errors import SandboxError
from sandbox.state import StateDir

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class GoferFailed(SandboxError):
    """The gofer reported an error: the container never started."""


def exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


async def _wait_readable(sock: socket.socket) -> None:
    await anyio.wait_readable(sock)


async def _read_replies(sock: socket.socket) -> list:
    """Every frame the gofer sends until it execs (EOF: the socket is close-on-exec)."""
    replies = []
    while True:
        await _wait_readable(sock)
        try:
            msg = protocol.recv_reply(sock)
        except (ConnectionResetError, protocol.ProtocolError):
            return replies
        if msg is None:
            return replies
        replies.append(msg)


async def _wait_exit(pid: int) -> int:
    fd = os.pidfd_open(pid)
    try:
        await anyio.wait_readable(fd)
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    return status


async def _forward_signals(pid: int) -> None:
    with anyio.open_signal_receiver(*FORWARDED) as signals:
        async for signum in signals:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                return


async def _supervise(args, pid: int, sock: socket.socket, spans: Spans, state: StateDir,
                     error: BaseException | None) -> int:
    spans.add("event loop start", spans.items[-1].end_ns if spans.items else time.monotonic_ns())
    async with anyio.create_task_group() as tg:
        tg.start_soon(_forward_signals, pid)
        replies = await _read_replies(sock)  # until EOF: the gofer exec'd or exited
        for msg in replies:
            if isinstance(msg, protocol.Ready):
                state.running(msg.pid)
        status = await _wait_exit(pid)
        tg.cancel_scope.cancel()
    sock.close()

    gofer_spans = []
    failure = None
    for msg in replies:
        gofer_spans += msg.spans
        if isinstance(msg, protocol.Error):
            failure = msg.message
    if args.trace:
        import resource

        from sandbox.trace import write_trace

        spans.add("supervisor done", time.monotonic_ns(), maxrss_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        write_trace(args.trace, spans.items + gofer_spans)
    if error is not None:
        raise error
    code = exit_code(status)
    if failure is None and not any(isinstance(m, protocol.Ready) for m in replies):
        how = f"was killed by signal {code - 128}" if code > 128 else f"exited with status {code}"
        failure = f"the gofer {how} before the container started"
    if failure is not None:
        err = GoferFailed(failure)
        err.exit_code = code or 1  # 127 when exec failed
        raise err
    return code


def supervise(args, pid: int, sock: socket.socket, spans: Spans, state: StateDir,
              error: BaseException | None) -> int:
    """Step 3: wait for the gofer's replies and the container's exit under the event loop."""
    return anyio.run(_supervise, args, pid, sock, spans, state, error, backend="trio")
