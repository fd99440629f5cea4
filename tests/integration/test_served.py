"""The verbs that start no process (state, kill, delete, start, list, ps, ...) served whole by
the warm server (`sandbox serve`) through the `sandbox` launcher: the same output, errors and
exit codes as when the verb runs in the launcher's own Python, with the caller's stdio, cwd and
umask; and where the server is of no use (killed, another mount namespace) the verb still runs."""

from __future__ import annotations

import difflib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox.server.listen import SPARE
from tests.integration import helpers
from tests.integration.helpers import alive

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

LAUNCHER = Path(__file__).resolve().parents[2] / ".venv/bin/sandbox"


@pytest.fixture
def server(tmp_path):
    """`sandbox serve` on a socket of the test's own (scripts/engines.py's WarmServer);
    yields (socket, its log, the process)."""
    import engines

    if not LAUNCHER.is_file() or LAUNCHER.read_bytes()[:4] != b"\x7fELF":
        pytest.skip("the C launcher is not built (scripts/setup builds it)")
    with engines.WarmServer(tmp_path) as warm:
        yield warm.path, warm.log, warm.proc


def verb(server_path, *args, cwd=None, umask=None) -> subprocess.CompletedProcess:
    """The launcher with the verb: served where server_path is a server's socket, run in
    the launcher's own Python where it is ""."""
    env = dict(os.environ, SANDBOX_SERVER=str(server_path))
    return subprocess.run([str(LAUNCHER), *map(str, args)], capture_output=True, text=True, timeout=60,
                          env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                          preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)


def served_lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("sandbox serve: ") and ": exit " in line]


def test_verbs_are_served_as_they_run_here(server, make_bundle, tmp_path):
    path, log, _ = server
    root = tmp_path / "state"
    bundle = make_bundle(["sleep", "100"])
    with open(tmp_path / "create.out", "w") as out:
        r = subprocess.run([str(LAUNCHER), "--root", str(root), "create", "-b", str(bundle), "c1"],
                           stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=60,
                           env=dict(os.environ, SANDBOX_SERVER=str(path)))
    assert r.returncode == 0, (tmp_path / "create.out").read_text()
    assert [line.split(": ")[1] for line in served_lines(log)] == ["create"], log.read_text()

    for args in (["state", "c1"], ["list"], ["list", "--format", "json"], ["ps", "c1"], ["state", "--help"],
                 ["state", "nope"], ["state"], ["kill", "nope", "KILL"]):
        here, warm = verb("", "--root", root, *args), verb(path, "--root", root, *args)
        assert (warm.returncode, warm.stdout, warm.stderr) == (here.returncode, here.stdout, here.stderr), args
    assert len(served_lines(log)) == 9, log.read_text()
    assert json.loads(verb(path, "--root", root, "state", "c1").stdout)["status"] == "created"

    pid = json.loads(verb(path, "--root", root, "state", "c1").stdout)["pid"]
    r = verb(path, "--root", root, "start", "c1")
    assert r.returncode == 0, r.stderr
    assert json.loads(verb(path, "--root", root, "state", "c1").stdout)["status"] == "running"
    r = verb(path, "--root", root, "kill", "c1", "KILL")
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(pid)
    r = verb(path, "--root", root, "delete", "c1")
    assert r.returncode == 0, r.stderr
    assert not (root / "c1").exists()
    assert [line.split(f"{root} ")[1].split(":")[0] for line in served_lines(log)[-5:]] == \
        ["state c1", "start c1", "state c1", "kill c1 KILL", "delete c1"], log.read_text()


def test_the_callers_cwd_and_umask(server, tmp_path):
    """A relative --root and --log are the caller's cwd's, the log file gets the caller's umask."""
    path, log, _ = server
    work = tmp_path / "work"
    work.mkdir()
    r = verb(path, "--root", "rel-state", "--log", "errors.log", "state", "nope", cwd=work, umask=0o077)
    assert r.returncode == 1 and r.stderr.strip() == \
        "sandbox state: container does not exist: 'nope' (under rel-state)", r.stderr
    assert "container does not exist: 'nope'" in (work / "errors.log").read_text()
    assert oct((work / "errors.log").stat().st_mode & 0o777) == "0o600"
    assert len(served_lines(log)) == 1, log.read_text()


def test_without_a_server_the_verb_runs_here(server, tmp_path):
    """A killed server leaves its socket, which refuses: the verb runs in the launcher's Python."""
    path, log, proc = server
    proc.kill()
    proc.wait(timeout=10)
    assert path.exists()
    r = verb(path, "--root", tmp_path / "state", "list", "--format", "json")
    assert (r.returncode, r.stdout.strip()) == (0, "[]"), r.stderr
    r = verb(path, "--root", tmp_path / "state", "state", "nope")
    assert r.returncode == 1 and "does not exist" in r.stderr


def _dirty(pid: int) -> dict[str, int]:
    """/proc/PID/smaps_rollup's dirty kB: Private_Dirty, Shared_Dirty."""
    lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]
    return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in lines) if k.endswith("_Dirty")}


def test_a_spare_owns_its_memory_before_its_request_and_serves_it(server, tmp_path):
    """A quiet spell after its birth, the spare has copied what it shared with the server
    (sandbox/server/prefault.py): its dirty pages are its own; then it serves a verb."""
    from sandbox.server.prefault import QUIET_MS, zero_frame

    if zero_frame() is None:
        pytest.skip("no MADV_POPULATE_WRITE (Linux 5.14): nothing is copied")

    path, log, proc = server
    assert verb(path, "--root", tmp_path / "state", "list").returncode == 0  # (the spare after a request)
    deadline = time.monotonic() + 10
    while True:
        spares = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                                 text=True).stdout.split()
                  if Path(f"/proc/{p}/comm").read_text().strip() == SPARE]
        dirty = _dirty(spares[0]) if spares else {"Private_Dirty": 0, "Shared_Dirty": 1}
        if dirty["Private_Dirty"] > 4 * dirty["Shared_Dirty"]:
            break
        assert time.monotonic() < deadline, dirty
        time.sleep(QUIET_MS / 1000)
    assert dirty["Private_Dirty"] > _dirty(proc.pid)["Private_Dirty"] // 2, (dirty, _dirty(proc.pid))
    r = verb(path, "--root", tmp_path / "state", "list", "--format", "json")
    assert (r.returncode, r.stdout.strip()) == (0, "[]"), r.stderr
    assert len(served_lines(log)) == 2, log.read_text()


def test_another_mount_namespace_is_not_served(server, tmp_path):
    """The server declines a caller whose paths may name other files (another mount namespace):
    the launcher then runs the verb itself, in its own namespace."""
    path, log, _ = server
    r = subprocess.run(["unshare", "-m", "--propagation", "private", str(LAUNCHER), "--root",
                        str(tmp_path / "state"), "list", "--format", "json"], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, SANDBOX_SERVER=str(path)))
    assert (r.returncode, r.stdout.strip()) == (0, "[]"), r.stderr
    assert served_lines(log) == [], log.read_text()


def stand_in(tmp_path, answer: bytes | None):
    """helpers.stand_in at the test's socket, sending ``answer`` (if any): (its path, its thread)."""
    path = tmp_path / "stand-in.sock"
    return path, helpers.stand_in(path, [answer] if answer is not None else [])


@pytest.mark.parametrize("answer", [None, b'{"fallback": "busy"}'])
def test_a_verb_the_server_never_took_up_runs_here(tmp_path, answer):
    if not LAUNCHER.is_file():
        pytest.skip("the launcher is not built")
    path, thread = stand_in(tmp_path, answer)
    r = verb(path, "--root", tmp_path / "state", "list", "--format", "json")
    thread.join(10)
    assert (r.returncode, r.stdout.strip(), r.stderr) == (0, "[]", "")


def test_a_server_that_dies_mid_verb_is_an_error(tmp_path):
    """Taken up ({"running"}), a verb is never run twice: the launcher says the server died."""
    if not LAUNCHER.is_file():
        pytest.skip("the launcher is not built")
    path, thread = stand_in(tmp_path, b'{"running": true}')
    r = verb(path, "--root", tmp_path / "state", "list", "--format", "json")
    thread.join(10)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == f"sandbox: the server at {path} died before it answered\n"


