"""The same bundle under `sandbox run` and `runc run`, from the same caller: what the
container's process sees must be the same (capabilities, no_new_privs, ignored and blocked
signals, umask, its session, the loopback, the /dev modes, HOME, rlimits, open fds), and so
must the exit status when its pid 1 is killed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from tests.integration.helpers import CLI

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

PROBE = ("grep -E '^(Cap|NoNewPrivs|SigIgn|SigBlk|Umask)' /proc/self/status; umask; echo HOME=$HOME; "
         "echo pgrp,session=$(cut -d' ' -f5,6 /proc/self/stat); cat /sys/class/net/lo/flags; "
         "stat -c '%a %u:%g %t:%T %n' /dev/null /dev/zero /dev/full /dev/random /dev/urandom /dev/tty; "
         "cat /proc/self/limits; ls /proc/self/fd; id")


def _hostile_caller():
    """What a careless caller leaves behind: a tight umask, an ignored and a blocked signal,
    an open fd (runc closes it; so must we)."""
    os.umask(0o077)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    fd = os.open("/", os.O_RDONLY)
    os.set_inheritable(fd, True)


def _both(bundle, tmp_path, driver_root, gpu: bool):
    ours = [*CLI, "run", str(bundle), "--root", str(tmp_path / "ours")]
    if gpu:
        ours += ["--driver-root", str(driver_root)]
    theirs = ["runc", "--root", str(tmp_path / "runc"), "run", "-b", str(bundle), f"parity{os.getpid()}"]
    out = []
    for cmd in (ours, theirs):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, preexec_fn=_hostile_caller,
                           stdin=subprocess.DEVNULL)
        assert r.returncode == 0, (cmd[3], r.stderr)
        out.append(r.stdout)
    return out


CASES = {
    "runc spec": lambda spec: None,
    "no capabilities field": lambda spec: spec["process"].pop("capabilities"),
    "a user without a passwd entry": lambda spec: spec["process"].update(user={"uid": 1234, "gid": 1234}),
    "nobody, HOME from passwd": lambda spec: spec["process"].update(user={"uid": 65534, "gid": 65534}),
    "unlimited rlimits": lambda spec: spec["process"].update(rlimits=[
        {"type": "RLIMIT_CORE", "soft": 2**64 - 1, "hard": 2**64 - 1},
        {"type": "RLIMIT_NOFILE", "soft": 1024, "hard": 4096}]),
    "umask in the spec": lambda spec: spec["process"]["user"].update(umask=0o027),
    "HOME in the env": lambda spec: spec["process"]["env"].append("HOME=/srv"),
}


@pytest.mark.parametrize("gpu", [False, True], ids=["no-gpu", "gpu"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_process_sees_what_it_sees_under_runc(case, gpu, make_bundle, tmp_path, driver_root):
    bundle = make_bundle(["sh", "-c", PROBE], ["NVIDIA_VISIBLE_DEVICES=all"] if gpu else [])
    spec = json.loads((bundle / "config.json").read_text())
    CASES[case](spec)
    (bundle / "config.json").write_text(json.dumps(spec))
    ours, theirs = _both(bundle, tmp_path, driver_root, gpu)
    # runc 1.1 passes the caller's blocked signals on (SIGUSR2 stays blocked in the
    # container); we unblock every signal before exec, as a fresh init should.
    assert "SigBlk:\t0000000000000000\n" in ours
    theirs = re.sub(r"SigBlk:\t[0-9a-f]+\n", "SigBlk:\t0000000000000000\n", theirs)
    assert ours == theirs


def _wait_running(cmd: list[str], deadline: float) -> int:
    while time.monotonic() < deadline:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode == 0 and json.loads(r.stdout).get("status") == "running":
            return json.loads(r.stdout)["pid"]
        time.sleep(0.05)
    raise AssertionError(f"{cmd} never said running")


@pytest.mark.parametrize("sig", [signal.SIGKILL])
def test_exit_status_when_pid1_is_killed(sig, make_bundle, tmp_path):
    """pid 1 killed from the host (as the OOM killer would): runc run exits 128+N; so do we.
    (A pid namespace's init only receives the signals it handles, SIGKILL aside.)"""
    bundle = make_bundle(["sleep", "30"])
    codes = []
    for name, base in (("sandbox", [*CLI]), ("runc", ["runc"])):
        root = ["--root", str(tmp_path / name)]
        cid = f"killed{os.getpid()}"
        run = [*base, "run", str(bundle), "--id", cid, *root] if name == "sandbox" else \
            [*base, *root, "run", "-b", str(bundle), cid]
        state = [*base, "state", cid, *root] if name == "sandbox" else [*base, *root, "state", cid]
        p = subprocess.Popen(run, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            pid = _wait_running(state, time.monotonic() + 20)
            os.kill(pid, sig)
            _out, err = p.communicate(timeout=20)
        finally:
            p.kill()
        codes.append((name, p.returncode, err.strip().splitlines()[-1:] if name == "sandbox" and
                      p.returncode not in (128 + sig,) else []))
    assert codes == [("sandbox", 128 + sig, []), ("runc", 128 + sig, [])]
