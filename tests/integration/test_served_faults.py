"""The warm server (`sandbox serve`) under faults and attack: a worker killed in the middle of
a verb it took up (never a second run in Python, one line, nothing left after `delete
--force`); peers that connect and never send (the accept loop never waits on one, the
launcher never waits forever for a server); a socket under a directory someone else owns (no
server, no filter cache of theirs); the engine's environment in the heap of a served init."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_served import LAUNCHER, served_lines

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

NOBODY = 65534


def test_a_socket_below_another_users_directory_is_refused(tmp_path):
    """A directory of nobody's on the socket's way (not only its parent): no server, one line
    naming it, nothing made below it."""
    a = tmp_path / "a"
    a.mkdir()
    os.chown(a, NOBODY, NOBODY)
    sock = a / "srv" / "s.sock"
    r = subprocess.run([str(LAUNCHER), "serve", "--server", str(sock)], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert (r.returncode, r.stdout) == (1, ""), r.stderr
    assert r.stderr == (f"sandbox serve: --server {sock}: {a} is owned by uid {NOBODY} (every directory on the way "
                        "must be root's and writable by no one else: another user could take the socket's place)\n")
    assert os.listdir(a) == []


def _as_nobody(directory: Path, code: str) -> str:
    """``code`` run by a Python of uid nobody, with ``fd`` an fd of ``directory`` (the test's
    tmp_path is root's alone: nobody reaches it only so)."""
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
    try:
        r = subprocess.run(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups", "/usr/bin/python3",
                            "-c", f"import os, sys; fd = {fd}\n{code}"], pass_fds=[fd], capture_output=True,
                           text=True, timeout=60)
    finally:
        os.close(fd)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_filters_cached_below_another_users_directory_are_never_used(make_bundle, tmp_path):
    """The red team's bypass (issue #29): the socket's grandparent becomes nobody's while the
    server runs; nobody renames the socket's directory away, makes its own with the filter
    cache's directories, links the socket back, and swaps the two filters the served runs
    cached there. A container whose profile denies mkdir still cannot mkdir: the cache's way
    is checked at each use, and nothing is written into a directory of theirs."""
    import engines

    a = tmp_path / "a"
    a.mkdir(mode=0o755)
    base = json.loads((make_bundle(["true"]) / "config.json").read_text())["linux"]
    rules = {"deny": "SCMP_ACT_ERRNO", "allow": "SCMP_ACT_LOG"}
    bundles = {name: make_bundle(["sh", "-c", "mkdir /probe-dir 2>&1; true"], linux=dict(base, seccomp={
        "defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["mkdir", "mkdirat"], "action": action}]}))
        for name, action in rules.items()}
    with engines.WarmServer(tmp_path, a / "srv" / "s.sock") as warm:
        os.chown(a, NOBODY, NOBODY)
        _as_nobody(a, f"""
os.rename("srv", "srv.old", src_dir_fd=fd, dst_dir_fd=fd)
for d in ("srv", "srv/s.sock.bpf", "srv/s.sock.bpf/{warm.proc.pid}"):
    os.mkdir(d, 0o755, dir_fd=fd)
os.symlink("../srv.old/s.sock", "srv/s.sock", dir_fd=fd)
""")
        root = tmp_path / "state"
        outs = []

        def run(name: str) -> None:
            r = subprocess.run([str(LAUNCHER), "--root", str(root), "run", "--id", name, str(bundles[name])],
                               capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                               env=dict(os.environ, SANDBOX_SERVER=str(a / "srv" / "s.sock")))
            assert r.returncode == 0, r.stderr
            outs.append(r.stdout)

        run("deny")
        run("allow")
        theirs = a / "srv" / "s.sock.bpf" / str(warm.proc.pid)
        cached = _as_nobody(a, f"""
d = os.open("srv/s.sock.bpf/{warm.proc.pid}", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
names = os.listdir(d)
if len(names) == 2:  # the two filters of root's, renamed into each other's names
    os.rename(names[0], "swap", src_dir_fd=d, dst_dir_fd=d)
    os.rename(names[1], names[0], src_dir_fd=d, dst_dir_fd=d)
    os.rename("swap", names[1], src_dir_fd=d, dst_dir_fd=d)
print(len(names))
""")
        run("deny")
        assert sum(": run: " in line for line in served_lines(warm.log)) == 3, warm.log.read_text()
    assert "Operation not permitted" in outs[0] and "Operation not permitted" not in outs[1], outs
    assert "Operation not permitted" in outs[2], outs
    assert (cached.strip(), os.listdir(theirs)) == ("0", [])
