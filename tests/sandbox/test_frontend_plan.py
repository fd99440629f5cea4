"""The process plan, both ends without root: gofer/frontend_plan.py's records (what the
server sends) parsed by sandbox/executor/frontend.c's own parser (what the launcher carries out),
built alone with the limits frontend_plan.py writes for it: the same process both sides, the
tables' limits where Python says they are, and hostile records refused."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import msgspec
import pytest

from gofer import frontend_plan as fp
from gofer import process
from gofer.seccomp import listener_message
from mounts.errors import SandboxError
from mounts.spec import Hook, Personality, Process, Seccomp
from sandbox.executor import wire

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def parser(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("plan")
    (d / "config.h").write_text(wire.c_header())
    subprocess.run([cc, "-O0", "-w", "-I", str(REPO / "sandbox/executor"), f'-DSANDBOX_CONFIG="{d / "config.h"}"',
                    "-o", str(d / "plan_parse"), str(REPO / "tests/sandbox/programs/plan_parse.c"),
                    *(str(REPO / "sandbox/executor" / f) for f in ("plan.c", "process.c"))], check=True)
    return d / "plan_parse"


def parse(parser: Path, records: list[str] | bytes, *files: str) -> tuple[int, list[str]]:
    data = records if isinstance(records, bytes) else b"".join(r.encode() + b"\0" for r in records)
    r = subprocess.run([str(parser), *files], input=data, capture_output=True, timeout=30)
    return r.returncode, r.stdout.decode().splitlines()


def proc(**fields) -> Process:
    return msgspec.json.decode(msgspec.json.encode({"args": ["true"], "cwd": "/", **fields}), type=Process)


def records(p: Process, preserve: int = 0) -> list[str]:
    return ["plan 1", "detach 0", f"preserve {preserve}", *fp.process_records(p),
            *fp.command_records(p, process.Entry(None, "/home/u"))]


def test_the_same_process_both_sides(parser):
    p = proc(args=["sh", "-c", "echo 'a b' \"$HOME\""], env=["A=1", "PATH=/bin:/usr/bin", "A=2"],
             user={"uid": 1000, "gid": 100, "umask": 0o27, "additionalGids": [5, 6]}, noNewPrivileges=True,
             capabilities={"bounding": ["CAP_CHOWN", "CAP_KILL"], "effective": ["CAP_KILL"],
                           "permitted": ["CAP_KILL"]},
             rlimits=[{"type": "RLIMIT_NOFILE", "soft": 1024, "hard": 2048}])
    code, out = parse(parser, records(p, preserve=2))
    assert code == 0, out
    assert out[0] == f"preserve 2 detach 0 nnp 1 umask 27 lastcap {process.LAST_CAP}"
    assert out[1] == "caps 21 20 0 20 0"  # CAP_CHOWN 0, CAP_KILL 5
    assert out[2] == "user 1000 100 groups 5 6"
    assert out[3] == "rlimit 7 1024 2048"  # RLIMIT_NOFILE
    assert out[4] == "ns 0 cgroups 0 cwd 0 fifo 0"
    assert out[5:] == ["arg sh", "arg -c", "arg echo 'a b' \"$HOME\"", "env A=2", "env PATH=/bin:/usr/bin",
                       "env HOME=/home/u"]


def test_a_plan_of_any_size_both_sides(parser, tmp_path):
    """No table of the plan is fixed: 10,000 arguments, 20,000 variables, 2,000 groups and 100
    hooks go through, in a memory file (fp.send: "memfd", its fd first) once the records
    outgrow one message; execve has the last word on the size, as under runc."""
    p = proc(args=["x"] * 10_000, env=[f"V{i}=1" for i in range(20_000)],
             user={"additionalGids": list(range(2_000))})
    hooks = [hook(path="/bin/true", args=["t"] * 50, env=["A=1"])] * 100
    big = records(p)[:-1] + fp.hook_records(hooks, b"{}") + records(p)[-1:]
    data = fp.encode(big)
    assert len(data) > fp.MAX_MESSAGE
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with a, b:
        fp.send(a, big, [])
        msg, fds, _flags, _addr = socket.recv_fds(b, 100, 1)
    assert msg == b"memfd\0" and len(fds) == 1
    assert os.pread(fds[0], len(data) + 1, 0) == data  # (as frontend.c reads it)
    os.close(fds[0])
    (tmp_path / "plan").write_bytes(data)
    code, out = parse(parser, b"memfd\0", str(tmp_path / "plan"))
    assert code == 0, out[:5]
    assert out[2] == "user 0 0 groups " + " ".join(map(str, range(2_000)))
    assert out.count("arg x") == 10_000 and len([x for x in out if x.startswith("env ")]) == 20_001  # (+ HOME)
    assert len([x for x in out if x.startswith("hook ")]) == 100
    (tmp_path / "small").write_bytes(fp.encode(records(proc())))
    assert parse(parser, b"memfd\0", str(tmp_path / "small"))[0] == 0  # (any plan may come so)
    for hostile in (b"memfd\0", b"memfd\0memfd\0"):
        (tmp_path / "hostile").write_bytes(hostile)
        assert parse(parser, b"memfd\0", str(tmp_path / "hostile")) == (1, ["refused"])
    (tmp_path / "empty").write_bytes(b"")
    assert parse(parser, b"memfd\0", str(tmp_path / "empty")) == (1, ["refused"])
    assert parse(parser, b"memfd\0") == (1, ["refused"])  # (no fd)
    with pytest.raises(SandboxError, match="a NUL"):
        fp.encode(["arg a\0b"])


def hook(**fields) -> Hook:
    return msgspec.json.decode(msgspec.json.encode(fields), type=Hook)


def test_start_container_hooks_both_sides(parser):
    """A created init's startContainer hooks: each one's path, timeout (0: none), argv (its
    path where the spec gives none) and environment (the last of a name, as Python's dict),
    and the state they read."""
    hooks = [hook(path="/bin/sh", args=["sh", "-c", "x y"], env=["A=1", "B=2", "A=3"], timeout=5),
             hook(path="/usr/bin/true")]
    p = proc()
    code, out = parse(parser, records(p)[:-1] + fp.hook_records(hooks, b'{"id":"c 1"}') + records(p)[-1:])
    assert code == 0, out
    assert out[-5:-2] == ['start-state {"id":"c 1"}', "hook 5 /bin/sh sh -c x y | A=3 B=2", "hook 0 /usr/bin/true /usr/bin/true"]


@pytest.mark.parametrize("hostile", [
    ["hook-arg x", "start-state {}"],  # an argument of no hook
    ["start-state {}", "hook 0 /bin/true", "hook-env A=1", "hook-arg x"],  # an argument after the environment
    ["start-state {}", "hook 0 /bin/true"],  # no argv
    ["hook 0 /bin/true", "hook-arg true"],  # no state
    ["start-state {}", "hook 0 true", "hook-arg true"],  # a relative path
    ["start-state {}", "hook -1 /bin/true", "hook-arg true"],
    ["start-state {}", "hook x /bin/true", "hook-arg true"],
])
def test_hostile_hook_records_are_refused(parser, hostile):
    assert parse(parser, records(proc()) + hostile) == (1, ["refused"])


def test_scheduling_personality_seccomp_flags_and_console_both_sides(parser, tmp_path):
    """What Python's tail sets with set_scheduling and libseccomp's flags, as numbers; the
    console's connection and size."""
    p = proc(scheduler={"policy": "SCHED_DEADLINE", "flags": ["SCHED_FLAG_RESET_ON_FORK"], "runtime": 10_000_000,
                        "deadline": 100_000_000, "period": 100_000_000},
             ioPriority={"class": "IOPRIO_CLASS_IDLE", "priority": 3})
    persona = msgspec.json.decode(b'{"domain": "LINUX32"}', type=Personality)
    profile = msgspec.json.decode(b'{"defaultAction": "SCMP_ACT_ALLOW", "flags": ["SECCOMP_FILTER_FLAG_LOG", '
                                  b'"SECCOMP_FILTER_FLAG_SPEC_ALLOW"]}', type=Seccomp)
    bpf = tmp_path / "bpf"
    bpf.write_bytes(b"\x06\0\0\0\0\0\xff\x7f")  # one instruction: RET ALLOW
    recs = ["plan 1", *fp.process_records(p, persona), *fp.seccomp_records(profile, True), "arg true"]
    code, out = parse(parser, recs, str(bpf))
    assert code == 0, out
    assert "seccomp late flags 6" in out
    assert "sched 6 1 0 0 10000000 100000000 100000000" in out
    assert "ioprio 3 3" in out and "personality 8" in out
    agent = msgspec.structs.replace(profile, listener_path="/x", listener_metadata="m\u00e9ta \"q\"")
    state = {"ociVersion": "1.0.2", "status": "running", "pid": 7}
    code, out = parse(parser, ["plan 1", *fp.seccomp_records(agent, True), *fp.listener_records(agent, 42, state),
                               "arg true"], str(bpf), "/dev/null")
    sent = next(line for line in out if line.startswith("listener "))[len("listener "):]
    assert code == 0 and msgspec.json.decode(sent) == msgspec.json.decode(listener_message(agent, 42, state))
    sized = proc(terminal=True, consoleSize={"height": 30, "width": 100})
    assert parse(parser, ["plan 1", *fp.console_records(sized), "arg true"], "/dev/null")[1][-2:] == [
        "console 30 100", "arg true"]
    assert fp.console_records(proc(terminal=True)) == ["console"]
    assert fp.seccomp_records(msgspec.structs.replace(profile, flags=[]), False) == ["seccomp early"]


def test_lsm_labels_go_where_python_writes_them(parser, tmp_path):
    """frontend.c's apply_labels against a directory standing in for the host's procfs:
    AppArmor's own attr first, the shared one where that is missing, SELinux's; and
    gofer.process.apply_labels's lines where none is there or a write fails."""
    procfs = tmp_path / "proc"
    shared = procfs / "thread-self/attr"
    (shared / "apparmor").mkdir(parents=True)
    for f in (shared / "exec", shared / "apparmor/exec"):
        f.write_text("")
    both = proc(apparmorProfile="docker-default", selinuxLabel="system_u:system_r:container_t:s0")
    code, out = parse(parser, ["plan 1", *fp.label_records(both), "arg true"], str(procfs))
    assert code == 0 and "labels docker-default|system_u:system_r:container_t:s0" in out, out
    assert (shared / "apparmor/exec").read_text() == "exec docker-default"
    assert (shared / "exec").read_text() == "system_u:system_r:container_t:s0"
    (shared / "apparmor/exec").unlink()
    (shared / "apparmor").rmdir()
    (shared / "exec").write_text("")
    code, out = parse(parser, ["plan 1", *fp.label_records(proc(apparmorProfile="p")), "arg true"], str(procfs))
    assert code == 0 and (shared / "exec").read_text() == "exec p"
    (shared / "exec").unlink()
    r = subprocess.run([str(parser), str(procfs)], input=b"plan 1\0apparmor p\0proc\0arg true\0", capture_output=True)
    assert r.returncode == 1 and r.stderr.decode().strip() == "sandbox: cannot apply 'exec p': no /proc/thread-self/attr here"
    assert fp.label_records(proc()) == []


@pytest.mark.parametrize("hostile", [
    ["plan 1", "arg true", "frobnicate 1"],  # a record this launcher does not know
    ["plan 1", "preserve -4", "arg true"],  # would keep every fd of the engine's
    ["plan 1", "ns 131072 mnt", "arg true"],  # an fd named, none sent
    ["plan 1", "caps 1 2 3", "arg true"],
    ["plan 1", "user 0", "arg true"],
    ["plan 1", "rlimit 7 x y", "arg true"],
    ["plan 1", "sched 1 0 0", "arg true"],  # fields missing
    ["plan 1", "sched 1 0 0 0 0 0 0 junk", "arg true"],
    ["plan 1", "seccomp-flags 8", "arg true"],  # NEW_LISTENER: the plan carries no listener
    ["plan 1", "personality x", "arg true"],
    ["plan 1", "console", "arg true"],  # its fd not sent
    ["plan 1", "console-size 30", "arg true"],
    ["plan 1", "seccomp-listener 5 {}", "arg true"],  # its connection not sent
    ["plan 1", "apparmor p", "proc", "arg true"],  # the procfs not sent
    ["plan 1", "seccomp-listener -1 {}", "arg true"],
    ["plan 1"],  # nothing to run
])
def test_hostile_records_are_refused(parser, hostile):
    assert parse(parser, hostile) == (1, ["refused"])


def test_a_record_without_its_nul_is_refused(parser):
    good = b"plan 1\0arg true\0"
    assert parse(parser, good)[0] == 0
    assert parse(parser, good + b"arg evil") == (1, ["refused"])


def test_an_fd_more_or_less_than_named_is_refused(parser):
    assert parse(parser, ["plan 1", "ns 131072 mnt", "arg true"], "/dev/null")[0] == 0
    assert parse(parser, ["plan 1", "arg true"], "/dev/null") == (1, ["refused"])
