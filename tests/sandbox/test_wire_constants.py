"""The wire's numbers as C sees them: a program built as sandbox/executor/build.py builds the C
client, the launcher (the header sandbox/executor/wire.py writes, sandbox/executor/server_wire.h) prints what it was given,
held against Python's, without root."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gofer import frontend_plan
from sandbox.executor import build as launcher
from sandbox.executor import wire

SANDBOX = Path(launcher.__file__).resolve().parent

PROGRAM = r"""
#include "server_wire.h"
int main(void) {
    static const char *const served[] = {SANDBOX_SERVED, NULL};
    printf("%s %d %d %d %d %d %d\n", DEFAULT_SOCKET, MAX_REQUEST, TAKE_UP_S, REPORT_ANSWER_S,
           PLAN_MAX_FDS, PLAN_MAX_NS, PLAN_MAX_CGROUPS);
    printf("%s %s %s %s %zu\n", PLAN_READY, PLAN_GO, PLAN_STATUS, PLAN_MEMFD, sizeof PLAN_MEMFD);
    for (int i = 0; served[i]; i++) printf("%s\n", served[i]);
    return 0;
}
"""


def test_the_c_clients_numbers_are_pythons(tmp_path):
    if launcher._cc() is None:
        pytest.skip("no C compiler")
    (tmp_path / "print.c").write_text(PROGRAM.replace('"server_wire.h"', f'"{SANDBOX / "server_wire.h"}"'))
    launcher._build(str(tmp_path / "print"), [str(tmp_path / "print.c")], "")  # (an absolute source: that one)
    out = subprocess.run([str(tmp_path / "print")], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0].split() == [wire.SOCKET, *map(str, (wire.MAX_REQUEST, wire.TAKE_UP_S,
                              wire.REPORT_ANSWER_S, frontend_plan.MAX_FDS, frontend_plan.MAX_NS,
                              frontend_plan.MAX_CGROUPS))]
    words = (frontend_plan.READY, frontend_plan.GO, frontend_plan.STATUS, frontend_plan.MEMFD)
    assert out[1].split() == [*words, str(len(frontend_plan.MEMFD) + 1)]  # (the memfd message: the word and its NUL)
    assert tuple(out[2:]) == wire.SERVED
