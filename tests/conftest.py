"""Shared fixtures: the real 535 driver root, container roots and bundles (built once, cached
under .cache/ by scripts/fixtures.py)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import fixtures  # noqa: E402

# No test is served by a warm server it did not start (one at the default socket would run
# verbs with the code it started with): tests/integration/test_served.py starts its own. The
# launcher (tests/integration/helpers.py's CLI) finds none at this socket and plans exec,
# create and run with a planner of its own and its C executor, the path of a node without a
# server; SANDBOX_SERVER="" in a test is the launcher's own Python (test_served.py's baseline).
os.environ["SANDBOX_SERVER"] = "/nonexistent/sandbox-tests.sock"  # (a directory no one makes)
os.environ["SANDBOX_SERVER_IDLE"] = "0"  # nor does a client of a test start one (sandbox/executor/server_connect.h)


@pytest.fixture(scope="session", autouse=True)
def no_server_left_at_the_nodes_socket():
    """podman passes its runtime no environment on its direct calls (start, kill, delete):
    those of a test that configures podman with our runtime start the node's server (at the
    default socket, as they would on a node). Stopped, and its files removed, at the end."""
    from sandbox.executor.wire import SOCKET

    there = os.path.lexists(SOCKET)
    yield
    if there:
        return
    import shutil
    import signal
    import time

    servers = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/fd/1") == f"{SOCKET}.log":
                os.kill(int(pid), signal.SIGTERM)
                servers.append(pid)
        except OSError:
            pass
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") for pid in servers) and time.monotonic() < deadline:
        time.sleep(0.02)  # (each removes its own socket as it goes)
    for path in (SOCKET, f"{SOCKET}.log"):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    shutil.rmtree(f"{SOCKET}.bpf", ignore_errors=True)


@pytest.fixture(scope="session")
def driver_root() -> Path:
    """The real NVIDIA 535 driver files under a fixture driver root, with a persistenced
    socket that really listens while the tests run."""
    root = fixtures.driver_535()
    path = root / "var/run/nvidia-persistenced/socket"
    if path.exists() or path.is_socket():
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cwd = os.getcwd()
    os.chdir(path.parent)  # a relative name: the checkout's path may be past AF_UNIX's 108 bytes
    try:
        sock.bind(path.name)
    finally:
        os.chdir(cwd)
    sock.listen(1)
    yield root
    sock.close()
    path.unlink(missing_ok=True)


@pytest.fixture(scope="session", autouse=True)
def no_setup_records_left():
    """The hook's records of containers set up (gofer/embed.py APPLIED): each test's
    container is gone by the session's end, and so must its record be."""
    from gofer.embed import APPLIED

    before = set(os.listdir(APPLIED)) if os.path.isdir(APPLIED) else set()
    yield
    for name in set(os.listdir(APPLIED)) - before if os.path.isdir(APPLIED) else ():
        os.unlink(os.path.join(APPLIED, name))


@pytest.fixture(scope="session")
def driver_version(driver_root) -> str:
    return fixtures.driver_version(driver_root)


@pytest.fixture(scope="session")
def rootfs_debian() -> Path:
    return fixtures.rootfs("debian")


@pytest.fixture(scope="session")
def rootfs_lib64() -> Path:
    return fixtures.rootfs("lib64")


@pytest.fixture
def make_bundle(tmp_path, rootfs_debian):
    """make_bundle(args, env=[...], rootfs=..., **spec_fields) -> bundle dir."""
    count = iter(range(1000))

    def make(args=("true",), env=(), rootfs=None, **spec):
        return fixtures.bundle(tmp_path / f"bundle{next(count)}", rootfs or rootfs_debian,
                               list(args), list(env), **spec)

    return make


def root_required():
    return pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mounts, namespaces)")


@pytest.fixture
def driver_copy(tmp_path, driver_root) -> Path:
    """The fixture driver root's etc, usr, lib, proc and dev as hard links under tmp_path: a
    test replaces files there (never writes through a link: the shared fixture stays whole)."""
    import subprocess

    copy = tmp_path / "driver"
    copy.mkdir()
    for d in ("etc", "usr", "lib", "proc", "dev"):
        subprocess.run(["cp", "-al", str(driver_root / d), str(copy / d)], check=True)
    return copy