@pytest.mark.skipif(not os.path.exists("/usr/bin/systemd-socket-activate"), reason="no systemd-socket-activate")
def test_socket_activated(tmp_path, make_bundle):
    """As the installed gpu-sandbox.socket starts it: systemd listens, the first verb's
    connection starts `sandbox serve` with the socket as fd 3 (LISTEN_FDS), and it is served."""
    if not LAUNCHER.is_file():
        pytest.skip("the launcher is not built")
    path, log = tmp_path / "activated.sock", tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(["systemd-socket-activate", "--seqpacket", "-l", str(path), str(LAUNCHER), "serve"],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 10
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        for _ in range(2):  # the first starts the server, the second finds it warm
            r = verb(path, "--root", tmp_path / "state", "list", "--format", "json")
            assert (r.returncode, r.stdout.strip()) == (0, "[]"), r.stderr
        assert len(served_lines(log)) == 2, log.read_text()
        assert f"listening on {path}" in log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def _launch(path, root, bundle, cid, tmp_path):
    with open(tmp_path / f"{cid}.out", "w") as out:
        r = subprocess.run([str(LAUNCHER), "--root", str(root), "run", "-d", "-b", str(bundle), cid],
                           stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=60,
                           env=dict(os.environ, SANDBOX_SERVER=str(path)))
    assert r.returncode == 0, (tmp_path / f"{cid}.out").read_text()


PROBE = ("id; echo home=$HOME; pwd; umask; grep -E '^(Cap|NoNewPrivs|Seccomp|Sig(Blk|Ign))' /proc/self/status;"
         " ls /proc/self/fd; ulimit -n -Hn -u; env | sort; cat /proc/self/cgroup; ls -l /proc/self/ns | cut -c40-;"
         " mkdir /tmp/x 2>&1; unshare -U true 2>&1; tty; true")


def test_exec_by_the_front_end_is_pythons(server, make_bundle, tmp_path):
    """Every exec variant through the launcher's front end gives what exec in Python gives:
    the user, capabilities, no_new_privs, seccomp (podman's profile), rlimits, umask, cwd,
    environment, cgroup and namespaces of the process, its exit code, and the same error
    lines; none of them is declined."""
    import fixtures

    path, log, _ = server
    root = tmp_path / "state"
    spec = json.loads((make_bundle(["sleep", "100"]) / "config.json").read_text())
    spec["process"]["rlimits"] = [{"type": "RLIMIT_NOFILE", "soft": 512, "hard": 1024}]
    spec["process"]["capabilities"] = {k: ["CAP_CHOWN", "CAP_NET_BIND_SERVICE", "CAP_SETUID", "CAP_SETGID"]
                                       for k in ("bounding", "effective", "permitted", "inheritable", "ambient")}
    spec["process"]["user"] = {"uid": 0, "gid": 0, "umask": 0o027, "additionalGids": [5, 7]}
    spec["process"]["env"] += ["FROM_SPEC=1"]
    spec["linux"]["seccomp"] = fixtures.engine_seccomp_profile()
    bundle = make_bundle(["sleep", "100"], **{k: v for k, v in spec.items() if k != "root"})
    _launch(path, root, bundle, "x1", tmp_path)
    try:
        variants = [[], ["--cwd", "/etc"], ["-e", "EXTRA=2", "-e", "HOME=/home/x"], ["-u", "1000:1000"],
                    ["-u", "65534", "--additional-gids", "9"], ["--cap", "CAP_KILL"], ["--no-new-privs"]]
        for flags in variants:
            here = verb("", "--root", root, "exec", *flags, "x1", "sh", "-c", PROBE)
            warm = verb(path, "--root", root, "exec", *flags, "x1", "sh", "-c", PROBE)
            assert here.returncode == 0, here.stderr
            assert (warm.returncode, warm.stdout, warm.stderr) == (here.returncode, here.stdout, here.stderr), \
                (flags, warm.stdout, warm.stderr, here.stdout)
        for argv in (["x1", "sh", "-c", "exit 3"], ["x1", "no-such-command"], ["--cwd", "/nope", "x1", "true"],
                     ["nope", "true"], ["x1"], ["x1", "/etc/passwd"]):
            here, warm = verb("", "--root", root, "exec", *argv), verb(path, "--root", root, "exec", *argv)
            assert (warm.returncode, warm.stdout, warm.stderr) == (here.returncode, here.stdout, here.stderr), argv
        lines = served_lines(log)
        assert sum(" exec " in line for line in lines) == len(variants) + 6, log.read_text()
        assert "declined" not in log.read_text()
    finally:
        verb("", "--root", root, "delete", "--force", "x1")


def test_exec_detached_with_a_pid_file(server, make_bundle, tmp_path):
    path, log, _ = server
    root = tmp_path / "state"
    _launch(path, root, make_bundle(["sleep", "100"]), "d1", tmp_path)
    try:
        pid_file = tmp_path / "exec.pid"
        with open(tmp_path / "exec.out", "w+") as out:  # (a pipe would end only with the detached process)
            r = subprocess.run([str(LAUNCHER), "--root", str(root), "exec", "-d", "--pid-file", str(pid_file), "d1",
                                "sleep", "30"], stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=60,
                               env=dict(os.environ, SANDBOX_SERVER=str(path)))
            assert r.returncode == 0 and (tmp_path / "exec.out").read_text() == ""
        pid = int(pid_file.read_text())
        assert Path(f"/proc/{pid}/comm").read_text().strip() == "sleep"
        r = verb(path, "--root", root, "ps", "--format", "json", "d1")
        assert pid in json.loads(r.stdout)
        os.kill(pid, signal.SIGKILL)
    finally:
        verb("", "--root", root, "delete", "--force", "d1")
    assert any(" exec -d " in line for line in served_lines(log)), log.read_text()


def test_exec_forwards_signals_and_reports_them(server, make_bundle, tmp_path):
    """Not detached, the launcher waits for the process, passes SIGTERM on, and exits 128+N."""
    path, log, _ = server
    root = tmp_path / "state"
    _launch(path, root, make_bundle(["sleep", "100"]), "s1", tmp_path)
    try:
        proc = subprocess.Popen([str(LAUNCHER), "--root", str(root), "exec", "s1", "sleep", "30"],
                                env=dict(os.environ, SANDBOX_SERVER=str(path)), stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not any(" exec s1 sleep 30" in line for line in served_lines(log)) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        verb("", "--root", root, "delete", "--force", "s1")


def test_scheduling_personality_and_seccomp_flags_are_served_as_in_python(server, make_bundle, tmp_path):
    """process.scheduler, process.ioPriority, linux.personality and seccomp flags: the
    launcher's create and exec set them as Python does (the policy, nice value and I/O class
    of pid 1 and of an exec'd process, the personality in uname -m, the filter's errno), and
    neither is declined; a policy the kernel refuses is the same line on both paths."""
    import ctypes

    path, log, _ = server
    root = tmp_path / "state"
    probe = "cut -d' ' -f19,41 /proc/self/stat; uname -m; mkdir /tmp/y 2>/dev/null || echo denied"
    spec = json.loads((make_bundle(["true"]) / "config.json").read_text())
    spec["process"]["scheduler"] = {"policy": "SCHED_BATCH", "nice": 5}
    spec["process"]["ioPriority"] = {"class": "IOPRIO_CLASS_IDLE", "priority": 0}
    spec["linux"]["personality"] = {"domain": "LINUX32"}
    spec["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ALLOW", "flags": ["SECCOMP_FILTER_FLAG_LOG"],
                                "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO",
                                              "errnoRet": 1}]}
    outputs = {}
    libc = ctypes.CDLL(None, use_errno=True)
    for how, server_path in (("py", ""), ("warm", path)):
        bundle = make_bundle(["sh", "-c", probe + "; sleep 100"], linux=spec["linux"])
        config = json.loads((bundle / "config.json").read_text())
        config["process"].update(scheduler=spec["process"]["scheduler"], ioPriority=spec["process"]["ioPriority"])
        (bundle / "config.json").write_text(json.dumps(config))
        _launch(server_path, root, bundle, how, tmp_path)
        try:
            pid = json.loads(verb("", "--root", root, "state", how).stdout)["pid"]
            assert libc.syscall(252, 1, pid) == 3 << 13  # ioprio_get(IOPRIO_WHO_PROCESS, pid): IDLE, 0
            r = verb(server_path, "--root", root, "exec", how, "sh", "-c", probe)
            assert r.returncode == 0, r.stderr
            deadline = time.monotonic() + 10
            while "denied" not in (tmp_path / f"{how}.out").read_text() and time.monotonic() < deadline:
                time.sleep(0.02)
            outputs[how] = ((tmp_path / f"{how}.out").read_text(), r.stdout)
        finally:
            verb("", "--root", root, "delete", "--force", how)
    assert outputs["warm"] == outputs["py"] == ("5 3\ni686\ndenied\n",) * 2, outputs
    config["process"]["scheduler"] = {"policy": "SCHED_FIFO", "priority": 10}  # (no rt_runtime in the cgroup)
    config["process"]["args"] = ["true"]
    (bundle / "config.json").write_text(json.dumps(config))
    here, warm = (_created(p, root, bundle, f"rt-{how}", tmp_path)[:2] for how, p in (("py", ""), ("warm", path)))
    assert here[0] == warm[0] == 1 and "sandbox create: process.scheduler: sched_setattr policy 1 nice 0 " \
        "priority 10: Operation not permitted" in here[1], here
    assert warm[1] == here[1], (warm, here)
    assert "declined" not in log.read_text()
    assert [line.split(": ")[1] for line in served_lines(log)] == ["run", "exec", "create"], log.read_text()


@pytest.mark.parametrize("nnp", [True, False], ids=["no_new_privs", "privs"])
def test_a_seccomp_agent_is_served_as_in_python(server, make_bundle, tmp_path, nnp):
    """SCMP_ACT_NOTIFY with a listenerPath, for run and for exec: the launcher loads the
    filter with a new listener and sends its fd to the agent with the container process
    state (its pid as the host sees it: pid 1's, exec's process's); the agent's answer is
    what mkdir returns; the same as in Python, and nothing is declined."""
    from tests.integration.test_seccomp import _bundle, start_agent

    path, log, _ = server
    root = tmp_path / "state"
    seen = {}
    for how, server_path in (("py", ""), ("warm", path)):
        agent_path = str(tmp_path / f"{how}-agent.sock")
        agent, answers = start_agent(agent_path)
        profile = {"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": agent_path, "listenerMetadata": "m",
                   "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_NOTIFY"}]}
        bundle = _bundle(make_bundle, profile, nnp=nnp, args=("sh", "-c", "mkdir /tmp/n 2>&1; echo done"))
        code, out, err = _run(server_path, root, bundle, f"n-{how}")
        agent.join(10)
        assert code == 0, err
        state = answers[0]
        assert state["pid"] > 0 and state["state"]["pid"] == state["pid"] and state["metadata"] == "m", state
        seen[how] = (out, state["fds"], state["state"]["status"], state["state"]["id"].replace(how, "x"),
                     [a[0] for a in answers[1:]])
        # exec into a running one (its init's filter has an agent too: one agent for both, as
        # a node's): its own process's pid, the container's state
        spec = json.loads((bundle / "config.json").read_text())
        spec["process"]["args"] = ["sleep", "100"]
        (bundle / "config.json").write_text(json.dumps(spec))
        os.unlink(agent_path)  # (the run's agent is done)
        first, answers = start_agent(agent_path)
        agents = [first]
        _launch(server_path, root, bundle, f"e-{how}", tmp_path)
        try:
            init = json.loads(verb("", "--root", root, "state", f"e-{how}").stdout)["pid"]
            deadline = time.monotonic() + 10
            while not answers and time.monotonic() < deadline:  # (the init's, taken: the agent's socket is free)
                time.sleep(0.02)
            os.unlink(agent_path)
            second, more = start_agent(agent_path)
            agents.append(second)
            r = verb(server_path, "--root", root, "exec", f"e-{how}", "sh", "-c", "mkdir /tmp/m 2>&1; echo $$")
            assert r.returncode == 0, r.stderr
        finally:
            verb("", "--root", root, "delete", "--force", f"e-{how}")
        for a in agents:
            a.join(10)
        execs = [a for a in answers + more if isinstance(a, dict) and a["pid"] != init]
        assert len(execs) == 1 and execs[0]["state"] == {"ociVersion": execs[0]["ociVersion"], "status": "running",
                                                         "pid": init}, answers
        seen[how] += (r.stdout.splitlines()[0],)
    assert seen["warm"] == seen["py"], seen
    assert seen["py"][0] == "mkdir: can't create directory '/tmp/n': Invalid cross-device link\ndone\n"
    assert "declined" not in log.read_text()
    assert [line.split(": ")[1] for line in served_lines(log)] == ["run", "run", "exec"], log.read_text()


