"""The warm server keeps the driver's inventory between containers (mounts/inventories.py):
the second GPU container served discovers nothing, and one served after the driver changed
(a GPU gone) sees the driver as it is now."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

LAUNCHER = Path(__file__).resolve().parents[2] / ".venv/bin/sandbox"


def _discovery(trace: Path) -> dict:
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    return next(e["args"] for e in events if e.get("name") == "discovery")


def test_the_server_keeps_the_inventory_until_the_driver_changes(make_bundle, driver_root, tmp_path):
    import engines

    if not LAUNCHER.is_file() or LAUNCHER.read_bytes()[:4] != b"\x7fELF":
        pytest.skip("the C launcher is not built (scripts/setup builds it)")
    drv = tmp_path / "drv"  # (hard links: files are moved or replaced here, never written)
    subprocess.run(["cp", "-al", str(driver_root), str(drv)], check=True)
    time.sleep(1.1)  # past reads.RACY: the copy's ctimes are new
    bundle = make_bundle(["sh", "-c", "ls /dev"], ["NVIDIA_VISIBLE_DEVICES=all"])
    with engines.WarmServer(tmp_path) as warm:
        env = dict(os.environ, SANDBOX_SERVER=str(warm.path))

        def run(n: int) -> tuple[list[str], dict]:
            trace = tmp_path / f"trace{n}.json"
            r = subprocess.run([str(LAUNCHER), "--root", str(tmp_path / "state"), "--driver-root", str(drv),
                                "run", "--trace", str(trace), "--id", f"kept{n}", str(bundle)],
                               capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
            assert r.returncode == 0, r.stderr
            return r.stdout.split(), _discovery(trace)

        first, how = run(1)
        assert how["kept"] == 0 and "nvidia1" in first
        second, how = run(2)
        assert how["kept"] == 1 and second == first
        gpus = drv / "proc/driver/nvidia/gpus"
        shutil.move(str(gpus / "0000:86:00.0"), str(tmp_path / "gone"))
        third, how = run(3)
        assert how["kept"] == 0 and "nvidia1" not in third and "nvidia0" in third
        assert warm.served() == 3
    assert not os.listdir(tmp_path / "state")
