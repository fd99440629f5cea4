"""A server started where none listens (issue #33, sandbox/executor/server_connect.h): the launcher's
and the hook client's first verb on a node starts `sandbox serve --idle-exit N`, detached,
with its own connection queued as the first request; the next verbs are served. Only the
node's root starts one; it leaves once idle, its socket first; one starter of many wins."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.helpers import alive

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / ".venv/bin/sandbox"


@pytest.fixture
def sock(tmp_path):
    """A socket path of the test's own; any server that starts there is stopped after."""
    if not LAUNCHER.is_file() or LAUNCHER.read_bytes()[:4] != b"\x7fELF":
        pytest.skip("the C launcher is not built (scripts/setup builds it)")
    path = tmp_path / "srv" / "s.sock"
    yield path
    for pid in servers(path):
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid)


def servers(path: Path) -> list[int]:
    """The servers whose log is path's (their stdout), not their children at work."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/fd/1") == f"{path}.log":
                with open(f"/proc/{pid}/stat") as f:
                    found[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            pass
    return sorted(pid for pid, parent in found.items() if parent not in found)


def wait_gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def verb(path, *args, idle="60", cmd=(), **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, SANDBOX_SERVER=str(path), SANDBOX_SERVER_IDLE=idle)
    return subprocess.run([*cmd, str(LAUNCHER), *map(str, args)], capture_output=True, text=True, timeout=60,
                          env=env, stdin=subprocess.DEVNULL, **kw)


def served(path: Path, at_least: int = 0) -> list[str]:
    """The verbs the server logged (each child logs once it has answered: at_least waits)."""
    deadline = time.monotonic() + 10
    while True:
        lines = [line for line in Path(f"{path}.log").read_text().splitlines()
                 if line.startswith("sandbox serve: ") and ": exit " in line]
        if len(lines) >= at_least or time.monotonic() > deadline:
            return lines
        time.sleep(0.02)


NOPE = "sandbox state: container does not exist: 'nope'"


def test_the_first_verb_starts_a_server_and_the_next_are_served(sock, tmp_path):
    r, w = os.pipe()  # an fd of the caller's: the server must not hold it
    pipe = f"pipe:[{os.fstat(w).st_ino}]"
    try:
        first = verb(sock, "--root", tmp_path / "state", "state", "nope", pass_fds=(w,))
    finally:
        os.close(r)
        os.close(w)
    second = verb(sock, "--root", tmp_path / "state", "state", "nope")
    for res in (first, second):
        assert res.returncode == 1 and NOPE in res.stderr
    assert len(served(sock, 2)) == 2, Path(f"{sock}.log").read_text()
    [pid] = servers(sock)
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        assert f.read().split(b"\0")[-4:-1] == [b"serve", b"--idle-exit", b"60"]
    with open(f"/proc/{pid}/environ", "rb") as f:
        assert {e.split(b"=")[0] for e in f.read().split(b"\0") if e} <= {b"PATH", b"LISTEN_FDS", b"LISTEN_PID"}
    assert os.getsid(pid) != os.getsid(0) and os.readlink(f"/proc/{pid}/cwd") == "/"  # (a session of its own)
    fds = {int(fd): os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    assert fds[0] == "/dev/null" and fds[1] == fds[2] == f"{sock}.log" and fds[3].startswith("socket:")
    assert pipe not in fds.values(), fds
    assert (sock.parent.stat().st_mode & 0o777) == 0o700 and (sock.stat().st_mode & 0o077) == 0
    os.kill(pid, signal.SIGTERM)
    assert wait_gone(pid) and not sock.exists()


def test_an_idle_server_leaves_and_the_next_verb_starts_another(sock, tmp_path):
    verb(sock, "--root", tmp_path, "state", "nope", idle="1")
    [pid] = servers(sock)
    assert wait_gone(pid, 15)
    assert not sock.exists() and not Path(f"{sock}.bpf").exists()
    assert "idle 1 s: leaving" in Path(f"{sock}.log").read_text()
    res = verb(sock, "--root", tmp_path, "state", "nope", idle="1")
    assert NOPE in res.stderr and servers(sock) not in ([], [pid])


def test_a_server_outlives_a_verb_served_while_idle_passes(sock, make_bundle, tmp_path):
    """A child at work keeps the server: a run longer than the idle time is answered."""
    bundle = make_bundle(["sh", "-c", "sleep 2; exit 7"])
    res = verb(sock, "--root", tmp_path / "state", "run", "-b", bundle, "long", idle="1")
    assert res.returncode == 7, res.stderr
    assert any(": run: " in line and ": exit 7 in " in line for line in served(sock, 1)), served(sock)


@pytest.mark.parametrize("why", ["idle 0", "idle not a number", "not root", "a smaller bounding set", "no_new_privs",
                                 "another mount namespace", "a pid namespace for its children",
                                 "a subreaper above it", "a directory others may write"])
def test_only_the_nodes_root_starts_one(sock, tmp_path, why):
    idle, cmd = {"idle 0": ("0", []), "idle not a number": ("1m", [])}.get(why, ("60", []))
    if why == "not root":
        cmd = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    elif why == "a smaller bounding set":
        cmd = ["setpriv", "--bounding-set", "-net_raw", "--inh-caps", "-all"]
    elif why == "no_new_privs":
        cmd = ["setpriv", "--no-new-privs"]
    elif why == "another mount namespace":
        cmd = ["unshare", "-m", "--propagation", "private"]
    elif why == "a pid namespace for its children":  # (no --fork: the verb in ours, its server in a new one)
        cmd = ["unshare", "-p"]
    elif why == "a subreaper above it":  # (conmon, a shim: it would have the server as its child, and wait)
        cmd = [sys.executable, "-c", "import ctypes, os, sys; ctypes.CDLL(None).prctl(36, 1, 0, 0, 0); "
               "sys.exit(os.waitstatus_to_exitcode(os.waitpid(os.spawnv(os.P_NOWAIT, sys.argv[1], sys.argv[1:]), 0)[1]))"]
    elif why == "a directory others may write":
        sock.parent.mkdir(mode=0o700)
        sock.parent.chmod(0o777)
    res = verb(sock, "--root", tmp_path / "state", "state", "nope", idle=idle, cmd=cmd)
    assert res.returncode != 0
    if why != "not root":  # (nobody cannot reach the checkout's interpreter: only what it did not start counts)
        assert NOPE in res.stderr, res.stderr
    assert not sock.exists() and not servers(sock)


def test_many_first_verbs_at_once_start_one_server(sock, tmp_path):
    env = dict(os.environ, SANDBOX_SERVER=str(sock), SANDBOX_SERVER_IDLE="60")
    procs = [subprocess.Popen([str(LAUNCHER), "--root", str(tmp_path), "state", "nope"], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(8)]
    for p in procs:
        _out, err = p.communicate(timeout=60)
        assert p.returncode == 1 and NOPE in err
    assert len(servers(sock)) == 1
    assert len(served(sock, 8)) == 8, Path(f"{sock}.log").read_text()


def test_a_server_takes_a_services_place_not_its_starters(sock, tmp_path):
    """Started from a cgroup of its own, at nice 5 under SCHED_IDLE, with the I/O class
    idle, ASLR off and an OOM score of 500: the server is in each hierarchy's root cgroup,
    SCHED_OTHER at nice 0, no I/O class, the plain personality, OOM score 0."""
    import ctypes

    from gofer.cgroups.common import cgroup_dirs

    mine = Path(cgroup_dirs(1)[0]) / f"sandbox-test-start-{os.getpid()}"
    mine.mkdir()
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        def odd():
            (mine / "cgroup.procs").write_text(str(os.getpid()))
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            os.nice(5)
            libc.syscall(251, 1, 0, 3 << 13)  # ioprio_set(IOPRIO_WHO_PROCESS, self, IDLE)
            libc.personality(0x0040000)  # ADDR_NO_RANDOMIZE
            Path("/proc/self/oom_score_adj").write_text("500")

        res = verb(sock, "--root", tmp_path, "state", "nope", preexec_fn=odd)
        assert NOPE in res.stderr
        [pid] = servers(sock)
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        assert lines and all(line.endswith(":/") for line in lines), lines
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        assert (stat[16], stat[38]) == ("0", "0")  # nice, policy
        assert libc.syscall(252, 1, pid) == 0  # ioprio_get: none set
        assert Path(f"/proc/{pid}/personality").read_text().strip() == "00000000"
        assert Path(f"/proc/{pid}/oom_score_adj").read_text().strip() == "0"
    finally:
        for pid in servers(sock):
            os.kill(pid, signal.SIGKILL)
            wait_gone(pid)
        mine.rmdir()


def test_a_hook_starts_one(sock, tmp_path, driver_root):
    """The launcher as a hook entry runs it (`hook install` writes it so): where no server
    listens, the node's root starts one, and the hook's answer is what our own Python's is."""
    hook = [str(LAUNCHER), "hook", "--driver-root", str(driver_root), "--server", str(sock)]
    state = json.dumps({"ociVersion": "1.0.2", "id": "h1", "pid": 999999999, "bundle": str(tmp_path / "none")})
    env = {"PATH": os.environ["PATH"], "SANDBOX_SERVER_IDLE": "60"}
    here = subprocess.run(hook, input=state, capture_output=True, text=True, env=dict(env, SANDBOX_SERVER_IDLE="0"),
                          timeout=60)
    assert not servers(sock)
    first = subprocess.run(hook, input=state, capture_output=True, text=True, env=env, timeout=60)
    assert (first.returncode, first.stderr) == (here.returncode, here.stderr) and here.returncode != 0
    assert len(servers(sock)) == 1
    assert len(served(sock, 1)) == 1 and "sandbox serve: hook: hook --driver-root" in served(sock, 1)[0]