def test_lsm_labels_are_served_as_in_python(server, make_bundle, tmp_path):
    """An AppArmor profile or an SELinux label (exec --apparmor, --process-label; a bundle's):
    not declined; where the kernel has no such LSM (this VM) the same refusal as Python's,
    for create and exec. (Where it has one, frontend.c writes the label through the host's
    procfs: tests/sandbox/test_frontend_plan.py.)"""
    path, log, _ = server
    root = tmp_path / "state"
    outcomes = {}
    for how, server_path in (("py", ""), ("warm", path)):
        _launch(server_path, root, make_bundle(["sleep", "100"]), f"l-{how}", tmp_path)
        try:
            outcomes[how] = [verb(server_path, "--root", root, "exec", *flag, f"l-{how}", "true")
                             for flag in (["--apparmor", "docker-default"], ["--process-label", "system_u:r:t:s0"])]
        finally:
            verb("", "--root", root, "delete", "--force", f"l-{how}")
        spec = json.loads((make_bundle(["true"]) / "config.json").read_text())
        spec["process"]["apparmorProfile"] = "docker-default"
        bundle = make_bundle(["true"], process=spec["process"])
        outcomes[how].append(_created(server_path, root, bundle, f"c-{how}", tmp_path)[:2])
    here, warm = outcomes["py"], outcomes["warm"]
    assert [(r.returncode, r.stdout, r.stderr) for r in warm[:2]] == [(r.returncode, r.stdout, r.stderr)
                                                                     for r in here[:2]]
    assert warm[2][0] == here[2][0] and warm[2][1].replace("c-warm", "c-py") == here[2][1], (warm[2], here[2])
    if not os.path.exists("/sys/module/apparmor/parameters/enabled"):
        assert here[0].returncode == 2 and "AppArmor is not enabled in this kernel" in here[0].stderr, here[0]
    assert "declined" not in log.read_text()
    assert [line.split(": ")[1] for line in served_lines(log)] == ["run", "exec", "exec", "create"], log.read_text()


def _pty_output(listener, until: bytes | None) -> tuple[bytes, bytes]:
    """The name sent with the pty master a --console-socket receives, and what it reads until
    ``until`` or, None, until its process is gone (closed earlier, it would hang it up)."""
    import socket

    listener.settimeout(30)
    conn, _ = listener.accept()
    with conn:
        msg, fds, _flags, _addr = socket.recv_fds(conn, 1024, 1)
    out = b""
    deadline = time.monotonic() + 20
    try:
        while (until is None or until not in out) and time.monotonic() < deadline:
            try:
                chunk = os.read(fds[0], 1024)
            except OSError:  # (EIO: the other side's last fd closed)
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(fds[0])
    return msg, out


