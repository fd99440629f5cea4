"""linux.seccomp enforced through libseccomp, as runc enforces it: a denied syscall fails with
the profile's errno, the filter is loaded for the container's process (and exec'd ones),
unknown syscall names are skipped, and the same bundle behaves the same under runc."""

from __future__ import annotations

import json
import os
import subprocess

import fixtures
import pytest

from tests.integration.helpers import CLI, create, runc_run, sandbox

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

PROBE = "grep -E '^Seccomp' /proc/self/status; mkdir /tmp/x && echo MKDIR-OK; mkdir /tmp/y 2>&1 || echo rc=$?"
DENY_MKDIR = {
    "defaultAction": "SCMP_ACT_ALLOW",
    "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
    "syscalls": [
        {"names": ["mkdir", "mkdirat", "no_such_syscall_in_any_kernel"], "action": "SCMP_ACT_ERRNO"},
        {"names": ["chmod"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
        {"names": ["personality"], "action": "SCMP_ACT_ERRNO",
         "args": [{"index": 0, "value": 8, "op": "SCMP_CMP_EQ"}, {"index": 0, "value": 9, "op": "SCMP_CMP_EQ"}]},
    ],
}


def _bundle(make_bundle, seccomp, nnp=True, args=("sh", "-c", PROBE)):
    bundle = make_bundle(list(args))
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"]["seccomp"] = seccomp
    spec["process"]["noNewPrivileges"] = nnp
    spec["root"]["readonly"] = False
    spec["mounts"].append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]})
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


@pytest.mark.parametrize("nnp", [True, False], ids=["no_new_privs", "privs"])
def test_denied_syscall_fails_as_under_runc(nnp, make_bundle, tmp_path):
    bundle = _bundle(make_bundle, DENY_MKDIR, nnp)
    ours = sandbox("run", bundle, "--root", tmp_path / "ours")
    theirs = subprocess.run(["runc", "--root", str(tmp_path / "runc"), "run", "-b", str(bundle), f"sc{os.getpid()}"],
                            capture_output=True, text=True, timeout=60)
    assert ours.returncode == 0 and theirs.returncode == 0, (ours.stderr, theirs.stderr)
    assert "Seccomp:\t2" in ours.stdout and "MKDIR-OK" not in ours.stdout
    assert "Operation not permitted" in ours.stdout
    assert ours.stdout == theirs.stdout
    assert "seccomp" not in ours.stderr  # no "not enforced" warning any more


def test_default_errno_and_exec_gets_the_filter(make_bundle, tmp_path):
    """A deny-by-default profile (defaultErrnoRet ENOSYS) that allows what busybox needs:
    the process runs, an unlisted syscall fails with ENOSYS; `sandbox exec` is filtered too."""
    allowed = ("read write open openat close fstat newfstatat stat lstat execve brk mmap munmap mprotect "
               "arch_prctl set_tid_address rt_sigaction rt_sigprocmask rt_sigreturn exit exit_group getpid "
               "getppid getuid geteuid getgid getegid ioctl fcntl wait4 clone clone3 vfork fork nanosleep "
               "clock_nanosleep getcwd chdir dup2 dup3 pipe pipe2 prlimit64 set_robust_list rseq uname "
               "access faccessat faccessat2 readlink readlinkat getdents64 statx lseek getrandom futex "
               "sysinfo poll ppoll pselect6 getpgrp setpgid getsid setsid kill tgkill").split()
    profile = {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38,
               "syscalls": [{"names": allowed, "action": "SCMP_ACT_ALLOW"}]}
    bundle = _bundle(make_bundle, profile, args=("sh", "-c", "mkdir /tmp/z 2>&1; echo done; sleep 30"))
    state = tmp_path / "state"
    with open(tmp_path / "out", "w") as out:  # files, not pipes: the init inherits them
        create = subprocess.run([*sandbox_argv(), "--root", str(state), "create", "--bundle", str(bundle), "f1"],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=60)
    try:
        assert create.returncode == 0, (tmp_path / "out").read_text()
        assert subprocess.run([*sandbox_argv(), "--root", str(state), "start", "f1"]).returncode == 0
        ex = sandbox("--root", state, "exec", "f1", "sh", "-c", "grep Seccomp: /proc/self/status; mkdir /tmp/w")
        assert "Seccomp:\t2" in ex.stdout and "Function not implemented" in ex.stderr, (ex.stdout, ex.stderr)
    finally:
        sandbox("--root", state, "delete", "-f", "f1")
    assert "Function not implemented" in (tmp_path / "out").read_text()


