"""The numbers the C clients of the warm server (sandbox/server_wire.h, sandbox/hook_client.c)
share with its Python side (sandbox/server_client.py), written in both: read from the C
sources and held against Python's, without root or a compiler."""

from __future__ import annotations

import re
from pathlib import Path

from sandbox import server_client

SANDBOX = Path(__file__).resolve().parents[2] / "sandbox"


def define(source: str, name: str) -> str:
    found = re.search(rf"^#define {name} (.+?)(?:\s*/\*.*)?$", (SANDBOX / source).read_text(), re.M)
    assert found, f"{source}: no #define {name}"
    return found.group(1).strip()


def test_the_c_clients_numbers_are_pythons():
    one, shift = re.fullmatch(r"\((\d+) << (\d+)\)", define("server_wire.h", "MAX_REQUEST")).groups()  # type: ignore[union-attr]
    assert int(one) << int(shift) == server_client.MAX_REQUEST
    assert define("server_wire.h", "DEFAULT_SOCKET") == f'"{server_client.SOCKET}"'
    assert int(define("hook_client.c", "REPLY_TIMEOUT")) == server_client.REPLY_TIMEOUT
