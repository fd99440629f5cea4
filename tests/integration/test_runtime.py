"""`sandbox` as an OCI runtime, verb by verb, the way engines call it: create leaves the init
waiting, start releases it, state/kill/delete/ps/list, exec, hooks at their points, the
console socket, the pid file, the json log, the config file; failures leave nothing."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from tests.integration import helpers
from tests.integration.helpers import CLI, alive, mount_table, sandbox, tree

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


def rt(tmp_path, *args, stdout=None, env=None, cwd=None) -> subprocess.CompletedProcess:
    """A runtime verb. Its output goes to files, never pipes: a created container's init
    inherits create's stdio (as under runc), and a pipe would end only with the container."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        r = subprocess.run([*CLI, "--root", str(tmp_path / "state"),
                            *map(str, args)], stdin=subprocess.DEVNULL, stdout=stdout or out, stderr=err,
                           env=env, cwd=cwd, timeout=60)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(r.args, r.returncode, out.read(), err.read())


def errors(r: subprocess.CompletedProcess) -> list[str]:
    return [line for line in r.stderr.splitlines() if ": warning: " not in line]


def state(tmp_path, cid: str) -> dict:
    r = rt(tmp_path, "state", cid)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def create(tmp_path, bundle, cid: str, *extra) -> subprocess.CompletedProcess:
    return rt(tmp_path, "create", "--bundle", bundle, *extra, cid)


def wait_status(tmp_path, cid: str, want: str, timeout: float = 10) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        st = state(tmp_path, cid)
        if st["status"] == want or time.monotonic() > deadline:
            return st
        time.sleep(0.02)


@pytest.fixture
def clean_host(rootfs_debian):
    before = (mount_table(), tree(rootfs_debian))
    yield
    assert mount_table() == before[0], "the host's mount table changed"
    assert tree(rootfs_debian) == before[1], "the image changed"


def test_lifecycle(make_bundle, tmp_path, driver_root, clean_host):
    out = tmp_path / "out"
    bundle = make_bundle(["sh", "-c", "echo started; ls /dev/nvidia0; sleep 30"], ["NVIDIA_VISIBLE_DEVICES=all"])
    with open(out, "w") as f:  # the init inherits create's stdio (no terminal)
        r = rt(tmp_path, "--driver-root", driver_root, "create", "--bundle", bundle, "--pid-file",
               tmp_path / "pid", "c1", stdout=f)
    assert r.returncode == 0, r.stderr
    pid = int((tmp_path / "pid").read_text())  # digits only, no newline (as runc writes it)
    assert (tmp_path / "pid").read_text() == str(pid)
    st = state(tmp_path, "c1")
    assert (st["status"], st["pid"], st["id"], st["bundle"]) == ("created", pid, "c1", str(bundle))
    assert alive(pid) and out.read_text() == ""  # the process waits for start
    assert rt(tmp_path, "start", "c1").returncode == 0
    assert wait_status(tmp_path, "c1", "running")["status"] == "running"
    deadline = time.monotonic() + 10
    while "nvidia0" not in out.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert out.read_text() == "started\n/dev/nvidia0\n"
    again = rt(tmp_path, "start", "c1")
    assert again.returncode == 1 and "not created" in again.stderr
    ps = rt(tmp_path, "ps", "--format", "json", "c1")
    assert json.loads(ps.stdout) == [pid]
    refused = rt(tmp_path, "delete", "c1")
    assert refused.returncode == 1 and "not stopped" in refused.stderr
    assert rt(tmp_path, "kill", "c1", "KILL").returncode == 0
    assert wait_status(tmp_path, "c1", "stopped")["pid"] == 0
    assert rt(tmp_path, "kill", "c1", "TERM").returncode == 1  # not running any more
    listed = json.loads(rt(tmp_path, "list", "--format", "json").stdout)
    assert [(c["id"], c["status"]) for c in listed] == [("c1", "stopped")]
    assert rt(tmp_path, "delete", "c1").returncode == 0
    assert rt(tmp_path, "state", "c1").returncode == 1
    assert rt(tmp_path, "delete", "--force", "c1").returncode == 0  # containerd's second delete
    assert os.listdir(tmp_path / "state") == []


