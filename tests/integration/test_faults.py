"""Faults and odd paths (runc's answers on the same inputs): no hang, no write outside the
state directory, one line naming the file."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from tests.integration.helpers import CLI
from tests.integration.test_runtime import errors, rt
from tests.sockets import full_listener

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


def test_a_full_console_socket_fails_at_once(make_bundle, tmp_path):
    """listen(0) and its queue full: create fails within a second, one line, nothing left
    (runc: connect: resource temporarily unavailable)."""
    bundle = make_bundle(["true"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["terminal"] = True
    (bundle / "config.json").write_text(json.dumps(spec))
    path = tmp_path / "console.sock"
    with full_listener(path, socket.SOCK_STREAM):
        t = time.monotonic()
        r = rt(tmp_path, "create", "--bundle", bundle, "--console-socket", path, "con1")
        assert time.monotonic() - t < 5
        assert r.returncode == 1 and len(errors(r)) == 1, r.stderr
        assert f"--console-socket {path}: cannot connect: Resource temporarily unavailable" in r.stderr
        assert not (tmp_path / "state" / "con1").exists()


def test_a_symlinked_state_directory_is_never_followed(tmp_path):
    """ROOT/ID a link to another directory with files of those names: state says it is no
    state directory, delete refuses, delete --force removes the link alone (as runc), and
    the id can be created again."""
    other = tmp_path / "other"
    other.mkdir()
    for name in ("state.json", "state.json.tmp", "exec.fifo"):
        (other / name).write_text("precious")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "l1").symlink_to(other)
    r = rt(tmp_path, "state", "l1")
    assert r.returncode == 1 and "not a state directory" in r.stderr and len(errors(r)) == 1, r.stderr
    r = rt(tmp_path, "delete", "l1")
    assert r.returncode == 1 and "not a state directory" in r.stderr, r.stderr
    assert sorted(os.listdir(other)) == ["exec.fifo", "state.json", "state.json.tmp"]
    assert rt(tmp_path, "delete", "--force", "l1").returncode == 0
    assert not (tmp_path / "state" / "l1").exists() and sorted(os.listdir(other)) == [
        "exec.fifo", "state.json", "state.json.tmp"]
    assert all((other / n).read_text() == "precious" for n in os.listdir(other))
    assert rt(tmp_path, "list", "-q").returncode == 0


def test_root_naming_a_file_is_one_line(tmp_path, make_bundle):
    (tmp_path / "state").write_text("")
    for verb in (["state", "x"], ["list"], ["delete", "x"], ["create", "--bundle", str(make_bundle(["true"])), "x"]):
        r = rt(tmp_path, *verb)
        assert r.returncode == 1 and errors(r) == [f"sandbox {verb[0]}: --root {tmp_path / 'state'}: not a directory"], \
            (verb, r.stderr)


def test_a_config_too_big_is_one_line_naming_it(make_bundle, tmp_path):
    from mounts.bundle import MAX_CONFIG

    bundle = make_bundle(["true"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["annotations"] = {"big": "x" * (MAX_CONFIG + 10)}
    (bundle / "config.json").write_text(json.dumps(spec))
    r = rt(tmp_path, "create", "--bundle", bundle, "big1")
    assert r.returncode == 2 and len(errors(r)) == 1, r.stderr
    assert f"{bundle}/config.json: " in r.stderr and "byte limit" in r.stderr
    assert not (tmp_path / "state" / "big1").exists()


def test_an_init_killed_during_create_is_named(make_bundle, driver_root, tmp_path):
    """SIGKILL the init while a GPU create is still setting it up (during its prestart hook):
    the error says the container's init died and of which signal (it said the gofer exited
    with status 0), and nothing is left."""
    import subprocess

    from tests.integration.helpers import children

    bundle = make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=all"],
                         hooks={"prestart": [{"path": "/bin/sleep", "args": ["sleep", "1"]}]})
    p = subprocess.Popen([*CLI, "--root", str(tmp_path / "s"), "--driver-root", str(driver_root), "create",
                          "--bundle", str(bundle), "k"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    killed = False
    deadline = time.monotonic() + 20
    while not killed and p.poll() is None and time.monotonic() < deadline:
        for init in children(p.pid):  # the init: the launcher's child ("sandbox-init"), once the hook runs
            try:
                if Path(f"/proc/{init}/cmdline").read_bytes().startswith(b"sandbox-init") and _hook_runs():
                    os.kill(init, 9)
                    killed = True
            except (ProcessLookupError, FileNotFoundError):
                pass
        time.sleep(0.01)
    assert killed and p.wait(timeout=30) == 1
    said = p.stderr.read()
    assert said == "sandbox create: the container's init or its builder was killed by signal 9 before it was ready\n", said
    assert not os.listdir(tmp_path / "s")


def _hook_runs() -> bool:
    """Whether the prestart hook (`sleep 1`) runs now (the builder's child)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x001\x00":
                return True
        except OSError:
            pass
    return False


def test_a_stopped_runs_state_replaced_takes_its_cgroups_along(make_bundle, tmp_path):
    """A foreground run whose init died with its supervisor (a server's worker killed, say)
    leaves its state: the next run of the id replaces it, and the cgroups it recorded go
    too (they used to stay, with no state left to delete them by)."""
    from sandbox.state import State, StateDir

    old = f"/sys/fs/cgroup/pids/sandbox-stale-{os.getpid()}"
    os.mkdir(old)
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)  # (a pid no process has: the old run is stopped)
        root = tmp_path / "state"
        StateDir(str(root), "stale1").create(State("stale1", pid, str(tmp_path), foreground=True, start_time=1,
                                                  cgroup=[old], cgroup_created=[old]))
        r = rt(tmp_path, "run", "--id", "stale1", str(make_bundle(["true"])))
        assert r.returncode == 0, r.stderr
        assert not os.path.exists(old)
        assert not (root / "stale1").exists()
    finally:
        if os.path.exists(old):
            os.rmdir(old)