def test_a_terminal_is_served_as_in_python(server, make_bundle, tmp_path):
    """process.terminal with --console-socket, for create and for exec -t: the launcher opens
    the pty in the container's devpts and sends its master (named /dev/ptmx) as Python does,
    the process runs on it as its controlling terminal with the spec's consoleSize; exec -t
    without a console socket keeps the caller's stdio, as in Python. Nothing is declined."""
    import socket
    import threading

    path, log, _ = server
    root = tmp_path / "state"
    probe = "tty; stty size; [ $(cut -d' ' -f7 /proc/$$/stat) != 0 ] && echo ctty; echo on-the-pty"
    bundle = make_bundle(["sh", "-c", probe + "; sleep 100"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"].update(terminal=True, consoleSize={"height": 30, "width": 100})
    (bundle / "config.json").write_text(json.dumps(spec))
    seen = {}
    for how, server_path in (("py", ""), ("warm", path)):
        sock_path = str(tmp_path / f"{how}.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(sock_path)
        listener.listen(4)
        got: dict = {}

        def read(kind, listener=listener, got=got):
            got[kind] = _pty_output(listener, b"on-the-pty" if kind == "create" else None)

        reader = threading.Thread(target=read, args=("create",))
        reader.start()
        try:
            r = subprocess.run([str(LAUNCHER), "--root", str(root), "create", "-b", str(bundle), "--console-socket",
                                sock_path, how], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                               env=dict(os.environ, SANDBOX_SERVER=str(server_path)))
            assert r.returncode == 0, r.stderr
            assert verb("", "--root", root, "start", how).returncode == 0
            reader.join(30)
            reader = threading.Thread(target=read, args=("exec",))
            reader.start()
            r = verb(server_path, "--root", root, "exec", "-t", "--console-socket", sock_path, how, "sh", "-c", probe)
            assert r.returncode == 0, r.stderr
            reader.join(30)
            plain = verb(server_path, "--root", root, "exec", "-t", how, "sh", "-c", "tty; echo done")
            seen[how] = (got, plain.returncode, plain.stdout, plain.stderr)
            # a foreground run of a terminal bundle without a console socket: the caller's stdio
            fg = make_bundle(["sh", "-c", "tty; echo ran"])
            config = json.loads((fg / "config.json").read_text())
            config["process"]["terminal"] = True
            (fg / "config.json").write_text(json.dumps(config))
            seen[how] += _run(server_path, root, fg, f"fg-{how}")
        finally:
            listener.close()
            verb("", "--root", root, "delete", "--force", how)
    assert seen["warm"] == seen["py"], seen
    got = seen["py"][0]
    assert got["create"][0] == got["exec"][0] == b"/dev/ptmx"
    assert got["create"][1].split(b"\r\n")[:4] == [b"/dev/pts/0", b"30 100", b"ctty", b"on-the-pty"], got
    assert got["exec"][1].split(b"\r\n")[1:4] == [b"30 100", b"ctty", b"on-the-pty"], got
    assert seen["py"][1:3] == (0, "not a tty\ndone\n") and seen["py"][4:] == (0, "not a tty\nran\n", ""), seen
    assert "declined" not in log.read_text()
    assert [line.split(": ")[1] for line in served_lines(log)] == ["create", "exec", "exec", "run"], log.read_text()


def test_a_kubernetes_pod_with_the_warm_server(tmp_path_factory, driver_root, monkeypatch):
    """containerd's CRI with SANDBOX_SERVER in its environment (its shims pass it on): a GPU
    pod starts (its pause and containers created by the launcher, their roots built by the
    server's gofer), ExecSync runs through the exec front end, the container's exit is
    recorded, the pod stops and goes; the shim's create, start, kill and delete were the
    server's."""
    import shutil

    if shutil.which("containerd") is None:
        pytest.skip("containerd is not installed")
    cri_mod = pytest.importorskip("cri")
    pytest.importorskip("grpc")
    import engines

    base = tmp_path_factory.mktemp("cri-warm")
    with engines.WarmServer(base / "warm") as server:
        monkeypatch.setenv("SANDBOX_SERVER", str(server.path))
        c = cri_mod.CRI(base / "c", driver_root, trace=False)
        try:
            c.start()
            pod = c.run_pod("warm", "sandbox")
            cid = c.run_container(pod, "app", ["sleep", "1000"], env={"NVIDIA_VISIBLE_DEVICES": "all"})
            r = c.exec_sync(cid, ["sh", "-c", "ls /dev/nvidiactl; exit 4"])
            assert (r.stdout, r.exit_code) == (b"/dev/nvidiactl\n", 4), r
            done = c.run_container(pod, "done", ["sh", "-c", "exit 3"])
            st = c.wait_exited(done, timeout=20)
            assert (st.state, st.exit_code) == (c.api.CONTAINER_EXITED, 3), st
            assert not c.teardown_pod(pod)
        finally:
            problems = c.stop()
        assert not problems, problems
        log = server.log.read_text()
    lines = [line for line in log.splitlines() if ": exit " in line]
    for verb in ("create", "exec", "start", "kill", "delete"):  # (the shim reads state from its own records)
        assert any(line.startswith(f"sandbox serve: {verb}: ") for line in lines), (verb, log)
    assert "declined" not in log, log


# What the container's process sees of itself, its root and its mounts (a served create and
# one in Python must give the same), and its pid 1's root and cwd (the container's, never a
# host directory).
CREATE_PROBE = (PROBE + "; hostname; cat /proc/self/oom_score_adj; ls /dev;"
                " awk '{for (i = 7; i <= NF; i++) if ($i == \"-\") print $5, $6, $(i + 1)}' /proc/self/mountinfo;"
                " cat /proc/sys/net/ipv4/ip_forward; ls /etc/ld.so.cache /usr/lib/x86_64-linux-gnu | grep -c nvidia")


def _created(server_path, root, bundle, cid, tmp_path, *flags):
    """create (served where server_path is a server's), start, and wait for the container
    to stop: (create's exit code and output, the container's output, its state when created)."""
    out = tmp_path / f"{cid}.out"
    with open(out, "w") as f:  # (the init keeps our stdout: a pipe would end only with it)
        r = subprocess.run([str(LAUNCHER), "--root", str(root), *flags, "create", "-b", str(bundle), cid],
                           stdin=subprocess.DEVNULL, stdout=f, stderr=f, timeout=60,
                           env=dict(os.environ, SANDBOX_SERVER=str(server_path)))
    created = out.read_text()
    if r.returncode != 0:
        return r.returncode, created, None, None
    state = json.loads(verb("", "--root", root, "state", cid).stdout)
    assert verb("", "--root", root, "start", cid).returncode == 0
    deadline = time.monotonic() + 20
    while json.loads(verb("", "--root", root, "state", cid).stdout)["status"] != "stopped":
        assert time.monotonic() < deadline, out.read_text()
        time.sleep(0.02)
    assert verb("", "--root", root, "delete", cid).returncode == 0
    return r.returncode, created, out.read_text()[len(created):], state


def _normal(out: str, cid: str, as_cid: str) -> str:
    """A container's probe output without what differs from one container to the next: its
    cgroup's name, the dates of /proc files, and a new namespace's number ("new"; the host's
    are named)."""
    host = {os.stat(f"/proc/self/ns/{n}").st_ino: n for n in os.listdir("/proc/self/ns")}
    out = re.sub(r"[A-Z][a-z]{2} +[0-9]+ [0-9:]{5} ", "", out.replace(cid, as_cid))
    return re.sub(r":\[([0-9]+)\]", lambda m: f":[host {host[int(m.group(1))]}]" if int(m.group(1)) in host
                  else ":[new]", out)


def _same_state(a: dict, b: dict) -> bool:
    skip = {"id", "pid", "created"}
    return {k: v for k, v in a.items() if k not in skip} == {k: v for k, v in b.items() if k not in skip}


def _bundles(make_bundle, tmp_path):
    import fixtures

    base = json.loads((make_bundle(["true"]) / "config.json").read_text())
    full = json.loads(json.dumps(base))
    full["process"]["rlimits"] = [{"type": "RLIMIT_NOFILE", "soft": 512, "hard": 1024},
                                  {"type": "RLIMIT_NPROC", "soft": 300, "hard": 400}]
    full["process"]["capabilities"] = {k: ["CAP_CHOWN", "CAP_NET_BIND_SERVICE", "CAP_SETUID", "CAP_SETGID"]
                                       for k in ("bounding", "effective", "permitted", "inheritable", "ambient")}
    full["process"]["user"] = {"uid": 1000, "gid": 1000, "umask": 0o027, "additionalGids": [5, 7]}
    full["process"]["env"] += ["FROM_SPEC=1", "HOME=/home/x"]
    full["process"]["cwd"] = "/etc"
    full["process"]["oomScoreAdj"] = 500
    full["hostname"] = "served"
    full["linux"]["sysctl"] = {"net.ipv4.ip_forward": "1"}
    full["linux"]["seccomp"] = fixtures.engine_seccomp_profile()
    early = json.loads(json.dumps(base))  # no no_new_privs: the filter goes on before the user changes
    early["process"]["noNewPrivileges"] = False
    early["linux"]["seccomp"] = fixtures.engine_seccomp_profile()
    cgns = json.loads(json.dumps(base))
    cgns["linux"]["namespaces"].append({"type": "cgroup"})
    gpu = json.loads(json.dumps(base))
    gpu["process"]["env"] += ["NVIDIA_VISIBLE_DEVICES=all"]
    specs = {"base": base, "full": full, "seccomp-early": early, "cgroupns": cgns, "gpu": gpu}
    for spec in specs.values():
        spec["process"]["args"] = ["sh", "-c", CREATE_PROBE]
    return {name: make_bundle(**{k: v for k, v in spec.items() if k != "root"}) for name, spec in specs.items()}


def test_create_by_the_front_end_is_pythons(server, make_bundle, driver_root, tmp_path):
    """A created init made by the launcher (its root built by the server's gofer from inside
    its namespaces) runs its process as Python's init does: user, capabilities, no_new_privs,
    seccomp before and after the user change, rlimits, umask, cwd, HOME, env, oom_score_adj,
    hostname, sysctls, cgroup (and a cgroup namespace), namespaces, every mount, the GPU's
    nodes and libraries; the state is the same; none of them is declined."""
    path, log, _ = server
    root = tmp_path / "state"
    for name, bundle in _bundles(make_bundle, tmp_path).items():
        flags = ("--driver-root", str(driver_root))
        here = _created("", root, bundle, f"{name}-py", tmp_path, *flags)
        warm = _created(path, root, bundle, f"{name}-warm", tmp_path, *flags)
        assert here[:3] == (0, "", here[2]) and here[2], (name, here)
        py, served = _normal(here[2], "", ""), _normal(warm[2], f"{name}-warm", f"{name}-py")
        assert (warm[0], warm[1]) == (0, "") and served == py, (name, "".join(difflib.unified_diff(
            py.splitlines(True), served.splitlines(True))))
        assert _same_state(warm[3], here[3]), (name, warm[3], here[3])
    assert sum(": create: " in line for line in served_lines(log)) == 5, log.read_text()
    assert "declined" not in log.read_text()
    assert not os.listdir(root)
    assert len(list(Path(f"{path}.bpf").glob("*/*"))) == 1  # two bundles, one profile: one filter kept


def _in_child_pid_namespaces() -> list[tuple[int, str]]:
    """(pid, state) of every process in a pid namespace below ours, zombies included."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if len(fields.get("NSpid", "").split()) > 1:
            found.append((int(pid), fields["State"].strip()))
    return found


def test_a_served_create_leaves_only_its_init_in_the_namespace(server, make_bundle, tmp_path):
    """The builder ran in the container's pid namespace: once create returns it is gone and
    reaped (a zombie there keeps pid 1 from finishing its exit: `kill` then hangs)."""
    path, log, _ = server
    root = tmp_path / "state"
    before = _in_child_pid_namespaces()
    out = tmp_path / "c.out"
    with open(out, "w") as f:
        r = subprocess.run([str(LAUNCHER), "--root", str(root), "create", "-b", str(make_bundle(["sleep", "60"])), "c"],
                           stdin=subprocess.DEVNULL, stdout=f, stderr=f, timeout=60,
                           env=dict(os.environ, SANDBOX_SERVER=str(path)))
    try:
        assert r.returncode == 0, out.read_text()
        init = json.loads(verb(path, "--root", root, "state", "c").stdout)["pid"]
        assert [p for p in _in_child_pid_namespaces() if p not in before] == [(init, "S (sleeping)")]
    finally:
        verb(path, "--root", root, "delete", "--force", "c")
    assert "declined" not in log.read_text() and sum(": create: " in line for line in served_lines(log)) == 1


def test_a_created_init_joins_namespaces_by_path(server, make_bundle, tmp_path):
    """As a pod's containers join its sandbox's network, ipc and uts namespaces by path."""
    path, log, _ = server
    root = tmp_path / "state"
    _launch("", root, make_bundle(["sleep", "100"]), "pause", tmp_path)
    try:
        pause = json.loads(verb("", "--root", root, "state", "pause").stdout)["pid"]
        spec = json.loads((make_bundle(["true"]) / "config.json").read_text())
        spec["linux"]["namespaces"] = [{"type": "pid"}, {"type": "mount"}] + [
            {"type": t, "path": f"/proc/{pause}/ns/{n}"} for t, n in (("network", "net"), ("ipc", "ipc"), ("uts", "uts"))]
        probe = "ls -l /proc/self/ns | cut -c40- | grep -v pid; hostname"
        bundle = make_bundle(["sh", "-c", probe], linux=spec["linux"])
        here = _created("", root, bundle, "j-py", tmp_path)
        warm = _created(path, root, bundle, "j-warm", tmp_path)
        assert warm[:2] == here[:2] == (0, "") and _normal(warm[2], "", "") == _normal(here[2], "", ""), (warm, here)
        ns = {line.split(" -> ")[0].split()[-1]: line.split(" -> ")[1] for line in warm[2].splitlines() if " -> " in line}
        assert [ns[n] for n in ("net", "ipc", "uts")] == [os.readlink(f"/proc/{pause}/ns/{n}") for n in ("net", "ipc", "uts")]
    finally:
        verb("", "--root", root, "delete", "--force", "pause")
    assert "declined" not in log.read_text() and sum(": create: " in line for line in served_lines(log)) == 1


def test_a_created_init_in_a_user_namespace(server, make_bundle, tmp_path):
    """Served as in Python (runc's order: the launcher's child sets the rlimits and the
    real-time policy with the host's privileges, enters the namespace, the launcher writes its
    maps, it becomes root there and unshares the rest): the same maps, ids, capabilities,
    owners, limits and scheduling; a host directory of root's, 0700, out of reach; a mapping
    the kernel refuses is the same one line, and nothing is left."""
    path, log, _ = server
    root = tmp_path / "state"
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "secret").write_text("host only\n")
    probe = ("cat /proc/self/uid_map /proc/self/gid_map; id; stat -c '%U %G' / /dev/null; "
             "grep -E 'CapEff|NoNewPrivs' /proc/self/status; ulimit -Hu; cut -d' ' -f19,41 /proc/self/stat; "
             "cat /p/secret 2>&1")
    amap = [{"containerID": 0, "hostID": 100000, "size": 65536}]
    bundle = make_bundle(["sh", "-c", probe])
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"]["namespaces"].append({"type": "user"})
    spec["linux"].update({"uidMappings": amap, "gidMappings": amap})
    spec["process"]["rlimits"] = [{"type": "RLIMIT_NPROC", "hard": 4096, "soft": 512}]
    spec["process"]["scheduler"] = {"policy": "SCHED_BATCH", "nice": 5}
    spec["mounts"].append({"destination": "/p", "type": "bind", "source": str(private), "options": ["rbind"]})
    (bundle / "config.json").write_text(json.dumps(spec))
    refused = make_bundle(["true"])
    bad = json.loads((refused / "config.json").read_text())
    bad["linux"]["namespaces"].append({"type": "user"})
    bad["linux"].update({"uidMappings": amap, "gidMappings": [{"containerID": 0, "hostID": 4294967290, "size": 100}]})
    (refused / "config.json").write_text(json.dumps(bad))
    here = _created("", root, bundle, "u-py", tmp_path)
    warm = _created(path, root, bundle, "u-warm", tmp_path)
    assert here[0] == 0 and warm[:3] == here[:3] and _same_state(warm[3], here[3]), (warm, here)
    lines = warm[2].splitlines()
    assert lines[0].split() == lines[1].split() == ["0", "100000", "65536"], lines
    assert lines[4] == "nobody nogroup" and lines[7] == "4096", lines  # (/dev/null: the host's, bound)
    assert lines[8] == "5 3", lines  # (nice, SCHED_BATCH)
    assert "Permission denied" in lines[9], lines
    failed = [_created(p, root, refused, f"r-{n}", tmp_path) for p, n in (("", "py"), (path, "warm"))]
    assert failed[0][0] == failed[1][0] == 1, failed
    for f in failed:
        assert len(f[1].splitlines()) == 1 and "linux.gidMappings: /proc/" in f[1] and "Invalid argument" in f[1], f
    assert "declined" not in log.read_text() and sum(": create: " in line for line in served_lines(log)) == 2
    assert not os.listdir(root) and not [d for d in Path("/sys/fs/cgroup").glob("**/r-*") if d.is_dir()]


def test_a_created_init_in_a_pid_or_mount_namespace_not_its_own(server, make_bundle, tmp_path):
    """Served as in Python: an init created into another container's pid namespace (a pod's
    shared process namespace) or mount namespace, or into the host's pid namespace (no pid
    namespace in the spec): the same processes seen, the same namespaces, the same root."""
    path, log, _ = server
    root = tmp_path / "state"
    _launch("", root, make_bundle(["sleep", "100"]), "pause", tmp_path)
    try:
        pause = json.loads(verb("", "--root", root, "state", "pause").stdout)["pid"]
        own = [{"type": t} for t in ("ipc", "uts", "network")]
        cases = {"pid": [{"type": "pid", "path": f"/proc/{pause}/ns/pid"}, {"type": "mount"}, *own],
                 "mnt": [{"type": "pid"}, {"type": "mount", "path": f"/proc/{pause}/ns/mnt"}, *own],
                 "host": [{"type": "mount"}, *own]}
        probe = ("readlink /proc/self/ns/pid; readlink /proc/self/ns/mnt; cat /proc/1/comm; "
                 "[ $$ = 1 ] && echo pid-1; ls / | head -3")
        for name, namespaces in cases.items():
            bundle = make_bundle(["sh", "-c", probe], linux={"namespaces": namespaces})
            here = _created("", root, bundle, f"{name}-py", tmp_path)
            warm = _created(path, root, bundle, f"{name}-warm", tmp_path)
            if name == "mnt":  # (the bundle's paths resolve in that namespace: there, none is)
                assert warm[0] == here[0] == 1 and warm[1].replace("-warm", "") == here[1].replace("-py", ""), (warm, here)
                assert "rootfs" in warm[1] and "No such file or directory" in warm[1], warm
                continue
            assert warm[:2] == here[:2] == (0, "") and _normal(warm[2], "", "") == _normal(here[2], "", ""), \
                (name, warm, here)
            lines = warm[2].splitlines()
            if name == "pid":
                assert lines[0] == os.readlink(f"/proc/{pause}/ns/pid") and lines[2] == "sleep", lines
            if name == "host":
                assert lines[0] == os.readlink("/proc/self/ns/pid") and "pid-1" not in lines, lines
    finally:
        verb("", "--root", root, "delete", "--force", "pause")
    assert "declined" not in log.read_text() and sum(": create: " in line for line in served_lines(log)) == 3
    assert not [c for c in os.listdir(root)], os.listdir(root)


def test_a_failed_create_is_pythons_and_leaves_nothing(server, make_bundle, tmp_path, driver_root):
    """A bundle error, a GPU that is not there, a cwd that is a file (found while building
    the root), a createContainer hook that fails: the same line and code as in Python, and no
    state, process or cgroup left (the launcher, in the cgroup, is moved out first); a
    program that is not there fails at start, on the container's stderr, as in Python."""
    path, log, _ = server
    root = tmp_path / "state"
    bad_cwd = make_bundle(["true"])
    spec = json.loads((bad_cwd / "config.json").read_text())
    spec["process"]["cwd"] = "/etc/passwd"
    (bad_cwd / "config.json").write_text(json.dumps(spec))
    cases = {"no-gpu": make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=7"]), "bad-cwd": bad_cwd,
             "no-program": make_bundle(["no-such-program"])}
    bad = make_bundle(["true"])
    (bad / "config.json").write_text('{"ociVersion": "1.0.2", "process": 5, "root": {"path": "rootfs"}}')
    cases["bad-bundle"] = bad
    cases["hook-fails"] = make_bundle(["true"], hooks={"createContainer": [{"path": "/bin/false"}]})
    for name, bundle in cases.items():
        here = _created("", root, bundle, f"{name}-py", tmp_path, "--driver-root", str(driver_root))
        warm = _created(path, root, bundle, f"{name}-warm", tmp_path, "--driver-root", str(driver_root))
        assert warm[:3] == (here[0], here[1].replace(f"{name}-py", f"{name}-warm"), here[2]), (name, warm, here)
        assert (here[0] != 0) is (name != "no-program"), (name, here)
        assert not os.listdir(root), (name, os.listdir(root))
        left = [d for d in Path("/sys/fs/cgroup").glob(f"**/{name}-*") if d.is_dir()]
        assert not left, (name, left)
    assert "declined" not in log.read_text()
    assert sum(": create: " in line for line in served_lines(log)) == len(cases), log.read_text()


def test_a_process_of_any_size_is_served(server, make_bundle, tmp_path):
    """5,000 variables and 3,000 arguments, plans bigger than one message (fp.MAX_MESSAGE: they
    go in a memory file): created and exec'd through the launcher as in Python, nothing
    declined."""
    path, log, _ = server
    root = tmp_path / "state"
    x = "x" * 50
    many = [f"V{i}={x}" for i in range(5000)]
    args = ["sh", "-c", 'echo "$# $V4999"', "sh", *[f"a{i}" for i in range(3000)]]
    bundle = make_bundle(args, many)
    here = _created("", root, bundle, "big-py", tmp_path)
    warm = _created(path, root, bundle, "big-warm", tmp_path)
    assert warm[:3] == here[:3] == (0, "", f"3000 {x}\n"), (warm, here)
    _launch("", root, make_bundle(["sleep", "60"]), "big-exec", tmp_path)
    try:
        r = verb(path, "--root", root, "exec", *[f"--env=E{i}={x}" for i in range(4000)], "big-exec", "sh", "-c",
                 'echo "$E3999"; env | grep -c ^E')
        assert (r.returncode, r.stdout) == (0, f"{x}\n4000\n"), r.stderr
    finally:
        verb("", "--root", root, "delete", "--force", "big-exec")
    assert "declined" not in log.read_text(), log.read_text()
    assert not os.listdir(root)


def test_start_container_hooks_served_as_in_python(server, make_bundle, tmp_path):
    """pid 1 runs the startContainer hooks after start, before its exec, as Python's init does:
    the state on stdin, the hook's own environment, cwd "/", umask 022, inside the container;
    a hook that fails, times out or cannot be run ends the container with its line on the
    container's stderr, and the command never runs."""
    path, log, _ = server
    root = tmp_path / "state"
    out = tmp_path / "hooks"
    out.mkdir()
    probe = "cat > /out/$0.state; (umask; pwd; env | sort; ls /proc/self/fd) > /out/$0.seen"
    cases = {
        "ok": [{"path": "/bin/sh", "args": ["sh", "-c", probe, "A"], "env": ["X=1", "Y=2", "X=3"]},
               {"path": "/bin/sh", "args": ["sh", "-c", probe, "B"]}],
        "fails": [{"path": "/bin/sh", "args": ["sh", "-c", "echo one; echo why it failed >&2; exit 3"]}],
        "quiet": [{"path": "/bin/sh", "args": ["sh", "-c", "echo only stdout; kill -9 $$"]}],
        "slow": [{"path": "/bin/sleep", "args": ["sleep", "30"], "timeout": 1}],
        "missing": [{"path": "/no/such/hook"}],
    }
    results = {}
    for name, hooks in cases.items():
        bundle = make_bundle(["sh", "-c", "echo ran"], hooks={"startContainer": hooks})
        spec = json.loads((bundle / "config.json").read_text())
        spec["mounts"].append({"destination": "/out", "type": "bind", "source": str(out), "options": ["rbind"]})
        (bundle / "config.json").write_text(json.dumps(spec))
        for cid, server_path in ((f"{name}-py", ""), (f"{name}-warm", path)):
            got = _created(server_path, root, bundle, cid, tmp_path)
            seen = {p.name: re.sub(r'"pid":[0-9]+', '"pid":PID', p.read_text().replace(cid, "CID")) for p in out.iterdir()}
            for p in out.iterdir():
                p.unlink()
            results[cid] = (got[:3], seen)
        assert results[f"{name}-warm"] == results[f"{name}-py"], (name, results[f"{name}-warm"], results[f"{name}-py"])
    ok, seen = results["ok-warm"]
    assert ok == (0, "", "ran\n"), ok
    assert seen["A.state"] == seen["B.state"] and '"id":"CID","status":"created","pid":PID' in seen["A.state"], seen
    assert seen["A.seen"] == "0022\n/\nPATH=/sbin:/usr/sbin:/bin:/usr/bin\nPWD=/\nSHLVL=1\nX=3\nY=2\n0\n1\n2\n3\n", seen
    assert "X=" not in seen["B.seen"] and seen["B.seen"].endswith("\n0\n1\n2\n3\n"), seen  # (3: ls's own directory)
    assert results["fails-warm"][0][2] == "sandbox: hooks.startContainer[0] /bin/sh: exit status 3: why it failed\n"
    assert results["quiet-warm"][0][2] == "sandbox: hooks.startContainer[0] /bin/sh: exit status -9: only stdout\n"
    assert results["slow-warm"][0][2] == "sandbox: hooks.startContainer[0] /bin/sleep: timed out after 1s\n"
    assert results["missing-warm"][0][2] == ("sandbox: hooks.startContainer[0] /no/such/hook: "
                                             "No such file or directory\n")
    assert "declined" not in log.read_text()
    assert not os.listdir(root)


def test_a_served_create_runs_the_hooks_as_python_does(server, make_bundle, tmp_path):
    """prestart and createRuntime in the runtime's namespaces while the root is being built,
    createContainer in the container's (Docker's libnetwork hook is a prestart hook): each
    reads the state with the init's pid, as in Python's create."""
    path, log, _ = server
    root = tmp_path / "state"
    out = tmp_path / "hooks"
    out.mkdir()

    def hook(stage):
        return [{"path": "/bin/sh", "args": ["sh", "-c", f"cat > {out}/{stage}-$0.json; readlink /proc/self/ns/mnt"
                                             f" /proc/self/ns/net > {out}/{stage}-$0.ns", "{cid}"]}]

    results = {}
    for cid, server_path in (("h-py", ""), ("h-warm", path)):
        hooks = {stage: [dict(h, args=[a.replace("{cid}", cid) for a in h["args"]]) for h in hook(stage)]
                 for stage in ("prestart", "createRuntime", "createContainer")}
        bundle = make_bundle(["sleep", "60"], hooks=hooks)
        with open(tmp_path / f"{cid}.out", "w") as f:
            r = subprocess.run([str(LAUNCHER), "--root", str(root), "create", "-b", str(bundle), cid],
                               stdin=subprocess.DEVNULL, stdout=f, stderr=f, timeout=60,
                               env=dict(os.environ, SANDBOX_SERVER=str(server_path)))
        try:
            assert r.returncode == 0, (tmp_path / f"{cid}.out").read_text()
            init = json.loads(verb("", "--root", root, "state", cid).stdout)["pid"]
            inside = [os.readlink(f"/proc/{init}/ns/{n}") for n in ("mnt", "net")]
            here = [os.readlink(f"/proc/self/ns/{n}") for n in ("mnt", "net")]
            for stage in ("prestart", "createRuntime", "createContainer"):
                state = json.loads((out / f"{stage}-{cid}.json").read_text())
                ns = (out / f"{stage}-{cid}.ns").read_text().split()
                assert (state["id"], state["pid"], state["status"]) == (cid, init, "creating"), (stage, state)
                assert ns == (inside if stage == "createContainer" else here), (cid, stage, ns)
                results[(cid, stage)] = {k: v for k, v in state.items() if k not in ("id", "pid", "bundle")}
        finally:
            verb("", "--root", root, "delete", "--force", cid)
    for stage in ("prestart", "createRuntime", "createContainer"):
        assert results[("h-warm", stage)] == results[("h-py", stage)]
    assert "declined" not in log.read_text() and sum(": create: " in line for line in served_lines(log)) == 1


def test_a_chrooted_launcher_is_not_served(server, make_bundle, tmp_path):
    """A launcher whose root is not the server's (an engine in a chroot): its paths are not
    the server's. Declined: the launcher's own planner (chrooted as it is) plans create, and
    the container's root is its own, not the host's."""
    path, log, _ = server
    chroot = tmp_path / "chr"
    chroot.mkdir()
    bundle = make_bundle(["sh", "-c", "ls /"])
    out = tmp_path / "out"
    sb = f"{LAUNCHER} --root {tmp_path}/state"
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        f"mount --rbind / {chroot} && chroot {chroot} {sb} create -b {bundle} c >{out} 2>&1 &&"
                        f" chroot {chroot} {sb} start c"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, SANDBOX_SERVER=str(path)))
    assert r.returncode == 0, (r.stderr, out.read_text())
    deadline = time.monotonic() + 10
    while "bin" not in out.read_text().split() and time.monotonic() < deadline:
        time.sleep(0.02)
    verb("", "--root", tmp_path / "state", "delete", "--force", "c")
    listing = out.read_text().split()
    assert "bin" in listing and "work" not in listing, listing
    assert "declined: the server serves only root with CAP_SYS_ADMIN in its namespaces and root" in log.read_text()


