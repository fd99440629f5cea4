"""The interpreter of the verbs that reach a container cannot be written through
/proc/<pid>/exe: the launcher runs it from a read-only bind mount of itself, and any other
start re-executes from a sealed memfd (sandbox/sealed.py)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import pytest

from sandbox.launcher import write_launcher
from sandbox.wire import c_string

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = ("import os, sys; sys.path.insert(0, {repo!r}); from sandbox import sealed; print(sealed.sealed(), "
         "os.readlink('/proc/self/exe'))")


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


def test_plain_python_is_not_sealed_and_exec_sealed_is():
    plain = subprocess.run([sys.executable, "-c", PROBE.format(repo=REPO)], capture_output=True, text=True)
    assert plain.stdout.split()[0] == "False", plain.stderr
    code = PROBE.format(repo=REPO) + "\nif not sealed.sealed(): sealed.exec_sealed()"
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    first, second = again.stdout.splitlines()
    assert first.startswith("False") and second.startswith("True /memfd:sandbox-python"), again.stderr


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
