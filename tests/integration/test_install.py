"""scripts/install into a temporary prefix: the runtime stands on its own, from any cwd,
naming no path of the checkout."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


def test_an_install_runs_bundles_and_names_no_checkout_path(tmp_path, make_bundle, driver_root):
    prefix, etc = tmp_path / "opt", tmp_path / "etc"
    r = subprocess.run([str(REPO / "scripts/install"), "--prefix", str(prefix), "--sysconfdir", str(etc)],
                       capture_output=True, text=True, timeout=300, cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    sandbox = prefix / "bin/sandbox"
    bundle = make_bundle(["sh", "-c", "ls /dev/nvidia0 && echo ran"], ["NVIDIA_VISIBLE_DEVICES=0"])
    r = subprocess.run([str(sandbox), "--root", str(tmp_path / "s"), "--driver-root", str(driver_root), "run",
                        str(bundle)], capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0 and r.stdout.splitlines() == ["/dev/nvidia0", "ran"], r.stderr
    version = subprocess.run([str(sandbox), "--version"], capture_output=True, text=True, cwd="/").stdout
    assert "commit: unknown" not in version and "libseccomp:" in version
    # a hook installed from there runs the installed launcher (found beside the interpreter)
    r = subprocess.run([str(sandbox), "hook", "install", str(bundle), "--driver-root", str(driver_root)],
                       capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    hook = json.loads((bundle / "config.json").read_text())["hooks"]["createRuntime"][0]
    assert hook["path"] == str(sandbox) and hook["args"][:2] == ["sandbox", "hook"], hook
    assert os.readlink(prefix / "venv/bin/sandbox") == "../../bin/sandbox"
    assert os.readlink(prefix / "venv/bin/sandbox-hook") == "sandbox"  # (an older install's entries name it)
    assert (etc / "config.toml.example").is_file()
    units = prefix / "lib/systemd/system"
    assert sorted(p.name for p in units.iterdir()) == ["gpu-sandbox.service", "gpu-sandbox.socket"]
    assert f"ExecStart={prefix}/bin/sandbox serve" in (units / "gpu-sandbox.service").read_text()
    verify = subprocess.run(["systemd-analyze", "verify", str(units / "gpu-sandbox.socket"),
                             str(units / "gpu-sandbox.service")], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr
    named = subprocess.run(["grep", "-rl", "--binary-files=text", str(REPO), str(prefix), str(etc)],
                           capture_output=True, text=True)
    assert named.stdout == "", named.stdout  # nothing names the checkout


def test_a_staged_install_runs_where_it_lands(tmp_path, make_bundle, driver_root):
    """DESTDIR (packagers): every file lands under the stage, names the prefix alone, and runs
    once moved there."""
    stage, prefix, etc = tmp_path / "stage", tmp_path / "opt", tmp_path / "etc"
    r = subprocess.run([str(REPO / "scripts/install"), "--prefix", str(prefix), "--sysconfdir", str(etc)],
                       capture_output=True, text=True, timeout=300, cwd="/", env={**os.environ, "DESTDIR": str(stage)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert not prefix.exists() and not etc.exists()
    assert (stage / str(etc).lstrip("/") / "config.toml.example").is_file()
    named = subprocess.run(["grep", "-rl", "--binary-files=text", "-e", str(stage), "-e", str(REPO), str(stage)],
                           capture_output=True, text=True)
    assert named.stdout == "", named.stdout  # nothing names the stage or the checkout
    os.rename(stage / str(prefix).lstrip("/"), prefix)
    bundle = make_bundle(["sh", "-c", "ls /dev/nvidia0 && echo ran"], ["NVIDIA_VISIBLE_DEVICES=0"])
    r = subprocess.run([str(prefix / "bin/sandbox"), "--root", str(tmp_path / "s"), "--driver-root",
                        str(driver_root), "run", str(bundle)], capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0 and r.stdout.splitlines() == ["/dev/nvidia0", "ran"], r.stderr
    pip = subprocess.run([str(prefix / "venv/bin/pip"), "--version"], capture_output=True, text=True)
    assert pip.returncode == 0 and str(prefix) in pip.stdout, pip.stderr