def _run(server_path, root, bundle, cid, *flags, signal_after=None):
    """`sandbox run` (served where server_path is a server's): (exit code, stdout, stderr);
    ``signal_after``: (seconds, signal) sent to the launcher meanwhile."""
    proc = subprocess.Popen([str(LAUNCHER), "--root", str(root), *flags, "run", "--id", cid, str(bundle)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, SANDBOX_SERVER=str(server_path)))
    if signal_after is not None:
        time.sleep(signal_after[0])
        proc.send_signal(signal_after[1])
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def test_run_by_the_front_end_is_pythons(server, make_bundle, driver_root, tmp_path):
    """A foreground `sandbox run`, served: the launcher is pid 1's parent and waits for it;
    the container's output, exit code, poststart and poststop hooks are Python's run's, and
    nothing is left."""
    path, log, _ = server
    root = tmp_path / "state"
    marks = tmp_path / "marks"
    marks.mkdir()
    hooks = {stage: [{"path": "/bin/sh", "args": ["sh", "-c", f"cat > {marks}/{stage}-$0", "{cid}"]}]
             for stage in ("poststart", "poststop")}
    bundles = _bundles(make_bundle, tmp_path)
    cases = {"base": bundles["base"], "gpu": bundles["gpu"],
             "exit": make_bundle(["sh", "-c", "echo out; echo err >&2; exit 3"])}
    for name, bundle in cases.items():
        spec = json.loads((bundle / "config.json").read_text())
        results = []
        for cid, server_path in ((f"{name}-py", ""), (f"{name}-warm", path)):
            spec["hooks"] = {stage: [dict(h, args=[a.replace("{cid}", cid) for a in h["args"]]) for h in hs]
                             for stage, hs in hooks.items()}
            (bundle / "config.json").write_text(json.dumps(spec))
            code, out, err = _run(server_path, root, bundle, cid, "--driver-root", str(driver_root))
            states = [json.loads((marks / f"{stage}-{cid}").read_text()) for stage in ("poststart", "poststop")]
            results.append((code, _normal(out, cid, name), err, [(s["status"], s["id"] == cid) for s in states]))
        assert results[1] == results[0], (name, results)
        assert not os.listdir(root), (name, os.listdir(root))
        assert not [d for d in Path("/sys/fs/cgroup").glob(f"**/{name}-*") if d.is_dir()], name
    assert results[0][:3] == (3, "out\n", "err\n")
    assert "declined" not in log.read_text()
    assert sum(": run: " in line for line in served_lines(log)) == len(cases), log.read_text()


