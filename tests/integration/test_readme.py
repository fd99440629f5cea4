"""The README's quick start, run as it stands: each command of its block, from the checkout,
on the demo's bundle and fixture driver root."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

REPO = Path(__file__).resolve().parents[2]


def _quick_start() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "the README's quick start has no sh block"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_quick_start_runs_as_written(driver_root):
    import fixtures

    fixtures.demo_bundle()  # (what ./scripts/demo leaves: the README names its paths)
    commands = _quick_start()
    assert len(commands) == 3 and all(c.startswith(".venv/bin/sandbox ") for c in commands), commands
    trace = REPO / ".cache/t.json"
    try:
        for command in commands:
            r = subprocess.run(shlex.split(command), cwd=REPO, capture_output=True, text=True, timeout=120,
                               env=dict(os.environ, SANDBOX_SERVER=""))
            assert r.returncode == 0, (command, r.stderr)
            assert r.stdout, command
    finally:
        trace.unlink(missing_ok=True)
