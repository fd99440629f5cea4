"""The supervisor's wait (anyio on trio): forward SIGINT/SIGTERM/SIGHUP to the container and
wait for it to exit. Only imported once the container has started: the event loop costs
~100 ms to import, and nothing before this point needs it (see sandbox/run_cmd.py, sandbox/launch.py).
The supervisor itself never unshares or mounts anything."""

from __future__ import annotations

import os

import anyio

from sandbox.launch import FORWARDED


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


async def _supervise(pid: int) -> int:
    async with anyio.create_task_group() as tg:
        tg.start_soon(_forward_signals, pid)
        status = await _wait_exit(pid)
        tg.cancel_scope.cancel()
    return status


def wait_container(pid: int) -> int:
    """The wait status of ``pid`` (the gofer, which is or became the container), signals
    forwarded to it meanwhile."""
    return anyio.run(_supervise, pid, backend="trio")