def test_a_served_run_forwards_signals(server, make_bundle, tmp_path):
    """SIGTERM to `sandbox run` reaches the container's process, whose exit is the run's; an
    init killed by a signal is 128+N, as in Python's run (and runc's)."""
    path, log, _ = server
    root = tmp_path / "state"
    bundle = make_bundle(["sh", "-c", "trap 'echo got it; exit 7' TERM; echo up; sleep 60 & wait"])
    code, out, _ = _run(path, root, bundle, "t", signal_after=(1.0, signal.SIGTERM))
    assert (code, out) == (7, "up\ngot it\n")
    codes = []
    for cid, server_path in (("k-py", ""), ("k-warm", path)):
        proc = subprocess.Popen([str(LAUNCHER), "--root", str(root), "run", "--id", cid, str(make_bundle(["sleep", "60"]))],
                                stdin=subprocess.DEVNULL, env=dict(os.environ, SANDBOX_SERVER=str(server_path)))
        deadline = time.monotonic() + 20
        while (state := verb("", "--root", root, "state", cid)).returncode != 0 or \
                json.loads(state.stdout)["status"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(json.loads(state.stdout)["pid"], signal.SIGKILL)
        codes.append(proc.wait(timeout=20))
    assert codes == [137, 137]
    assert not os.listdir(root)
    assert sum(": run: " in line for line in served_lines(log)) == 2, log.read_text()


def test_a_killed_run_takes_its_container_along(server, make_bundle, tmp_path):
    """A served run's launcher killed (SIGKILL): the server's child kills the container and
    removes its state and cgroups, as a Python run's gofer does when its supervisor dies."""
    path, log, _ = server
    root = tmp_path / "state"
    code, _, _ = _run(path, root, make_bundle(["sleep", "60"]), "gone", signal_after=(1.0, signal.SIGKILL))
    assert code == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while os.listdir(root) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not os.listdir(root)
    assert not [d for d in Path("/sys/fs/cgroup").glob("**/gone") if d.is_dir()]
    assert not [p for p in _in_child_pid_namespaces() if Path(f"/proc/{p[0]}/cmdline").read_bytes() == b"sleep\x0060\x00"]
    assert "declined" not in log.read_text() and sum(": run: " in line for line in served_lines(log)) == 1


def test_a_served_detached_run(server, make_bundle, tmp_path):
    """`run -d`, served: the container is created and started, and left to the caller."""
    path, log, _ = server
    root = tmp_path / "state"
    with open(tmp_path / "out", "w") as f:
        r = subprocess.run([str(LAUNCHER), "--root", str(root), "run", "-d", "-b", str(make_bundle(["sleep", "60"])),
                            "d"], stdin=subprocess.DEVNULL, stdout=f, stderr=f, timeout=60,
                           env=dict(os.environ, SANDBOX_SERVER=str(path)))
    try:
        assert r.returncode == 0, (tmp_path / "out").read_text()
        state = json.loads(verb(path, "--root", root, "state", "d").stdout)
        assert state["status"] == "running" and alive(state["pid"])
    finally:
        verb(path, "--root", root, "delete", "--force", "d")
    assert not os.listdir(root)
    assert "declined" not in log.read_text() and sum(": run: " in line for line in served_lines(log)) == 1


def _waiters(server_proc) -> list[int]:
    """The processes that wait for served runs' containers: the server's forks, no longer its
    children (each in a session of its own)."""
    me = Path(f"/proc/{server_proc.pid}/cmdline").read_bytes()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(pid) != server_proc.pid and os.getsid(int(pid)) == int(pid) and \
                    Path(f"/proc/{pid}/cmdline").read_bytes() == me:
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_a_served_runs_wait_outlives_the_server(server, make_bundle, tmp_path):
    """The wait is a process of its own, in a session of its own, not one of the server's
    MAX_CHILDREN: the server killed meanwhile, the run still ends with its container's code
    and removes it."""
    path, log, proc = server
    root = tmp_path / "state"
    bundle = make_bundle(["sh", "-c", "sleep 2; exit 7"])
    run = subprocess.Popen([str(LAUNCHER), "--root", str(root), "run", "--id", "w", str(bundle)],
                           stdin=subprocess.DEVNULL, env=dict(os.environ, SANDBOX_SERVER=str(path)))
    deadline = time.monotonic() + 20
    while not _waiters(proc):
        assert time.monotonic() < deadline and run.poll() is None
        time.sleep(0.02)
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    children = [p for p in children if Path(f"/proc/{p}/comm").read_text().strip() != SPARE]  # (none at work)
    assert children == [] and len(_waiters(proc)) == 1
    proc.kill()
    proc.wait()
    assert run.wait(timeout=30) == 7
    assert not os.listdir(root) and not [d for d in Path("/sys/fs/cgroup").glob("**/w") if d.is_dir()]


def test_a_run_whose_waiter_died_removes_its_container(server, make_bundle, tmp_path):
    """The waiting process killed: at its container's end the launcher removes it itself
    (`delete`, back in our namespaces, cwd and oom_score_adj: a relative --root is the
    caller's, the poststop hook runs in the host's network namespace, the server serves a
    caller in its own cgroup namespace), and exits with its code."""
    path, log, proc = server
    root = tmp_path / "state"
    seen = tmp_path / "poststop"
    spec = json.loads((make_bundle(["true"]) / "config.json").read_text())
    linux = dict(spec["linux"], namespaces=spec["linux"]["namespaces"] + [{"type": "cgroup"}])
    hook = {"path": "/bin/sh", "args": ["sh", "-c", f"readlink /proc/self/ns/net /proc/self/ns/cgroup > {seen}; "
                                                    f"cat /proc/self/oom_score_adj >> {seen}"]}
    bundle = make_bundle(["sh", "-c", "sleep 2; exit 7"], hooks={"poststop": [hook]}, linux=linux,
                         process=dict(spec["process"], args=["sh", "-c", "sleep 2; exit 7"], oomScoreAdj=900))
    run = subprocess.Popen([str(LAUNCHER), "--root", "state", "run", "--id", "d", str(bundle)], cwd=tmp_path,
                           stdin=subprocess.DEVNULL, env=dict(os.environ, SANDBOX_SERVER=str(path)))
    deadline = time.monotonic() + 20
    while not _waiters(proc):
        assert time.monotonic() < deadline and run.poll() is None
        time.sleep(0.02)
    os.kill(_waiters(proc)[0], signal.SIGKILL)
    assert run.wait(timeout=30) == 7
    assert not os.listdir(root) and not [d for d in Path("/sys/fs/cgroup").glob("**/d") if d.is_dir()]
    assert ": delete: " in log.read_text() and "declined" not in log.read_text()
    mine = [os.readlink(f"/proc/self/ns/{n}") for n in ("net", "cgroup")] + [Path("/proc/self/oom_score_adj").read_text()]
    assert seen.read_text().split() == [m.strip() for m in mine]


def test_signals_reach_a_served_run_while_it_starts(server, make_bundle, tmp_path):
    """A SIGTERM while the poststart hooks run (the container has exec'd) reaches the
    container, as in Python's run; and a caller that ignores SIGCHLD still gets the code."""
    path, log, _ = server
    hooks = {"poststart": [{"path": "/bin/sleep", "args": ["sleep", "2"]}]}
    bundle = make_bundle(["sh", "-c", "trap 'exit 7' TERM; sleep 10 & wait"], hooks=hooks)
    for cid, server_path in (("s-py", ""), ("s-warm", path)):
        code, _, _ = _run(server_path, tmp_path / "state", bundle, cid, signal_after=(1.0, signal.SIGTERM))
        assert code == 7, cid
    ignoring = subprocess.run(
        [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGCHLD, signal.SIG_IGN); "
         "os.execv(sys.argv[1], sys.argv[1:])", str(LAUNCHER), "--root", str(tmp_path / "state"), "run", "--id",
         "i", str(make_bundle(["sh", "-c", "exit 42"]))],
        stdin=subprocess.DEVNULL, env=dict(os.environ, SANDBOX_SERVER=str(path)), timeout=60)
    assert ignoring.returncode == 42
    assert not os.listdir(tmp_path / "state")
    assert sum(": run: " in line for line in served_lines(log)) == 2, log.read_text()