def sandbox_argv() -> list[str]:

    return [*CLI]


@pytest.mark.parametrize("bad,words", [
    ({"defaultAction": "SCMP_ACT_NOPE"}, ["linux.seccomp.defaultAction", "SCMP_ACT_NOPE"]),
    ({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_ERRNO",
                                                       "args": [{"index": 9, "op": "SCMP_CMP_EQ"}]}]},
     ["args[0].index"]),
    ({"defaultAction": "SCMP_ACT_NOTIFY"}, ["SCMP_ACT_NOTIFY cannot be the default action"]),
    ({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_NOTIFY"}]},
     ["syscalls[0].action", "needs linux.seccomp.listenerPath"]),
    ({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/x",
      "syscalls": [{"names": ["sendmsg"], "action": "SCMP_ACT_NOTIFY"}]}, ["syscalls[0]", "sendmsg"]),
    ({"defaultAction": "SCMP_ACT_ALLOW", "flags": ["SECCOMP_FILTER_FLAG_BOGUS"]}, ["unknown flag"]),
])
def test_bad_profiles_are_one_line(bad, words, make_bundle, tmp_path):
    r = sandbox("run", _bundle(make_bundle, bad), "--root", tmp_path / "s")
    lines = [line for line in r.stderr.splitlines() if "warning" not in line]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    for w in words:
        assert w in lines[0]


def test_podmans_profile_template_is_refused_and_its_null_args_load(make_bundle, tmp_path):
    """/usr/share/containers/seccomp.json is a template: rules with includes/excludes (allow
    mount for CAP_SYS_ADMIN only ...) that podman resolves before it writes a spec. Applied
    as it is, every condition would hold: refused in one line. Its rules without conditions
    (null args among them) load and behave."""
    path = fixtures.PODMAN_PROFILE
    if not os.path.exists(path):
        pytest.skip("no podman profile installed")
    with open(path) as f:
        profile = json.load(f)
    bundle = _bundle(make_bundle, profile)
    r = sandbox("run", bundle, "--root", tmp_path / "s")
    assert r.returncode == 2 and "includes: a profile template's condition" in r.stderr, r.stderr
    assert any(rule.get("args", []) is None for rule in profile["syscalls"])
    profile = fixtures.engine_seccomp_profile()  # resolved as podman resolves it (no caps, x86-64)
    bundle = _bundle(make_bundle, profile, args=("sh", "-c", "grep -E '^Seccomp:' /proc/self/status; "
                                                 "mkdir /tmp/x && echo MKDIR-OK; unshare -m true 2>&1 | tail -1"))
    r = sandbox("run", bundle, "--root", tmp_path / "s")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:2] == ["Seccomp:\t2", "MKDIR-OK"], r.stdout