def test_a_client_of_another_installation_is_declined(sock, tmp_path):
    verb(sock, "--root", tmp_path, "state", "nope")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(str(sock))
    s.send(json.dumps({"verb": ["state", "x"], "cwd": "/", "umask": 18, "env": [], "program": "import elsewhere"}).encode())
    assert json.loads(s.recv(4096)) == {"fallback": "a client of another installation of sandbox"}
    s.close()


@pytest.mark.parametrize("changed", ["sandbox", "sandbox/server/listen.py"])  # renames into it; a file rewritten
def test_an_upgraded_server_declines_and_leaves(sock, tmp_path, changed):
    verb(sock, "--root", tmp_path, "state", "nope")
    [pid] = servers(sock)
    package = REPO / changed
    st = package.stat()
    os.utime(package, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # as an upgrade does
    try:
        res = verb(sock, "--root", tmp_path, "state", "nope")
        assert NOPE in res.stderr  # (in the launcher's own Python)
        assert wait_gone(pid)
        assert "the server's code changed" in Path(f"{sock}.log").read_text()
        verb(sock, "--root", tmp_path, "state", "nope")
        assert servers(sock) not in ([], [pid])
    finally:
        os.utime(package, ns=(st.st_atime_ns, st.st_mtime_ns))



def test_a_starter_without_stdout_and_stderr_and_a_full_log(sock, tmp_path, driver_root):
    """A hook with fds 1 and 2 closed starts the server (its fds collided with the log's and
    the socket's) and a log left over 1 MiB is emptied: the server listens and serves."""
    sock.parent.mkdir(mode=0o700)
    Path(f"{sock}.log").write_bytes(b"x" * (2 << 20))
    hook = [str(LAUNCHER), "hook", "--driver-root", str(driver_root), "--server", str(sock)]
    state = json.dumps({"ociVersion": "1.0.2", "id": "h1", "pid": 999999999, "bundle": str(tmp_path / "none")})
    env = {"PATH": os.environ["PATH"], "SANDBOX_SERVER_IDLE": "60"}
    subprocess.run(["sh", "-c", 'exec "$@" >&- 2>&-', "sh", *hook], input=state, text=True, env=env, timeout=60)
    assert len(servers(sock)) == 1
    assert len(served(sock, 1)) == 1 and "sandbox serve: hook: " in served(sock, 1)[0]
    assert NOPE in verb(sock, "--root", tmp_path, "state", "nope").stderr
    assert len(served(sock, 2)) == 2
    assert os.path.getsize(f"{sock}.log") < 4096
