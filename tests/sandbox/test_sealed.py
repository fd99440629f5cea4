"""What reaches a container cannot be written through /proc/<pid>/exe: the launcher runs
itself (exec, create, run) and a server's interpreter from a read-only bind mount of the
file, or where the kernel refuses that mount (here: a user namespace's root, whose mount
namespace is the host's), from a sealed memfd copy (sandbox/executor/launcher.c)."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import struct
import subprocess
import sys
import time

import pytest

from sandbox.executor.build import write_launcher
from sandbox.executor.wire import c_string


def _exe_after_exit(argv: list[str]) -> tuple[int, bool, int]:
    """Hold /proc/<pid>/exe of a process while it runs, reopen it for writing once it is gone
    (CVE-2019-5736's way): (the errno, 0 if it opened; whether its mount is read-only; its
    inode)."""
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)  # `sandbox hook` then waits for the state on stdin
        fd = os.open(f"/proc/{p.pid}/exe", os.O_PATH)
    finally:
        p.kill()
        p.wait()
    try:
        readonly = bool(os.statvfs(f"/proc/self/fd/{fd}").f_flag & os.ST_RDONLY)
        os.close(os.open(f"/proc/self/fd/{fd}", os.O_WRONLY))  # no write: only whether it opens
        return 0, readonly, os.fstat(fd).st_ino
    except OSError as e:
        return e.errno, readonly, os.fstat(fd).st_ino
    finally:
        os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0, reason="a user namespace's root here needs root")
def test_where_the_kernel_refuses_the_view_a_sealed_memfd(tmp_path):
    """In a user namespace (open_tree refused: the mount namespace is the host's), exec runs
    from a sealed memfd copy of the launcher, and a server's interpreter from one of Python:
    neither opens for writing; each is what the server's check takes as sealed."""
    launcher = tmp_path / "sandbox"
    write_launcher(str(launcher))
    path = tmp_path / "s.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(path))
    listener.listen(1)
    listener.settimeout(30)
    p = subprocess.Popen(["unshare", "-U", "-r", str(launcher), "--root", str(tmp_path / "state"), "exec", "x", "true"],
                         env=dict(os.environ, SANDBOX_SERVER=str(path)), stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    conn, _ = listener.accept()  # (the launcher asks the server first)
    pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
    exe = os.readlink(f"/proc/{pid}/exe")
    with pytest.raises(OSError) as e:
        os.close(os.open(f"/proc/{pid}/exe", os.O_WRONLY))
    conn.close()  # (no server: its own planner, in the namespace, plans it)
    assert p.wait(timeout=60) == 1 and b"container does not exist" in p.stderr.read()
    assert exe.startswith("/memfd:sandbox ") and e.value.errno == errno.ETXTBSY, exe
    # a server (`serve --once`, the own planner's way) on a socketpair
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    q = subprocess.Popen(["unshare", "-U", "-r", str(launcher), "serve", "--once"], pass_fds=[theirs.fileno()],
                         preexec_fn=lambda: os.dup2(theirs.fileno(), 3), stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    theirs.close()
    deadline = time.monotonic() + 30
    while not os.readlink(f"/proc/{q.pid}/exe").startswith("/memfd:") and time.monotonic() < deadline:
        time.sleep(0.01)
    exe = os.readlink(f"/proc/{q.pid}/exe")
    fd = os.open(f"/proc/{q.pid}/exe", os.O_RDONLY)
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    finally:
        os.close(fd)
    ours.close()
    q.wait(timeout=30)
    assert exe.startswith("/memfd:sandbox-python ") and seals & fcntl.F_SEAL_WRITE, (exe, seals)


@pytest.mark.skipif(os.geteuid() != 0, reason="the launcher's read-only mount needs root")
def test_the_launchers_interpreter_is_read_only(tmp_path):
    launcher = tmp_path / "sandbox"
    write_launcher(str(launcher))
    # the interpreter itself, on a read-only mount (this very test runs the same file, so
    # the kernel says ETXTBSY before it gets to EROFS)
    code, readonly, ino = _exe_after_exit([str(launcher), "--root", str(tmp_path), "hook"])
    assert readonly and code in (errno.EROFS, errno.ETXTBSY) and ino == os.stat(sys.executable).st_ino
    # the control: a copy that nothing else runs opens for writing, as the attack needs
    copy = tmp_path / "python"
    copy.write_bytes(open(os.path.realpath(sys.executable), "rb").read())
    copy.chmod(0o755)
    assert _exe_after_exit([str(copy), "-c", "import time; time.sleep(5)"])[:2] == (0, False)


def test_c_strings_escape_what_c_would_read_otherwise():
    assert c_string('a"b\\c?\n') == '"a\\042b\\134c\\077\\012"'
    assert c_string("é") == '"\\303\\251"'
