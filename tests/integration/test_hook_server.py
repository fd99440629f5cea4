"""The warm hook server (`sandbox hook serve`): hooks under runc are served by its children,
two at once as well; killed, the hooks do the work themselves; errors are still one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.integration.helpers import CLI, mount_table, tree
from tests.integration.test_hook import SCRIPT, check_gpu_output, install, runc, usr_bin_is_a_file
from tests.sockets import silent_clients

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


@pytest.fixture
def server(tmp_path):
    """A server on a socket of the test's own; yields (socket path, its log)."""
    path = tmp_path / "run" / "hook.sock"
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([*CLI, "hook", "serve", "--server", str(path)], stdout=out, stderr=out)
    deadline = time.monotonic() + 20
    while not path.exists() and time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        time.sleep(0.02)
    yield path, log, proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    assert not path.exists(), "the server left its socket"


def _served(log) -> list[str]:
    return [line for line in log.read_text().splitlines() if ": exit " in line]


def test_hooks_are_served_warm(server, make_bundle, driver_root, tmp_path):
    path, log, _ = server
    assert oct(os.stat(path.parent).st_mode & 0o777) == "0o700"
    bundle = make_bundle(["sh", "-c", SCRIPT], ["NVIDIA_VISIBLE_DEVICES=all"])
    install(bundle, driver_root, "--server", path)
    r = runc(bundle, tmp_path / "state", "w1")
    assert r.returncode == 0, r.stderr
    check_gpu_output(r.stdout + r.stderr)
    assert len(_served(log)) == 1 and _served(log)[0].startswith("sandbox serve: hook: hook --driver-root"), \
        log.read_text()
    assert ": exit 0 in " in _served(log)[0]


