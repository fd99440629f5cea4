"""How the launcher is linked (sandbox/executor/build.py): static (-static-pie) where the C
library's static archive is there, else dynamically, said in one line; either one runs."""

from __future__ import annotations

import os
import subprocess

import pytest

from sandbox.executor import build

pytestmark = pytest.mark.skipif(build._cc() is None, reason="no C compiler")


def _interpreter(path) -> bool:
    """Whether the ELF file asks for a dynamic loader (a PT_INTERP header)."""
    out = subprocess.run(["readelf", "-lW", str(path)], capture_output=True, text=True, check=True).stdout
    return "INTERP" in out


def _runs(path) -> bool:
    r = subprocess.run([str(path), "--root", "/nonexistent-state-dir", "state"], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, SANDBOX_SERVER=""))
    return r.returncode == 2 and "sandbox" in r.stderr  # (argparse's: state needs an id)


def test_static_where_the_static_c_library_is_there(tmp_path, capfd):
    if not any(os.path.exists(f"/usr/lib/{d}/libc.a") for d in ("x86_64-linux-gnu", "aarch64-linux-gnu", "")):
        pytest.skip("no static C library here")
    build.write_launcher(str(tmp_path / "sandbox"))
    assert not _interpreter(tmp_path / "sandbox")
    assert "linked dynamically" not in capfd.readouterr().err
    assert _runs(tmp_path / "sandbox")


def test_without_a_static_link_dynamic_and_said_so(tmp_path, monkeypatch, capfd):
    """A compiler whose static link fails (no libc.a: Fedora without glibc-static)."""
    cc = tmp_path / "cc"
    cc.write_text(f'#!/bin/sh\nfor a; do [ "$a" = -static-pie ] && {{ echo "ld: cannot find -lc" >&2; exit 1; }}; done\n'
                  f'exec {build._cc()} "$@"\n')
    cc.chmod(0o755)
    monkeypatch.setattr(build, "_cc", lambda: str(cc))
    build.write_launcher(str(tmp_path / "sandbox"))
    assert _interpreter(tmp_path / "sandbox")
    err = capfd.readouterr().err
    assert err.strip() == "sandbox: the launcher is linked dynamically (no static link: ld: cannot find -lc)"
    assert _runs(tmp_path / "sandbox")