@pytest.mark.parametrize("verb", ["run", "create"])
def test_a_profile_without_openat2_still_starts(verb, make_bundle, tmp_path):
    """Allow-lists older than openat2 (runtime-tools' default profile is one) and no
    no_new_privs: the filter is loaded before the user changes, so what we look up in the
    image (cwd, HOME) is looked up before it. The container starts in its cwd, as under runc;
    a created one too, and an exec'd process."""
    profile = fixtures.engine_seccomp_profile()
    for rule in profile["syscalls"]:
        if rule["action"] == "SCMP_ACT_ALLOW":
            rule["names"] = [n for n in rule["names"] if n != "openat2"]
    bundle = _bundle(make_bundle, profile, nnp=False, args=("sh", "-c", "pwd; echo $HOME; sleep 30"))
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["cwd"] = "/tmp"
    spec["process"]["env"] = [e for e in spec["process"]["env"] if not e.startswith("HOME=")]
    if verb == "run":
        spec["process"]["args"][-1] = spec["process"]["args"][-1].replace("; sleep 30", "")
    (bundle / "config.json").write_text(json.dumps(spec))
    if verb == "run":
        ours = sandbox("run", bundle, "--root", tmp_path / "s")
        theirs = runc_run(bundle, tmp_path / "runc", f"o2{os.getpid()}")
        assert ours.returncode == 0 and ours.stdout == theirs.stdout == "/tmp\n/root\n", (ours, theirs)
        return
    out, root = tmp_path / "out", tmp_path / "s"
    assert create(root, bundle, "o2", log=out).returncode == 0
    try:
        assert subprocess.run([*CLI, "--root", str(root), "start", "o2"]).returncode == 0
        r = subprocess.run([*CLI, "--root", str(root), "exec", "o2", "sh", "-c", "pwd"],
                           capture_output=True, text=True, timeout=60)
        assert r.stdout == "/tmp\n", r.stderr
    finally:
        subprocess.run([*CLI, "--root", str(root), "delete", "-f", "o2"])
    assert out.read_text().splitlines()[:2] == ["/tmp", "/root"]
# struct seccomp_notif (80 bytes) and seccomp_notif_resp (24): linux/seccomp.h
NOTIF_RECV, NOTIF_SEND = 0xC0502100, 0xC0182101


def _agent(sock_path: str, answers: list, ready) -> None:
    """A seccomp agent (what runtime-spec's listenerPath names): receive the container's
    notification fd with its state, answer each notified syscall with EXDEV."""
    import fcntl
    import socket
    import struct

    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(1)
    ready.set()
    conn, _ = srv.accept()
    msg, fds, _, _ = socket.recv_fds(conn, 65536, 1)
    answers.append(json.loads(msg))
    fd = fds[0]
    while True:
        req = bytearray(80)
        try:
            fcntl.ioctl(fd, NOTIF_RECV, req)
        except OSError:
            break  # the filter's last process is gone
        notif_id, pid, _flags, nr = struct.unpack_from("<QIIi", req)
        answers.append(("syscall", nr, pid))
        fcntl.ioctl(fd, NOTIF_SEND, bytearray(struct.pack("<QqiI", notif_id, 0, -18, 0)))  # -EXDEV
    os.close(fd)
    conn.close()
    srv.close()


def start_agent(sock_path: str):
    """_agent in a thread, listening once this returns: (the thread, what it is told)."""
    import threading

    answers: list = []
    ready = threading.Event()
    agent = threading.Thread(target=_agent, args=(sock_path, answers, ready), daemon=True)
    agent.start()
    ready.wait(5)
    return agent, answers


@pytest.mark.parametrize("nnp", [True, False], ids=["no_new_privs", "privs"])
def test_notify_goes_to_the_agent_at_listener_path(nnp, make_bundle, tmp_path):
    """SCMP_ACT_NOTIFY: the agent gets the fd and the container process state (the pid as the
    host sees it, the metadata, the container's state), and its answer is what mkdir returns."""
    path = str(tmp_path / "agent.sock")
    agent, answers = start_agent(path)
    profile = {"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": path, "listenerMetadata": "from-the-test",
               "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_NOTIFY"}]}
    bundle = _bundle(make_bundle, profile, nnp=nnp, args=("sh", "-c", "mkdir /tmp/n 2>&1; echo done"))
    r = sandbox("run", bundle, "--root", tmp_path / "s", "--id", "notify1")
    agent.join(10)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["mkdir: can't create directory '/tmp/n': Invalid cross-device link", "done"]
    state = answers[0]
    assert state["fds"] == ["seccompFd"] and state["metadata"] == "from-the-test", state
    assert state["state"]["id"] == "notify1" and state["state"]["pid"] == state["pid"] > 0, state
    assert [a[0] for a in answers[1:]] == ["syscall"], answers
