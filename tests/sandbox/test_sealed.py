"""Which commands re-execute sealed: decided on the bytes of the files the command names,
without blocking on (or consuming) one that is not a regular file."""

from __future__ import annotations

import json
import os

from sandbox.sealed import may_ptrace


def test_named_files_decide(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"process": {"capabilities": {"bounding": ["CAP_CHOWN"]}}}))
    assert not may_ptrace(["run", str(tmp_path)], "run")
    (tmp_path / "config.json").write_text(json.dumps({"process": {"capabilities": {"bounding": ["CAP_SYS_PTRACE"]}}}))
    assert may_ptrace(["run", "--bundle", str(tmp_path), "x"], "run")
    assert may_ptrace(["exec", "--cap", "CAP_SYS_PTRACE", "x", "sh"], "exec")


def test_a_fifo_is_not_read_and_counts_as_may(tmp_path):
    fifo = tmp_path / "process.json"
    os.mkfifo(fifo)
    w = os.open(fifo, os.O_RDWR)  # a writer that never writes: a blocking read would hang
    try:
        os.write(w, b'{"args": ["sh"]}')
        assert may_ptrace(["exec", "--process", str(fifo), "x"], "exec")
        assert os.read(w, 64) == b'{"args": ["sh"]}'  # still there for the real parse
    finally:
        os.close(w)