def test_a_server_empties_its_filter_cache_as_it_starts(tmp_path):
    """What another server compiled (older code, another libseccomp) is never read back."""
    import engines

    with engines.WarmServer(tmp_path) as warm:
        first = warm.proc.pid
        (Path(f"{warm.path}.bpf") / str(first) / "stale").write_bytes(b"\0" * 8)
        (Path(f"{warm.path}.bpf") / "stray").write_bytes(b"\0" * 8)
    with engines.WarmServer(tmp_path) as warm:
        assert os.listdir(f"{warm.path}.bpf") == [str(warm.proc.pid)]


V1 = os.path.isdir("/sys/fs/cgroup/pids") and not os.path.exists("/sys/fs/cgroup/cgroup.controllers")


@pytest.fixture
def shared_cgroup():
    """A cgroup someone else made, with a host process in it, in every v1 hierarchy: (its
    path, the process)."""
    if not V1:
        pytest.skip("needs cgroup v1")
    rel = f"sandbox-shared-{os.getpid()}"
    dirs = [os.path.join(d, rel) for d in sorted({os.path.realpath(e.path) for e in os.scandir("/sys/fs/cgroup")})
            if os.path.ismount(d) and not os.path.exists(os.path.join(d, "cgroup.controllers"))]
    host = subprocess.Popen(["sleep", "300"])
    try:
        for d in dirs:
            os.mkdir(d)
            for name in ("cpuset.cpus", "cpuset.mems"):  # (an empty cpuset takes no process)
                if os.path.exists(os.path.join(d, name)):
                    Path(d, name).write_text(Path(os.path.dirname(d), name).read_text())
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(host.pid))
        yield "/" + rel, host
    finally:
        host.kill()
        host.wait()
        for d in reversed(dirs):
            _rmdir(d)


def _rmdir(d: str) -> None:
    for _ in range(100):
        try:
            os.rmdir(d)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


