"""The warm server (`sandbox serve`) under faults and attack: a worker killed in the middle of
a verb it took up (never a second run in Python, one line, nothing left after `delete
--force`); peers that connect and never send (the accept loop never waits on one, the
launcher never waits forever for a server); a socket under a directory someone else owns (no
server, no filter cache of theirs); the engine's environment in the heap of a served init."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from sandbox.executor.wire import TAKE_UP_S
from sandbox.server.listen import SPARE
from tests.integration.helpers import alive, children
from tests.integration.test_served import LAUNCHER, served_lines, server, stand_in
from tests.integration.test_served import verb as verb_

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

__all__ = ["server"]  # (the fixture, shared with test_served.py)


def _cgroup_dirs(name: str) -> list[Path]:
    return [d for d in Path("/sys/fs/cgroup").glob(f"*/{name}") if d.is_dir()] + \
        [d for d in Path("/sys/fs/cgroup").glob(f"{name}") if d.is_dir()]


def _full_pipe() -> tuple[int, int, int]:
    """A pipe whose buffer is full: (read end, write end, bytes in it). A write of the
    server's child to it (the launcher's stderr) then blocks until the test reads."""
    r, w = os.pipe()
    flags = fcntl.fcntl(w, fcntl.F_GETFL)
    fcntl.fcntl(w, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    n = 0
    try:
        while True:
            n += os.write(w, b"x" * 4096)
    except BlockingIOError:
        pass
    fcntl.fcntl(w, fcntl.F_SETFL, flags)  # (one open file: the launcher's copy blocks too)
    return r, w, n


def _drain(fd: int, into: bytearray) -> None:
    """Read ``fd`` into ``into`` until its EOF, in a thread of its own; then close it."""
    def read() -> None:
        with open(fd, "rb", buffering=0) as f:
            while data := f.read(65536):
                into.extend(data)

    threading.Thread(target=read, daemon=True).start()


def _blocked_writing_stderr(pid: int) -> bool:
    """Whether ``pid`` sits in write(2, ...) (/proc/PID/syscall: the number, then the args)."""
    try:
        return Path(f"/proc/{pid}/syscall").read_text().split()[:2] == ["1", "0x2"]
    except OSError:
        return False


@pytest.fixture
def shared_cgroup(tmp_path):
    """A pids cgroup of the test's with a process in it: a bundle naming it makes create warn
    (after the id is claimed, before the container's cgroups and init exist). Yields its
    name; the process killed and the cgroup removed after."""
    name = _unique(tmp_path)
    d = Path("/sys/fs/cgroup/pids") / name
    d.mkdir()
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        (d / "cgroup.procs").write_text(str(sleeper.pid))
        yield name
    finally:
        sleeper.kill()
        sleeper.wait()
        d.rmdir()


def _linux(make_bundle) -> dict:
    return json.loads((make_bundle(["true"]) / "config.json").read_text())["linux"]


def _nothing_left(root: Path, cid: str, cgroup: str, ours: Path | None = None) -> None:
    """No state of ``cid`` under ``root``, no cgroup named ``cgroup`` but ``ours`` (removed:
    so no process is left in one either)."""
    assert not (root / cid).exists() and not [p for p in os.listdir(root) if cid in p], os.listdir(root)
    assert [d for d in _cgroup_dirs(cgroup) if d != ours] == []


def _workers(server: int) -> list[int]:
    """The server's children at work (not its spare, waiting for a request)."""
    return [pid for pid in children(server) if _name(pid) not in (SPARE, None)]


def _name(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def _unique(tmp_path: Path) -> str:
    return f"fault-{os.getpid()}-{tmp_path.name}"  # (another checkout's tests run beside ours)


@pytest.mark.parametrize("verb", ["create", "run"])
def test_a_worker_killed_mid_create_is_reported_never_run_again(server, make_bundle, shared_cgroup, tmp_path, verb):
    """The server's child killed after it took a create (or run) up and claimed the id (the
    state written, no cgroup or init yet): the launcher says so in one line and exits 1; it
    never runs the verb again in Python (whose create said "already exists", whose run
    replaced the state and ran the container), and `delete --force` leaves nothing."""
    path, log, proc = server
    root = tmp_path / "state"
    bundle = make_bundle(["true"], linux=dict(_linux(make_bundle), cgroupsPath=f"/{shared_cgroup}"))
    r, w, filled = _full_pipe()
    got = bytearray()
    launcher = subprocess.Popen([str(LAUNCHER), "--root", str(root), verb, "-b", str(bundle), "c"],
                                stdin=subprocess.DEVNULL, stdout=w, stderr=w,
                                env=dict(os.environ, SANDBOX_SERVER=str(path)))
    os.close(w)
    try:
        deadline = time.monotonic() + 30
        while not ((root / "c" / "state.json").exists() and len(workers := _workers(proc.pid)) == 1
                   and _blocked_writing_stderr(workers[0])):  # (the cgroup's warning, to a full pipe)
            assert time.monotonic() < deadline and launcher.poll() is None, log.read_text()
            time.sleep(0.01)
        os.kill(workers[0], signal.SIGKILL)
        while alive(workers[0]):  # (dead before its write finds room: the warning is never written)
            time.sleep(0.005)
        _drain(r, got)
        code = launcher.wait(timeout=30)
        time.sleep(0.5)  # (what else comes to the launcher's stderr: a Python create's lines)
        err = bytes(got[filled:]).decode()
        assert (code, err) == (1, f"sandbox {verb}: the server died before it answered\n"), err
    finally:
        if launcher.poll() is None:
            launcher.kill()
        d = verb_(path, "--root", root, "delete", "--force", "c")
    assert d.returncode == 0, d.stderr
    _nothing_left(root, "c", shared_cgroup, Path("/sys/fs/cgroup/pids") / shared_cgroup)
    assert "declined" not in log.read_text() and not [x for x in served_lines(log) if f": {verb}: " in x]


@pytest.mark.parametrize("verb", ["create", "run"])
def test_a_worker_killed_while_the_init_waits_leaves_nothing_after_delete(server, make_bundle, tmp_path, verb):
    """Later: the cgroups made, the launcher in them, pid 1 forked and the root half built
    (a prestart hook holds the server's child). The launcher says so in one line, exits 1 and
    kills pid 1; `delete --force` removes the cgroups and the state."""
    path, log, proc = server
    root = tmp_path / "state"
    marker = tmp_path / "hook.pid"
    cgroup = _unique(tmp_path)
    hook = {"path": "/bin/sh", "args": ["sh", "-c", f"echo $$ > {marker}.tmp; mv {marker}.tmp {marker}; exec sleep 60"]}
    bundle = make_bundle(["true"], hooks={"prestart": [hook]}, linux=dict(_linux(make_bundle), cgroupsPath=f"/{cgroup}"))
    launcher = subprocess.Popen([str(LAUNCHER), "--root", str(root), verb, "-b", str(bundle), "c"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, SANDBOX_SERVER=str(path)))
    hook_pid = None
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert time.monotonic() < deadline and launcher.poll() is None, log.read_text()
            time.sleep(0.01)
        hook_pid = int(marker.read_text())
        (worker,) = _workers(proc.pid)
        procs = Path("/sys/fs/cgroup/pids") / cgroup / "cgroup.procs"
        assert len(procs.read_text().split()) >= 2  # (the launcher, pid 1, the builder)
        os.kill(worker, signal.SIGKILL)
        out, err = launcher.communicate(timeout=30)
        assert (launcher.returncode, out, err) == (1, "", f"sandbox {verb}: the server died before it answered\n")
    finally:
        if launcher.poll() is None:
            launcher.kill()
        if hook_pid is not None:
            os.kill(hook_pid, signal.SIGKILL)
        d = verb_(path, "--root", root, "delete", "--force", "c")
    assert d.returncode == 0, d.stderr
    _nothing_left(root, "c", cgroup)
    assert "declined" not in log.read_text() and not [x for x in served_lines(log) if f": {verb}: " in x]


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


@pytest.mark.parametrize("verb", ["create", "run"])
def test_a_create_taken_up_is_never_run_again(tmp_path, make_bundle, verb):
    """A stand-in server that takes the verb up ({"running"}) and hangs up: the launcher says
    the server died, exits 1, and runs nothing itself (no state, no line of Python's)."""
    path, thread = stand_in(tmp_path, b'{"running": true}')
    root = tmp_path / "state"
    r = subprocess.run([str(LAUNCHER), "--root", str(root), verb, "-b", str(make_bundle(["true"])), "c"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                       env=dict(os.environ, SANDBOX_SERVER=str(path)))
    thread.join(10)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"sandbox {verb}: the server died before it answered\n")
    assert not root.exists()


def test_a_server_that_never_answers_is_not_waited_for(tmp_path):
    """A server that reads the request and says nothing (stopped, stalled): past TAKE_UP_S the
    launcher runs the verb itself; never a wait for good."""
    import socket

    path = tmp_path / "mute.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(path))
    listener.listen(1)
    conns = []

    def mute() -> None:
        conn, _ = listener.accept()
        conns.append(conn)
        _data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        for fd in fds:  # (the launcher's stdio: held, its pipes would never end)
            os.close(fd)

    thread = threading.Thread(target=mute, daemon=True)
    thread.start()
    try:
        t = time.monotonic()
        r = verb_(path, "--root", tmp_path / "state", "list", "--format", "json")
        took = time.monotonic() - t
    finally:
        thread.join(10)
        for c in conns:
            c.close()
        listener.close()
    assert (r.returncode, r.stdout.strip(), r.stderr) == (0, "[]", "")
    assert TAKE_UP_S <= took < TAKE_UP_S + 20, took


def _connect_silently(path: str, n: int, deadline: float) -> list:
    """``n`` connections to ``path`` that never send (each retried while the listen queue is full)."""
    import socket

    held = []
    while len(held) < n:
        c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        c.setblocking(False)
        try:
            c.connect(path)
        except BlockingIOError:
            c.close()
            assert time.monotonic() < deadline, f"{len(held)} of {n} connected"
            time.sleep(0.001)
            continue
        held.append(c)
    return held


SILENT = """
import os, socket, sys, time
held = []
for line in sys.stdin:  # each line: 60 more connections that never send, held until EOF
    deadline = time.monotonic() + 30
    for _ in range(60):
        while True:
            c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            c.setblocking(False)
            try:
                c.connect(f"/proc/self/fd/{fd}/server.sock")
                break
            except BlockingIOError:
                c.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.001)
        held.append(c)
    print(len(held), flush=True)
"""


def test_silent_peers_do_not_slow_a_served_verb(server, tmp_path):
    """Issue #29: 60 connections that never send made each served `state` take seconds (each
    declined one held the accept loop up to 0.1 s). Each `state` here comes right behind 60
    new ones of nobody's (declined) and with 70 of root's (trusted: more than MAX_CHILDREN)
    waiting: it is served, in about the time it takes alone."""
    path, log, proc = server
    root = tmp_path / "state"

    def state() -> float:
        t = time.monotonic()
        r = verb_(path, "--root", root, "state", "nope")
        assert r.returncode == 1 and "does not exist" in r.stderr, r.stderr
        return time.monotonic() - t

    baseline = min(state() for _ in range(3))
    os.chmod(path, 0o777)  # (the test's own server: nobody may connect, and is declined)
    os.chmod(path.parent, 0o711)
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    nobody = subprocess.Popen(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups",
                               "/usr/bin/python3", "-c", f"fd = {fd}\n{SILENT}"], pass_fds=[fd], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    os.close(fd)
    held: list = []
    times = []
    try:
        for _ in range(3):
            held += _connect_silently(str(path), 70, time.monotonic() + 30)
            nobody.stdin.write("more\n")
            nobody.stdin.flush()
            assert nobody.stdout.readline().strip().isdigit()
            times.append(state())
            for c in held[:-70]:
                c.close()
            held = held[-70:]
    finally:
        nobody.kill()
        nobody.wait()
        for c in held:
            c.close()
    assert max(times) < 1.0 + 3 * baseline, (times, baseline)
    assert sum(": state: " in line for line in served_lines(log)) == 6, log.read_text()


def _memory_holds(pid: int, needle: bytes) -> list[str]:
    """The mappings of ``pid`` (as root on the host: /proc/PID/mem) whose bytes hold ``needle``."""
    found = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if not fields[1].startswith("r") or fields[-1] in ("[vvar]", "[vsyscall]"):
                continue
            try:
                mem.seek(start)
                data = mem.read(end - start)
            except OSError:
                continue
            if needle in data:
                found.append(line.strip())
    return found


def test_a_served_inits_memory_holds_none_of_the_engines_environment(server, make_bundle, tmp_path):
    """The waiting init is the launcher's child: it starts with the launcher's heap, where the
    request (the engine's whole environment, its secrets with it) was built and freed (issue
    #29). A container process with CAP_SYS_PTRACE reads that heap: no byte of a variable the
    engine gave the launcher is found in any mapping of the init."""
    path, log, _ = server
    root = tmp_path / "state"
    secret = os.urandom(16).hex()
    env = dict(os.environ, SANDBOX_SERVER=str(path), ENGINE_SECRET=secret)
    env.update({f"ENGINE_PADDING_{i}": "p" * 200 for i in range(40)})  # (a request grown a few times)
    with open(tmp_path / "out", "w") as out:
        r = subprocess.run([str(LAUNCHER), "--root", str(root), "create", "-b", str(make_bundle(["true"])), "c"],
                           stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=60, env=env)
    try:
        assert r.returncode == 0, (tmp_path / "out").read_text()
        init = json.loads(verb_(path, "--root", root, "state", "c").stdout)["pid"]
        assert _memory_holds(init, secret.encode()) == []
        assert _memory_holds(os.getpid(), secret.encode())  # (the search finds what is there)
    finally:
        verb_(path, "--root", root, "delete", "--force", "c")
    assert sum(": create: " in line for line in served_lines(log)) == 1, log.read_text()



def test_a_silent_peer_is_dropped_whatever_child_was_forked_meanwhile(server, make_bundle, tmp_path):
    """A connection that waits for its request is the server's alone: a child forked for
    another request meanwhile (here a create held by its prestart hook) keeps no copy of it,
    which would keep the EOF of a dead child's connection from its launcher, and this one's
    end from this peer."""
    from sandbox.server.listen import REQUEST_TIMEOUT

    path, log, proc = server
    marker = tmp_path / "hook.pid"
    hook = {"path": "/bin/sh", "args": ["sh", "-c", f"echo $$ > {marker}.tmp; mv {marker}.tmp {marker}; exec sleep 30"]}
    (silent,) = _connect_silently(str(path), 1, time.monotonic() + 10)
    t = time.monotonic()
    launcher = subprocess.Popen([str(LAUNCHER), "--root", str(tmp_path / "state"), "create", "-b",
                                 str(make_bundle(["true"], hooks={"prestart": [hook]})), "c"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=dict(os.environ, SANDBOX_SERVER=str(path)))
    try:
        while not marker.exists():
            assert time.monotonic() - t < 30 and launcher.poll() is None, log.read_text()
            time.sleep(0.01)
        silent.settimeout(REQUEST_TIMEOUT + 5)
        assert silent.recv(64) == b""  # (closed by the server: no child holds it)
        assert time.monotonic() - t < REQUEST_TIMEOUT + 2
        assert launcher.poll() is None  # (still held by the hook)
    finally:
        silent.close()
        os.kill(int(marker.read_text()), signal.SIGKILL) if marker.exists() else None
        launcher.wait(timeout=30)
        verb_(path, "--root", tmp_path / "state", "delete", "--force", "c")


def _spare(proc, log, other: int | None = None) -> int:
    """The server's spare (not ``other``), once there."""
    deadline = time.monotonic() + 10
    while not (ours := [p for p in children(proc.pid) if _name(p) == SPARE and p != other]):
        assert time.monotonic() < deadline, (children(proc.pid), log.read_text())
        time.sleep(0.01)
    (pid,) = ours
    return pid


def _soon(done, log) -> None:
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.005)


def test_the_spare_takes_the_next_request_and_leaves_with_the_server(server, tmp_path):
    """The server forks a child ahead of the next request (its spare): the request is served
    by it (a hook's, held while its stdin is open), no spare is forked beside it at work, and
    a new one once it is done; a spare killed meanwhile costs nothing (a child is forked as
    before); the spare leaves with the server."""
    path, log, proc = server
    first = _spare(proc, log)
    hook = subprocess.Popen([str(LAUNCHER), "hook", "--driver-root", "/nonexistent"], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, SANDBOX_SERVER=str(path)))
    try:
        _soon(lambda: _workers(proc.pid) == [first], log)  # (the spare, at work: its name back)
        time.sleep(0.2)
        assert children(proc.pid) == [first]
    finally:
        hook.stdin.close()
        hook.wait(timeout=30)
    _soon(lambda: not alive(first) and len(served_lines(log)) == 1, log)  # (it served the hook, and left)
    second = _spare(proc, log, first)
    os.kill(second, signal.SIGKILL)
    while alive(second):
        time.sleep(0.005)
    assert verb_(path, "--root", tmp_path, "list").returncode == 0
    _soon(lambda: len(served_lines(log)) == 2, log)
    assert "declined" not in log.read_text()
    third = _spare(proc, log, second)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    assert not alive(third)


def test_a_stopped_spare_holds_nothing_up(server, tmp_path):
    """A spare stopped (SIGSTOP) is not handed the next request (a child is forked for it,
    served at once), and a server leaving with a stopped spare does not wait for it: its
    socket goes, the spare is killed. The server SIGKILLed, its spare leaves too."""
    path, log, proc = server
    first = _spare(proc, log)
    os.kill(first, signal.SIGSTOP)
    _soon(lambda: Path(f"/proc/{first}/stat").read_text().split(") ")[1][0] == "T", log)
    t = time.monotonic()
    assert verb_(path, "--root", tmp_path, "list").returncode == 0
    assert time.monotonic() - t < TAKE_UP_S / 2 and "declined" not in log.read_text()
    _soon(lambda: len(served_lines(log)) == 1 and not alive(first), log)
    second = _spare(proc, log, first)
    os.kill(second, signal.SIGSTOP)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    assert not path.exists() and not alive(second)


def test_a_killed_servers_spare_leaves(tmp_path):
    """The server SIGKILLed: its spare reads the EOF of its socketpair and leaves."""
    import engines

    with engines.WarmServer(tmp_path) as warm:
        spare = _spare(warm.proc, warm.log)
        warm.proc.kill()
        warm.proc.wait()
        _soon(lambda: not alive(spare), warm.log)