def test_created_container_deleted_with_force_and_the_init_gone(make_bundle, tmp_path, clean_host):
    assert create(tmp_path, make_bundle(["true"]), "c2").returncode == 0
    pid = state(tmp_path, "c2")["pid"]
    assert rt(tmp_path, "delete", "--force", "c2").returncode == 0
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(pid)


def test_two_creates_of_one_id_exactly_one_wins(make_bundle, tmp_path, clean_host):
    bundle = make_bundle(["true"])
    results = []
    threads = [threading.Thread(target=lambda: results.append(create(tmp_path, bundle, "same")))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.returncode for r in results) == [0, 1, 1, 1], [r.stderr for r in results]
    for r in results:
        if r.returncode:
            assert len(errors(r)) == 1 and "already exists" in r.stderr
    assert rt(tmp_path, "delete", "--force", "same").returncode == 0


def test_failed_create_leaves_nothing(make_bundle, tmp_path, driver_root, clean_host):
    """A GPU request that cannot be met: one line, in --log as json too, exit 1 or 2; no state
    directory, no mount, no process."""
    bundle = make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=7"])
    log = tmp_path / "log.json"
    before = set(os.listdir("/proc"))
    r = rt(tmp_path, "--log", log, "--log-format", "json", "--driver-root", driver_root, "create", "--bundle",
           bundle, "bad")
    assert r.returncode == 2 and errors(r) == [errors(r)[0]] and "unknown device '7'" in r.stderr
    entry = json.loads(log.read_text().splitlines()[-1])
    assert entry["level"] == "error" and "unknown device '7'" in entry["msg"] and entry["time"]
    assert not (tmp_path / "state/bad").exists()
    time.sleep(0.1)
    assert not [p for p in set(os.listdir("/proc")) - before if p.isdigit() and alive(int(p))
                and b"sandbox" in open(f"/proc/{p}/cmdline", "rb").read()]


HOOK = """#!/bin/sh
echo "$1 $(cat | tr -d '\\n') env=$(env | grep -v '^PWD=' | sort | tr '\\n' ' ')" >> {log}
{extra}
"""


def _hook(tmp_path, name: str, extra: str = "") -> str:
    path = tmp_path / name
    path.write_text(HOOK.format(log=tmp_path / "hooks.log", extra=extra))
    path.chmod(0o755)
    return str(path)


