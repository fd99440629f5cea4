"""sandbox/hook_client.c, the C client of the warm hook server, against stand-in servers: the
request it sends, the answer it relays, and the Python hook it falls back to (here a shell
standing in for it) with the state on stdin again."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from sandbox.launcher import write_hook_client
from tests.sockets import full_listener

STATE = '{"ociVersion": "1.0.2", "id": "c\\u00e9", "pid": 1, "bundle": "/b"}'


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    out = tmp_path_factory.mktemp("client") / "sandbox-hook"
    write_hook_client(str(out))
    return str(out)


def serve_once(path: Path, reply: bytes | None):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(str(path))
    s.listen(1)
    got = {}

    def run():
        conn, _ = s.accept()
        got["request"] = conn.recv(1 << 20)
        if reply is not None and got["request"]:
            conn.send(reply)
        conn.close()
        s.close()

    t = threading.Thread(target=run)
    t.start()
    return t, got


def hook(client, path, state=STATE, extra=()):
    # the fallback stands in for the Python hook: it echoes its stdin and exits 7
    cmd = [client, "/bin/sh", "-c", "cat; exit 7", "hook", "--driver-root", "/", *extra, "--server", str(path)]
    return subprocess.run(cmd, input=state.encode() if isinstance(state, str) else state, capture_output=True,
                          timeout=30)


def test_the_answer_is_relayed(client, tmp_path):
    path = tmp_path / "s.sock"
    t, got = serve_once(path, b'{"code": 3, "error": "bad \\"thing\\" \\u00e9"}')
    r = hook(client, path)
    t.join(10)
    assert r.returncode == 3 and r.stderr.decode() == 'sandbox hook: bad "thing" \u00e9\n', r.stderr
    request = json.loads(got["request"])
    assert request == {"argv": ["hook", "--driver-root", "/", "--server", str(path)], "cwd": os.getcwd(), "stdin": STATE,
                       "program": "cat; exit 7"}


def test_a_server_that_dies_is_one_line(client, tmp_path):
    path = tmp_path / "s.sock"
    t, _ = serve_once(path, None)
    r = hook(client, path)
    t.join(10)
    assert r.returncode == 1 and r.stderr.decode() == f"sandbox hook: the hook server at {path} died before it answered\n"


@pytest.mark.parametrize("extra", [b"\xff", b"\xed\xa0\x80", b"\xe0\x80\xaf", "\u00e9\U0001f600".encode(), b"\0\x01"])
def test_a_state_that_is_not_utf8_goes_as_python_reads_it(extra, client, tmp_path):
    """A byte that starts no UTF-8 sequence (a lone one, a surrogate's, an overlong form) is
    sent as surrogateescape's \\udcXX: the server's Python gets the very bytes back."""
    path = tmp_path / "s.sock"
    t, got = serve_once(path, b'{"code": 0, "error": ""}')
    state = STATE.encode() + extra
    r = hook(client, path, state)
    t.join(10)
    assert r.returncode == 0, r.stderr
    assert json.loads(got["request"])["stdin"].encode("utf-8", "surrogateescape") == state


@pytest.mark.parametrize("case", ["no server", "trace", "2 MB", "declined"])
def test_otherwise_the_python_hook_runs_with_the_state(case, client, tmp_path):
    path = tmp_path / "s.sock"
    state = STATE.encode() + {"2 MB": b" " * (2 << 20)}.get(case, b"")
    if case == "declined":  # the server tells it to do the work itself
        t, got = serve_once(path, b'{"fallback": "arguments only the hook itself reads"}')
    if case == "trace":  # a server that would answer, never asked
        t, got = serve_once(path, b'{"code": 0, "error": ""}')
    r = hook(client, path, state, ["--trace", "/t.json"] if case == "trace" else [])
    if case == "trace":
        releaser = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        releaser.connect(str(path))  # the accept gets this, an empty request
        releaser.close()
        t.join(10)
        assert got["request"] == b""
    if case == "declined":
        t.join(10)
    assert r.returncode == 7 and r.stdout == state, (r.stdout[:200], r.stderr)


@pytest.mark.parametrize("reply,code,stderr", [
    (b'{"code": 0, "error": "\\u1', 0, ""),  # a cut escape: nothing past the reply is read
    (b'{"code": "x", "error": ""}', 1, "gave no exit code"),
    (b'{"code": 300, "error": ""}', 300 & 0xFF, ""),
])
def test_odd_replies(reply, code, stderr, client, tmp_path):
    path = tmp_path / "s.sock"
    t, _ = serve_once(path, reply)
    r = hook(client, path)
    t.join(10)
    assert r.returncode == code and stderr in r.stderr.decode(), r.stderr
    if not stderr:
        assert r.stderr == b""


def test_a_server_not_roots_is_not_asked(client, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to be another user")
    path = tmp_path / "s.sock"
    os.chmod(tmp_path, 0o755)
    pid = os.fork()
    if pid == 0:  # a server of nobody's
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.bind(str(path))
            os.chmod(path, 0o777)
            os.setuid(65534)
            s.listen(1)
            conn, _ = s.accept()
            conn.send(b'{"code": 0, "error": ""}')
        finally:
            os._exit(0)
    try:
        while not path.exists():
            pass
        r = hook(client, path)
        assert r.returncode == 7 and r.stdout == STATE.encode(), r.stderr
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def test_a_server_that_never_answers_is_left_after_the_deadline(tmp_path):
    """Built with a 1 s deadline: a server that takes the request and then says nothing is
    given up on, and the Python hook does the work."""
    client = tmp_path / "sandbox-hook"
    write_hook_client(str(client), ("REPLY_TIMEOUT=1",))
    path = tmp_path / "s.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(str(path))
    s.listen(1)
    held = []
    t = threading.Thread(target=lambda: held.append(s.accept()[0]))
    t.start()
    try:
        r = hook(str(client), path)
        assert r.returncode == 7 and r.stdout == STATE.encode(), r.stderr
        assert b"no answer from the hook server" in r.stderr and b"in 1 s" in r.stderr
    finally:
        t.join(10)
        for conn in held:
            conn.close()
        s.close()


def test_a_full_listen_queue_is_left_at_once(client, tmp_path):
    """listen(0), never accepted, its queue filled: connect gives up within its 1 s."""
    path = tmp_path / "s.sock"
    with full_listener(path, socket.SOCK_SEQPACKET):
        r = hook(client, path)
        assert r.returncode == 7 and r.stdout == STATE.encode(), r.stderr