def test_two_hooks_at_once(server, make_bundle, driver_root, tmp_path):
    path, log, _ = server
    bundles = [make_bundle(["sh", "-c", SCRIPT], ["NVIDIA_VISIBLE_DEVICES=all"]) for _ in range(2)]
    results = {}
    for b in bundles:
        install(b, driver_root, "--server", path)
    threads = [threading.Thread(target=lambda i=i, b=b: results.__setitem__(i, runc(b, tmp_path / "state", f"t{i}")))
               for i, b in enumerate(bundles)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for r in results.values():
        assert r.returncode == 0, r.stderr
        check_gpu_output(r.stdout + r.stderr)
    assert len(_served(log)) == 2 and all(": exit 0 in " in line for line in _served(log)), log.read_text()


def test_a_killed_server_leaves_the_hook_working(server, make_bundle, driver_root, tmp_path):
    """SIGKILL: its socket stays behind, refuses connections, and the hook does the work."""
    path, log, proc = server
    proc.kill()
    proc.wait(timeout=10)
    assert path.exists()
    bundle = make_bundle(["sh", "-c", SCRIPT], ["NVIDIA_VISIBLE_DEVICES=all"])
    install(bundle, driver_root, "--server", path)
    r = runc(bundle, tmp_path / "state", "k1")
    assert r.returncode == 0, r.stderr
    check_gpu_output(r.stdout + r.stderr)
    assert not _served(log)
    # a new server takes the stale socket over
    with open(log, "a") as out:
        again = subprocess.Popen([*CLI, "hook", "serve", "--server", str(path)], stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 20
        while log.read_text().count("listening on") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runc(bundle, tmp_path / "state", "k2").returncode == 0
        assert len(_served(log)) == 1, log.read_text()
    finally:
        again.send_signal(signal.SIGTERM)
        again.wait(timeout=10)


def test_an_error_through_the_server_is_one_line_and_leaves_nothing(server, make_bundle, driver_root, tmp_path,
                                                                    rootfs_debian):
    path, log, _ = server
    root = usr_bin_is_a_file(tmp_path, rootfs_debian)
    bundle = make_bundle(["/sh", "-c", "echo container ran"], ["NVIDIA_VISIBLE_DEVICES=all"], rootfs=root)
    install(bundle, driver_root, "--server", path)
    before = (mount_table(), tree(root))
    r = runc(bundle, tmp_path / "state", "e1")
    assert r.returncode != 0 and "container ran" not in r.stdout
    assert "sandbox hook: /usr/bin" in r.stderr and "not a directory" in r.stderr, r.stderr
    assert _served(log) and ": exit 1 in " in _served(log)[0], log.read_text()
    assert mount_table() == before[0] and tree(root) == before[1]


def test_only_root_reaches_the_server(server):
    """The socket's directory is root's alone; nobody cannot even connect."""
    path, log, _ = server
    # (Debian's python3, which nobody may run: a PATH's python3 may be a shim only root may)
    r = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "/usr/bin/python3", "-c",
                        f"import socket; s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); "
                        f"s.connect({str(path)!r})"], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "PermissionError: [Errno 13]" in r.stderr, r.stderr  # (the connect: a socket is made)
    assert not _served(log)


def test_a_root_client_without_capabilities_gets_nothing_done(server, make_bundle, driver_root, tmp_path):
    """uid 0 alone reaches the socket: a client with no capabilities (or in other namespaces)
    must not have the server widen a container's device rules or mount into it."""
    path, log, _ = server
    victim = make_bundle(["sleep", "30"])
    subprocess.run(["runc", "--root", str(tmp_path / "runc"), "run", "-d", "-b", str(victim), "victim"],
                   check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=60)
    try:
        state = json.loads(subprocess.run(["runc", "--root", str(tmp_path / "runc"), "state", "victim"],
                                          check=True, capture_output=True, text=True).stdout)
        with open(f"/proc/{state['pid']}/cgroup") as f:
            devices = next(line.split(":", 2)[2].strip() for line in f if ":devices:" in line)
        rules = Path(f"/sys/fs/cgroup/devices{devices}/devices.list")
        before = rules.read_text()
        gpu = make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=all"])
        hook = [*CLI, "hook", "--driver-root", str(driver_root), "--server", str(path)]
        r = subprocess.run(["setpriv", "--bounding-set=-all", "--inh-caps=-all", *hook],
                           input=json.dumps({"id": "victim", "pid": state["pid"], "bundle": str(gpu)}),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and rules.read_text() == before, (r.stderr, rules.read_text())
        assert not _served(log), log.read_text()
    finally:
        subprocess.run(["runc", "--root", str(tmp_path / "runc"), "delete", "--force", "victim"], timeout=60)


def test_a_client_in_another_pid_namespace_is_not_served(server, make_bundle, driver_root):
    """The state's pid is read in the client's pid namespace: a client in another one would
    have the server act on whichever process has that number here."""
    path, log, _ = server
    gpu = make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=all"])
    hook = [*CLI, "hook", "--driver-root", str(driver_root), "--server", str(path)]
    subprocess.run(["unshare", "-p", "-f", *hook], input=json.dumps({"id": "x", "pid": 1, "bundle": str(gpu)}),
                   capture_output=True, text=True, timeout=60)
    assert not _served(log), log.read_text()


def test_silent_clients_do_not_stop_the_others(server, make_bundle, driver_root, tmp_path):
    """MAX_CHILDREN + 6 connections that never send a request: a real hook is still done at
    once (served, or told to do its own work), and the silent ones are dropped after
    REQUEST_TIMEOUT."""
    import socket

    from sandbox.server.listen import MAX_CHILDREN

    path, log, _ = server
    silent = silent_clients(path, socket.SOCK_SEQPACKET, MAX_CHILDREN + 6)
    try:
        bundle = make_bundle(["sh", "-c", SCRIPT], ["NVIDIA_VISIBLE_DEVICES=all"])
        install(bundle, driver_root, "--server", path)
        t = time.monotonic()
        r = runc(bundle, tmp_path / "state", "q1")
        assert r.returncode == 0, r.stderr
        check_gpu_output(r.stdout + r.stderr)
        assert time.monotonic() - t < 10
    finally:
        for s in silent:
            s.close()


def test_a_relative_driver_root_is_the_clients(server, make_bundle, driver_root):
    """runc starts a hook in the bundle: a relative --driver-root is relative to the client's
    cwd, served as here (the launcher sends its cwd). Our own pid as the container's: refused
    after planning, which shows the driver root was found."""
    path, log, _ = server
    bundle = make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=all"])
    state = json.dumps({"ociVersion": "1.0.2", "id": "rel", "pid": os.getpid(), "bundle": str(bundle)})
    r = subprocess.run([*CLI, "hook", "--driver-root", driver_root.name, "--server", str(path)], input=state,
                       capture_output=True, text=True, cwd=driver_root.parent, timeout=30)
    assert r.returncode == 1 and "shares our mount namespace" in r.stderr, r.stderr
    assert len(_served(log)) == 1, log.read_text()


def test_an_older_installations_entry_is_served(server, make_bundle, driver_root, tmp_path):
    """A hook entry an older installation wrote (its C client `sandbox-hook` in front of our
    Python's -c program; CDI specs and bundles still name it): the launcher, through that
    name, takes its command line from the verb on, and the server serves it."""
    from sandbox.executor.build import entry_code

    path, log, _ = server
    bundle = make_bundle(["sh", "-c", SCRIPT], ["NVIDIA_VISIBLE_DEVICES=all"])
    config = bundle / "config.json"
    spec = json.loads(config.read_text())
    client = Path(CLI[0]).parent / "sandbox-hook"
    assert os.readlink(client) == "sandbox"  # (scripts/setup links it)
    python = str(Path(CLI[0]).parent / "python")
    spec["hooks"] = {"createRuntime": [{"path": str(client), "args": [
        "sandbox-hook", python, "-I", "-S", "-c", entry_code(), "hook", "--driver-root", str(driver_root),
        "--server", str(path)], "env": ["PATH=/usr/bin:/bin"]}]}
    config.write_text(json.dumps(spec))
    r = runc(bundle, tmp_path / "state", "o1")
    assert r.returncode == 0, r.stderr
    check_gpu_output(r.stdout + r.stderr)
    assert len(_served(log)) == 1 and "sandbox serve: hook: hook --driver-root" in _served(log)[0], log.read_text()
