"""Helpers for integration tests: run the real CLI, snapshot the host's mounts and a tree."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

# the launcher engines run (scripts/setup builds it): its own planner and C executor for exec,
# create and run (tests/conftest.py), the verbs that start no process in its Python
CLI = [str(Path(__file__).resolve().parents[2] / ".venv/bin/sandbox")]


def sandbox(*args, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw)


def sandbox_popen(*args, **kw) -> subprocess.Popen:
    return subprocess.Popen([*CLI, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def mount_table() -> list[tuple[str, str, str]]:
    """The host's mounts as (mount point, fs type, source), from the test's own namespace."""
    rows = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            rows.append((fields[4], rfields[0], rfields[1]))
    return sorted(rows)


def tree(root) -> dict[str, tuple]:
    """Every path under ``root`` (links not followed) with its type, mode, owner and content."""
    out = {}
    root = str(root)
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                content = os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    content = hashlib.sha256(f.read()).hexdigest()
            else:
                content = st.st_rdev
            out[os.path.relpath(path, root)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode),
                                                st.st_uid, st.st_gid, content)
    st = os.lstat(root)
    out["."] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, None)
    return out


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def create(root, bundle, cid: str, *global_args, log=None) -> subprocess.CompletedProcess:
    """`sandbox create`, its stdio to ``log`` (a file): a created init keeps create's stdio,
    and a pipe would end only with the container."""
    with open(log or os.devnull, "w") as out:
        return subprocess.run([*CLI, "--root", str(root), *map(str, global_args), "create", "-b", str(bundle), cid],
                              stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=60)


def runc_run(bundle, state_dir, name: str) -> subprocess.CompletedProcess:
    """`runc run` of the same bundle, for side-by-side checks."""
    return subprocess.run(["runc", "--root", str(state_dir), "run", "-b", str(bundle), name],
                          capture_output=True, text=True, timeout=60)


def stand_in(path, replies: list[bytes]):
    """A root server of one connection standing in for the warm one at ``path``: it reads the
    launcher's request (closing the stdio fds sent with it), sends the first of ``replies``,
    then each next one once the launcher has said something, and hangs up. Its thread."""
    import socket
    import threading

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(path))
    listener.listen(1)

    def serve():
        conn, _ = listener.accept()
        with conn, listener:
            _data, ancillary, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(12))
            for _level, _kind, fds in ancillary:  # the launcher's stdio: held, its pipes never end
                for i in range(0, len(fds), 4):
                    os.close(int.from_bytes(fds[i:i + 4], "little"))
            for n, reply in enumerate(replies):
                if n and not conn.recv(4096):
                    return
                conn.send(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def processes_naming(base) -> list[int]:
    """Live processes (not zombies, not us) whose command line names ``base``: what a test's
    engines, shims, conmon, gofers or nodes left running (each is given a path of the test's;
    the host's other processes, another session's engines among them, are not counted)."""
    needle = str(base).encode()
    pids = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as f:
                zombie = f.read().rpartition(") ")[2][0] == "Z"
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if needle in f.read() and not zombie and int(name) != os.getpid():
                    pids.append(int(name))
        except (OSError, ValueError):
            pass
    return pids