def test_hooks_run_at_their_points_with_only_their_env(make_bundle, tmp_path, clean_host):
    hook = _hook(tmp_path, "hook")
    stages = ("prestart", "createRuntime", "createContainer", "poststart", "poststop")
    hooks = {s: [{"path": hook, "args": [hook, s], "env": [f"ONLY={s}"]}] for s in stages}
    # NVIDIA's hooks are ours to do natively: never run (they would fail: no such file)
    hooks["prestart"].insert(0, {"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["x", "prestart"]})
    hooks["createContainer"].append({"path": "/usr/bin/nvidia-ctk", "args": ["nvidia-ctk", "hook", "x"]})
    bundle = make_bundle(["sleep", "30"], ["LD_PRELOAD=/evil.so", "SECRET=image"], hooks=hooks)
    os.environ["SANDBOX_LEAK_CHECK"] = "caller"
    try:
        assert create(tmp_path, bundle, "h1").returncode == 0
    finally:
        del os.environ["SANDBOX_LEAK_CHECK"]
    log = (tmp_path / "hooks.log").read_text().splitlines()
    assert [line.split()[0] for line in log] == ["prestart", "createRuntime", "createContainer"]
    assert rt(tmp_path, "start", "h1").returncode == 0
    assert rt(tmp_path, "delete", "--force", "h1").returncode == 0
    log = (tmp_path / "hooks.log").read_text().splitlines()
    assert [line.split()[0] for line in log] == list(stages)
    for line in log:
        stage, rest = line.split(" ", 1)
        st = json.loads(rest.split(" env=")[0])
        assert st["id"] == "h1" and st["bundle"] == str(bundle)
        assert rest.split(" env=")[1].split() == [f"ONLY={stage}"], line  # nothing of ours or the image's
        assert st["pid"] > 0 or stage == "poststop"


def test_a_failing_hook_fails_create_and_leaves_nothing(make_bundle, tmp_path, clean_host):
    hook = _hook(tmp_path, "failing", "echo nope >&2; exit 3")
    bundle = make_bundle(["true"], hooks={"createRuntime": [{"path": hook, "args": [hook, "createRuntime"]}]})
    r = create(tmp_path, bundle, "hf")
    assert r.returncode == 1 and len(errors(r)) == 1, r.stderr
    assert "hooks.createRuntime[0]" in r.stderr and "exit status 3: nope" in r.stderr
    assert not (tmp_path / "state/hf").exists()


def test_console_socket_gets_the_pty_master(make_bundle, tmp_path, clean_host):
    """process.terminal: the master arrives over the socket (SCM_RIGHTS); the process runs on
    the slave as its controlling terminal."""
    path = str(tmp_path / "console.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    bundle = make_bundle(["sh", "-c", "tty; echo on-the-pty"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["terminal"] = True
    (bundle / "config.json").write_text(json.dumps(spec))
    no_socket = create(tmp_path, bundle, "t0")
    assert no_socket.returncode == 2 and "--console-socket" in no_socket.stderr
    r = create(tmp_path, bundle, "t1", "--console-socket", path)
    assert r.returncode == 0, r.stderr
    conn, _ = server.accept()
    _msg, fds, _flags, _addr = socket.recv_fds(conn, 1024, 1)
    master = fds[0]
    assert rt(tmp_path, "start", "t1").returncode == 0
    out = b""
    deadline = time.monotonic() + 10
    while b"on-the-pty" not in out and time.monotonic() < deadline:
        try:
            out += os.read(master, 1024)
        except OSError:
            break
    assert b"/dev/pts/0" in out and b"on-the-pty" in out, out
    os.close(master)
    rt(tmp_path, "delete", "--force", "t1")


def test_exec(make_bundle, tmp_path, driver_root, clean_host):
    bundle = make_bundle(["sleep", "30"], ["NVIDIA_VISIBLE_DEVICES=0", "FROM_SPEC=1"])
    assert rt(tmp_path, "--driver-root", driver_root, "create", "--bundle", bundle, "x1").returncode == 0
    try:
        _exec_checks(tmp_path)
    finally:
        rt(tmp_path, "delete", "-f", "x1")  # never a container left behind, even on failure


def _exec_checks(tmp_path):
    refused = rt(tmp_path, "exec", "x1", "true")
    assert refused.returncode == 0  # a created container can be exec'd into, as runc allows
    assert rt(tmp_path, "start", "x1").returncode == 0
    r = rt(tmp_path, "exec", "-e", "EXTRA=2", "--cwd", "/tmp", "-u", "65534:65534", "x1", "sh", "-c",
           "echo $FROM_SPEC$EXTRA; pwd; id -u; ls /dev/nvidia0; ls /dev/nvidia1; cat /proc/1/cmdline; exit 7")
    assert r.returncode == 7, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:4] == ["12", "/tmp", "65534", "/dev/nvidia0"] and "nvidia1" in r.stderr  # GPU 0 only
    assert lines[4].startswith("sleep")  # the container's pid namespace
    d = rt(tmp_path, "exec", "-d", "--pid-file", tmp_path / "epid", "x1", "sleep", "30")
    assert d.returncode == 0
    epid = int((tmp_path / "epid").read_text())
    assert alive(epid) and epid in json.loads(rt(tmp_path, "ps", "--format", "json", "x1").stdout)
    bad = tmp_path / "process.json"
    bad.write_text(json.dumps({"args": ["true"], "cwd": "/", "rlimits": [{"type": "RLIMIT_BOGUS", "soft": 1,
                                                                         "hard": 1}]}))
    refused = rt(tmp_path, "exec", "--process", bad, "x1")
    assert refused.returncode == 2 and "RLIMIT_BOGUS" in refused.stderr and len(errors(refused)) == 1
    missing = rt(tmp_path, "exec", "x1", "no-such-command")
    assert missing.returncode == 127 and len(errors(missing)) == 1
    assert rt(tmp_path, "kill", "--all", "x1", "KILL").returncode == 0
    assert wait_status(tmp_path, "x1", "stopped")["status"] == "stopped"
    assert rt(tmp_path, "delete", "x1").returncode == 0


def test_run_detached_and_runc_style_run(make_bundle, tmp_path, clean_host):
    bundle = make_bundle(["sleep", "30"])
    r = rt(tmp_path, "run", "-d", "--pid-file", tmp_path / "pid", "d1", cwd=bundle)
    assert r.returncode == 0, r.stderr
    assert wait_status(tmp_path, "d1", "running")["pid"] == int((tmp_path / "pid").read_text())
    assert rt(tmp_path, "delete", "-f", "d1").returncode == 0
    quick = make_bundle(["sh", "-c", "exit 3"])
    r = rt(tmp_path, "run", "-b", quick, "f1")
    assert r.returncode == 3 and not (tmp_path / "state/f1").exists()


def test_config_file(make_bundle, tmp_path, driver_root, clean_host):
    """The driver root and the capability ceiling from the config file; a bad file is one line."""
    conf = tmp_path / "sandbox.toml"
    conf.write_text(f'driver-root = "{driver_root}"\ncapabilities = "utility"\n')
    bundle = make_bundle(["sh", "-c", "ls /dev/nvidia0; ls /usr/lib/x86_64-linux-gnu | grep -c libcuda; true"],
                         ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"])
    r = rt(tmp_path, "run", bundle, env=dict(os.environ, SANDBOX_CONFIG=str(conf)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["/dev/nvidia0", "0"]  # compute was cut by the ceiling
    conf.write_text('driver-root = "relative/path"\n')
    bad = rt(tmp_path, "--config", conf, "run", bundle)
    assert bad.returncode == 1 and len(errors(bad)) == 1 and "absolute" in bad.stderr
    conf.write_text('driver_root = "/x"\n')
    bad = sandbox("--config", conf, "plan", bundle)
    assert bad.returncode == 1 and "unknown key 'driver_root'" in bad.stderr


def test_version_and_features():
    r = sandbox("--version")
    assert r.returncode == 0 and r.stdout.startswith("sandbox version ")
    features = json.loads(sandbox("features").stdout)
    assert "CAP_CHECKPOINT_RESTORE" in features["linux"]["capabilities"]
    assert "poststop" in features["hooks"] and "mount" in features["linux"]["namespaces"]


def test_lean_verbs_import_no_event_loop_nor_plan(make_bundle, tmp_path):
    """start, state, kill, delete, list: an engine pays each per container."""
    assert create(tmp_path, make_bundle(["true"]), "l1").returncode == 0
    for verb in (["state", "l1"], ["list"], ["kill", "l1", "0"], ["start", "l1"], ["delete", "-f", "l1"]):
        r = subprocess.run([sys.executable, "-X", "importtime", "-m", "sandbox.cli", "--root",
                            str(tmp_path / "state"), *verb], capture_output=True, text=True, timeout=30)
        heavy = [m for m in ("elftools", "mounts.plan", "mounts.elf", "mounts.driver", "mounts.driver_facts", "msgspec")
                 if f"| {m}\n" in r.stderr or f"|   {m}\n" in r.stderr or f" {m}\n" in r.stderr]
        assert heavy == [], (verb, heavy)


def test_sigkill_of_create_mid_way_leaves_nothing(make_bundle, tmp_path, driver_root, clean_host):
    """create killed at different moments, under a subreaper as engines run it (conmon and
    the shim are): delete --force then leaves no state, process or cgroup."""
    import prctl

    bundle = make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=all"])
    prctl.set_child_subreaper(True)
    try:
        for delay in (0.0, 0.02, 0.05):
            p = subprocess.Popen([*CLI, "--root", str(tmp_path / "state"),
                                  "--driver-root", str(driver_root), "create", "--bundle", str(bundle), f"k{delay}"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(delay)
            p.send_signal(signal.SIGKILL)
            p.wait()
            deadline = time.monotonic() + 5  # reap what came to us, as a subreaper does
            while time.monotonic() < deadline:
                try:
                    if os.waitpid(-1, os.WNOHANG)[0] == 0:
                        time.sleep(0.01)
                except ChildProcessError:
                    break
            rt(tmp_path, "delete", "--force", f"k{delay}")
            assert not (tmp_path / f"state/k{delay}").exists()
            assert not [d for d in os.listdir("/sys/fs/cgroup") if os.path.isdir(f"/sys/fs/cgroup/{d}/k{delay}")]
    finally:
        prctl.set_child_subreaper(False)


def test_delete_force_kills_exec_d_processes_without_a_pid_namespace(make_bundle, tmp_path, clean_host):
    """No pid namespace of its own: delete --force still kills every process of the container
    (its cgroup's members), an exec'd one too, as runc does; nothing outlives it. The test is
    a subreaper that reaps as engines do, so the container's cgroup can go too."""
    import prctl

    spec_ns = [{"type": t} for t in ("network", "ipc", "uts", "mount")]
    bundle = make_bundle(["sleep", "30"], linux={**json.loads((make_bundle(["true"]) / "config.json")
                                                                  .read_text())["linux"], "namespaces": spec_ns})
    prctl.set_child_subreaper(True)
    try:
        assert create(tmp_path, bundle, "np1").returncode == 0
        assert rt(tmp_path, "start", "np1").returncode == 0
        assert rt(tmp_path, "exec", "-d", "--pid-file", tmp_path / "epid", "np1", "sleep", "300").returncode == 0
        epid = int((tmp_path / "epid").read_text())
        assert epid in json.loads(rt(tmp_path, "ps", "--format", "json", "np1").stdout)
        delete = subprocess.Popen([*CLI, "--root", str(tmp_path / "state"), "delete",
                                   "-f", "np1"])
        code = None
        while code is None:  # reap what the kill makes of our adopted children meanwhile
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == delete.pid:
                code = os.waitstatus_to_exitcode(status)
            elif pid == 0:
                time.sleep(0.005)
        assert code == 0
    finally:
        rt(tmp_path, "delete", "-f", "np1")
        prctl.set_child_subreaper(False)
    assert not alive(epid)
    assert not [d for d in os.listdir("/sys/fs/cgroup") if os.path.isdir(f"/sys/fs/cgroup/{d}/np1")]


def test_start_container_hooks_run_under_the_containers_filter_as_under_runc(make_bundle, tmp_path):
    """startContainer hooks run inside the container as its process will: no_new_privs set and
    the seccomp filter loaded (they ran with neither)."""
    out = tmp_path / "out"
    out.mkdir()
    probe = "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status; mkdir /root/x 2>/dev/null || echo mkdir-denied"
    hooks = {"startContainer": [{"path": "/bin/sh", "args": ["sh", "-c", f"({probe}) > /root/hook.out"]}]}
    bundle = make_bundle(["true"], hooks=hooks)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["noNewPrivileges"] = True
    spec["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_X86_64"],
                                "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}]}
    spec["mounts"].append({"destination": "/root", "type": "bind", "source": str(out), "options": ["rbind"]})
    (bundle / "config.json").write_text(json.dumps(spec))
    seen = []
    for r in (subprocess.run([*helpers.CLI, "--root", str(tmp_path / "s"), "run", "-b", str(bundle), "sc1"],
                             capture_output=True, text=True, timeout=60),
              helpers.runc_run(bundle, tmp_path / "runc", f"sc{os.getpid()}")):
        assert r.returncode == 0, r.stderr
        seen.append((out / "hook.out").read_text().split())
    assert seen[0] == ["NoNewPrivs:", "1", "Seccomp:", "2", "mkdir-denied"] and seen[0] == seen[1], seen


def test_a_created_init_that_cannot_exec_says_why_on_its_stderr(make_bundle, tmp_path):
    """After start there is no supervisor to tell: the one line goes to the container's
    stderr (the engine's log of it), not nowhere."""
    bundle = make_bundle(["/no/such/program"])
    out = tmp_path / "init.out"
    assert helpers.create(tmp_path / "state", bundle, "nx1", log=out).returncode == 0
    try:
        assert rt(tmp_path, "start", "nx1").returncode == 0
        wait_status(tmp_path, "nx1", "stopped")
    finally:
        rt(tmp_path, "delete", "--force", "nx1")
    assert "sandbox: exec /no/such/program: No such file or directory" in out.read_text()
