"""``sandbox start ID``: release a created container's init (it execs the process), then run
the poststart hooks. Tiny on purpose: no event loop, no ELF, no plan."""

from __future__ import annotations

import errno
import os

from mounts.errors import SandboxError
from sandbox.state import FIFO, State, StateDir


def main(args) -> int:
    sd = StateDir(args.root, args.container_id)
    state = sd.load()
    if state.status != "created":
        raise SandboxError(f"cannot start container {state.id!r}: it is {state.status}, not created")
    release(sd, state)
    return 0


def release(sd: StateDir, state: State) -> None:
    """One byte into exec.fifo: the init, blocked reading it, goes on to exec. Non-blocking
    open: with no reader (the init died) it fails at once instead of hanging."""
    try:
        fd = sd.open(FIFO, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        why = "its init is gone" if e.errno == errno.ENXIO else e.strerror
        raise SandboxError(f"cannot start container {state.id!r}: {why}") from None
    try:
        os.write(fd, b"0")
    finally:
        os.close(fd)
    sd.unlink(FIFO)  # (a concurrent start of the same container may have unlinked it first)
    if state.poststart:
        from gofer.hooks import run_hooks, state_json

        try:
            run_hooks(state.hooks("poststart"), "poststart", state_json(state.id, "running", state.pid, state.bundle,
                                                              state.annotations))
        except SandboxError as e:

            from sandbox.messages import warn

            warn(str(e))