def test_a_container_being_created_is_not_killed_or_deleted(server, shared_cgroup, make_bundle, tmp_path):
    """delete (with --force or not) and kill (--all or not) of a container whose create is
    running its prestart hook: refused in runc's words (it does not exist yet), and nothing
    is signalled: not the host's process in the cgroup the bundle names, not the launcher
    (served, it is in that cgroup), not the create, which ends as it would have; Python's
    and served alike. A create killed meanwhile leaves a stopped container that kill --all
    and delete remove without a signal. Before the init was known, the gofer's pid (gone at
    once) read as a stopped container, and every member of the cgroup was killed."""
    path, log, _ = server
    where, host = shared_cgroup
    mark, hold = tmp_path / "hook-runs", tmp_path / "hold"  # (the hook waits until the test is done with it)
    bundle = make_bundle(["sleep", "300"], hooks={"prestart": [{"path": "/bin/sh", "args": [
        "sh", "-c", f"touch {mark}; i=0; while test -e {hold} && [ $i -lt 1500 ]; do sleep 0.02; i=$((i+1)); done"]}]})
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"]["cgroupsPath"] = where
    (bundle / "config.json").write_text(json.dumps(spec))
    root = tmp_path / "state"
    for cid, server_path in (("b-py", ""), ("b-warm", path)):
        out = tmp_path / f"{cid}.out"
        hold.touch()
        with open(out, "w") as f:
            create = subprocess.Popen([str(LAUNCHER), "--root", str(root), "create", "-b", str(bundle), cid],
                                      stdin=subprocess.DEVNULL, stdout=f, stderr=f,
                                      env=dict(os.environ, SANDBOX_SERVER=str(server_path)))
        try:
            deadline = time.monotonic() + 20
            while not mark.exists():
                assert time.monotonic() < deadline and create.poll() is None, out.read_text()
                time.sleep(0.02)
            mark.unlink()
            answers = [(args, how, verb(how, "--root", root, *args))
                       for args in (["delete", cid], ["kill", cid, "KILL"], ["kill", "--all", cid, "KILL"],
                                    ["delete", "--force", cid]) for how in ("", path)]
            assert host.poll() is None, "the host's process was killed"
            assert create.poll() is None, out.read_text()
            hold.unlink()
            for args, how, r in answers:
                assert r.returncode == 1 and r.stderr == f"sandbox {args[0]}: container does not exist yet: " \
                    f"{cid!r} is being created (under {root})\n", (cid, args, how, r.stderr)
            assert create.wait(timeout=60) == 0, out.read_text()
            assert json.loads(verb("", "--root", root, "state", cid).stdout)["status"] == "created"
            assert host.poll() is None, "the host's process was killed"
        finally:
            if create.poll() is None:
                create.kill()
                create.wait()
            verb("", "--root", root, "delete", "--force", cid)
        assert host.poll() is None, "the host's process was killed"
    # a create whose launcher is killed before its init is known: its planner (ours, or the
    # server's child) sees the launcher gone and removes what it made; no signal reaches the host's
    for server_path in ("", path):
        hold.touch()
        with open(tmp_path / "k.out", "w") as f:
            create = subprocess.Popen([str(LAUNCHER), "--root", str(root), "create", "-b", str(bundle), "k"],
                                      stdin=subprocess.DEVNULL, stdout=f, stderr=f,
                                      env=dict(os.environ, SANDBOX_SERVER=str(server_path)))
        deadline = time.monotonic() + 20
        while not mark.exists():
            assert time.monotonic() < deadline and create.poll() is None, (tmp_path / "k.out").read_text()
            time.sleep(0.02)
        mark.unlink()
        create.kill()
        create.wait()
        r = verb("", "--root", root, "kill", "k", "KILL")
        assert r.returncode == 1 and "is being created" in r.stderr, r.stderr
        hold.unlink()
        deadline = time.monotonic() + 20
        while os.listdir(root) or Path(f"/sys/fs/cgroup/pids{where}/cgroup.procs").read_text().split() != [str(host.pid)]:
            assert time.monotonic() < deadline, "the killed create left something"
            time.sleep(0.05)
        assert host.poll() is None
    assert "declined" not in log.read_text()


def test_a_relative_cgroups_path_is_below_the_callers_cgroup(server, make_bundle, tmp_path):
    """The default cgroup (the id) and a relative cgroupsPath are below the caller's own
    cgroup (the launcher's), as in Python's create, never the server's: the container stays
    under the caller's limits."""
    if not V1:
        pytest.skip("needs cgroup v1")
    path, log, _ = server
    caller = f"sandbox-caller-{os.getpid()}"
    procs = f"/sys/fs/cgroup/pids/{caller}/cgroup.procs"
    os.mkdir(os.path.dirname(procs))
    root = tmp_path / "state"
    seen: dict[str, str] = {}
    made: list[str] = []
    try:
        for cid, server_path, relative in (("d-py", "", None), ("d-warm", path, None),
                                           ("r-py", "", f"rel-{os.getpid()}-py"),
                                           ("r-warm", path, f"rel-{os.getpid()}-warm")):
            bundle = make_bundle(["sleep", "300"])
            if relative:
                spec = json.loads((bundle / "config.json").read_text())
                spec["linux"]["cgroupsPath"] = relative
                (bundle / "config.json").write_text(json.dumps(spec))
            made.append(cid)
            with open(tmp_path / f"{cid}.out", "w") as f:  # (the launcher, in the caller's cgroup)
                r = subprocess.run(["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", str(LAUNCHER),
                                    "--root", str(root), "create", "-b", str(bundle), cid],
                                   stdin=subprocess.DEVNULL, stdout=f, stderr=f, timeout=60,
                                   env=dict(os.environ, SANDBOX_SERVER=str(server_path)))
            assert r.returncode == 0, (tmp_path / f"{cid}.out").read_text()
            init = json.loads(verb("", "--root", root, "state", cid).stdout)["pid"]
            with open(f"/proc/{init}/cgroup") as f:
                seen[cid] = next(line.split(":", 2)[2].strip() for line in f if ":pids:" in line)
            assert seen[cid] == f"/{caller}/{relative or cid}", (cid, seen)
    finally:
        for cid in made:
            verb("", "--root", root, "delete", "--force", cid)
        _rmdir(os.path.dirname(procs))
    assert len(seen) == 4 and not os.listdir(root)
    assert "declined" not in log.read_text() and sum(": create: " in line for line in served_lines(log)) == 2


def test_an_exited_container_is_answered_in_runcs_words(server, make_bundle, tmp_path):
    """kill of a container that has exited, kill and delete of an id that has none: runc's
    exit codes and runc's phrases in the line ("container not running", "container does not
    exist"), which containerd's shim, podman and Docker match to take a container for gone
    (a pod whose container had exited could not be stopped); Python's and served alike."""
    path, log, _ = server
    bundle = make_bundle(["true"])
    runc = ["runc", "--root", str(tmp_path / "runc")]
    for cmd in (["create", "-b", str(bundle), "x"], ["start", "x"]):
        subprocess.run(runc + cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True, timeout=60)
    root = tmp_path / "state"
    for cid, server_path in (("x-py", ""), ("x-warm", path)):
        with open(tmp_path / f"{cid}.out", "w") as f:
            r = subprocess.run([str(LAUNCHER), "--root", str(root), "create", "-b", str(bundle), cid],
                               stdin=subprocess.DEVNULL, stdout=f, stderr=f, timeout=60,
                               env=dict(os.environ, SANDBOX_SERVER=str(server_path)))
        assert r.returncode == 0 and verb(server_path, "--root", root, "start", cid).returncode == 0
    deadline = time.monotonic() + 20
    while not all(json.loads(r.stdout)["status"] == "stopped" for r in (
            subprocess.run(runc + ["state", "x"], capture_output=True, text=True, timeout=60),
            *(verb("", "--root", root, "state", cid) for cid in ("x-py", "x-warm")))):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    for args in (["kill", "{}", "KILL"], ["kill", "nope", "KILL"], ["delete", "nope"], ["kill", "--all", "{}", "KILL"],
                 ["delete", "--force", "nope"], ["delete", "{}"]):
        theirs = subprocess.run(runc + [a.replace("{}", "x") for a in args], capture_output=True, text=True,
                                timeout=60)
        words = re.findall(r'msg="([^"]*)"', theirs.stderr)
        for cid, server_path in (("x-py", ""), ("x-warm", path)):
            ours = verb(server_path, "--root", root, *[a.replace("{}", cid) for a in args])
            assert ours.returncode == theirs.returncode, (args, cid, ours.stderr, theirs.stderr)
            assert all(w in ours.stderr for w in words) and len(ours.stderr.splitlines()) == len(words), \
                (args, cid, ours.stderr, theirs.stderr)
        if args[0] == "kill" and args[1] != "--all":
            assert words == ["container not running" if args[1] == "{}" else "container does not exist"], words
    assert not os.listdir(root) and not os.listdir(tmp_path / "runc")
    assert "declined" not in log.read_text()


def test_without_a_server_a_planner_of_the_launchers_own(make_bundle, tmp_path):
    """No server listens at SANDBOX_SERVER and none may be started (SANDBOX_SERVER_IDLE=0),
    or SANDBOX_SERVER= (empty): create, run and exec go to the launcher's own planner (`serve
    --once`) and the C executor, never to a second path: pid 1 and exec's process are made by
    the launcher (its children, from its sealed view: /proc/PID/exe), and nothing is left."""
    none = tmp_path / "none" / "s.sock"
    root = tmp_path / "state"
    bundle = make_bundle(["sh", "-c", "echo $$; sleep 100"])
    made = {}
    for how, server_path in (("empty", ""), ("own", none)):
        env = dict(os.environ, SANDBOX_SERVER=str(server_path), SANDBOX_SERVER_IDLE="0")
        with open(tmp_path / f"{how}.out", "w") as out:  # (the init keeps it: a pipe would end only with it)
            r = subprocess.run([str(LAUNCHER), "--root", str(root), "create", "-b", str(bundle), how], env=env,
                               stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=60)
        assert r.returncode == 0, (tmp_path / f"{how}.out").read_text()
        try:
            pid = json.loads(verb("", "--root", root, "state", how).stdout)["pid"]
            exe = Path(f"/proc/{pid}/comm").read_text().strip()
            r = subprocess.run([str(LAUNCHER), "--root", str(root), "exec", how, "sh", "-c",
                                "readlink /proc/1/exe; id; cat /proc/self/status | grep -E '^(Cap|NoNewPrivs)'"],
                               env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
            assert r.returncode == 0, r.stderr
            made[how] = (exe, r.stdout, r.stderr)
        finally:
            verb("", "--root", root, "delete", "--force", how)
        code, out, err = _run(server_path, root, make_bundle(["sh", "-c", "echo ran; exit 3"]), f"r-{how}")
        made[how] += (code, out, err)
        made[how] += _run(server_path, root, make_bundle(["/nonexistent"]), f"n-{how}")  # (its exec fails past start)
    assert made["empty"] == made["own"], made
    assert made["own"][0] == "sandbox", made  # (the launcher)
    assert made["own"][4] == "ran\n" and made["own"][3] == 3
    assert made["own"][6:] == (127, "", "sandbox run: exec /nonexistent: No such file or directory\n"), made
    assert not os.listdir(root) and not none.exists()
