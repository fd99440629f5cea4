"""A served verb's child gives the caller's stdio back before its code goes
(sandbox/server/requests.py): what it wrote arrives, and a caller reading the pipes to their
end sees that end while the child still lives (not once its memory is torn down)."""

from __future__ import annotations

import os
import select
import sys

from sandbox.server.requests import _let_go_of_stdio


def test_the_caller_sees_its_pipes_end_while_the_child_still_lives():
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe()
    done_r, done_w = os.pipe()  # (the child's own: it waits on it, alive, after letting go)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(done_w)
            for fd, target in ((in_r, 0), (out_w, 1), (err_w, 2)):
                os.dup2(fd, target)
            for fd in (in_r, out_w, err_w, out_r, err_r, in_w):
                os.close(fd)
            sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)  # (not pytest's)
            print("the verb's output", end="", flush=False)  # (in sys.stdout's buffer until let go)
            null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)  # (as _run_verb opens it, before the verb)
            _let_go_of_stdio(null)
            os.write(1, b"after")  # (to /dev/null now)
            if {os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 1, 2)} != {os.devnull} or os.path.exists(
                    f"/proc/self/fd/{null}"):
                raise AssertionError("stdio not on /dev/null, or our /dev/null still open")
            os.read(done_r, 1)
            code = 0
        finally:
            os._exit(code)
    for fd in (in_r, out_w, err_w, done_r):
        os.close(fd)
    try:
        got, ended = b"", False
        while not ended and select.select([out_r], [], [], 5)[0]:
            chunk = os.read(out_r, 4096)
            got, ended = got + chunk, not chunk
        assert got == b"the verb's output"
        assert ended, "no end of stdout while the child lives"
        assert select.select([err_r], [], [], 5)[0] and os.read(err_r, 10) == b"", "no end of stderr"
        assert os.waitpid(pid, os.WNOHANG) == (0, 0), "the child had gone: the test shows nothing"
    finally:
        os.close(done_w)
        status = os.waitpid(pid, 0)[1]
        for fd in (out_r, err_r, in_w):
            os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
