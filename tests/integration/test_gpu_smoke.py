"""scripts/gpu-smoke where there is no GPU: one line without a driver; against the fixture,
the CUDA program runs in both containers up to cuInit's error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

SMOKE = [sys.executable, str(Path(__file__).resolve().parents[2] / "scripts/gpu_smoke.py")]


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia/version"), reason="this host has an NVIDIA driver")
def test_no_driver_is_one_line():
    r = subprocess.run(SMOKE, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr == "", r.stderr
    assert r.stdout.count("\n") == 1 and r.stdout.startswith("gpu-smoke: /: no NVIDIA driver found"), r.stdout


def test_on_the_fixture_the_program_runs_up_to_cuinit(driver_root):
    r = subprocess.run([*SMOKE, "--driver-root", str(driver_root), "-n", "1"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    for how in ("sandbox run", "runc + hook"):
        mine = [line.partition(": ")[2] for line in lines if line.startswith(how + ": ")]
        # libcuda was found and loaded through our cache; the kernel module is what is missing
        assert mine[:3] == ["ok   dlopen libcuda.so.1", "FAIL cuInit: error 100 (no CUDA-capable device is detected)",
                            "cudasmoke exit 1"], r.stdout
        assert "nvidia-smi exit 9" in mine, r.stdout  # NVIDIA's "couldn't communicate with the driver"
    assert any(line.startswith("start (sandbox run, GPU container") for line in lines), r.stdout
    assert lines[-1] == "gpu-smoke: FAILED"
