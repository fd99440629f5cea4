#!/usr/bin/env python3
"""What a GPU container costs through podman 4.3 three ways, interleaved, medians:

  podman + runc, no GPU                         the floor
  podman + runc + CDI (our spec, its hook)      --device nvidia.com/gpu=all
  podman + sandbox as the runtime               -e NVIDIA_VISIBLE_DEVICES=all, GPUs native

(runc with our OCI hook is in scripts/bench/run.py.) podman reads CDI specs from /etc/cdi and
/var/run/cdi only: the benchmark runs in a private mount namespace whose /run is a tmpfs of
its own with the spec in /run/cdi. Needs root. BENCH_N sets the run count (default 15).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engines  # noqa: E402
import fixtures  # noqa: E402

N = int(os.environ.get("BENCH_N", "15"))


def main() -> int:
    if os.geteuid() != 0:
        raise SystemExit("run the benchmark as root")
    if os.environ.get("SANDBOX_BENCH_NS") != "1":  # once more, in a private mount namespace
        parents = engines._cgroup_parents("libpod_parent")
        try:
            return subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, __file__],
                                  env=dict(os.environ, SANDBOX_BENCH_NS="1")).returncode
        finally:
            engines._rm_if_new(parents)
    driver = fixtures.driver_535()
    spec = subprocess.run([engines.SANDBOX, "cdi", "generate", "--driver-root", str(driver)], check=True,
                          capture_output=True, text=True).stdout
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/run"], check=True)
    os.mkdir("/run/cdi")
    Path("/run/cdi/nvidia.yaml").write_text(spec)
    base = tempfile.mkdtemp(prefix="cdib", dir="/tmp")  # podman wants a runroot under 50 characters
    try:
        podman = ["podman", "--root", f"{base}/root", "--runroot", f"{base}/runroot", "--tmpdir", f"{base}/tmp",
                  "--storage-driver", "overlay", "--cgroup-manager", "cgroupfs", "--events-backend", "file"]
        subprocess.run([*podman, "load", "-i", str(fixtures.image_archive())], check=True, capture_output=True)
        run = ["run", "--rm", "--network", "none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
        variants = {
            "podman + runc, no GPU": [*podman, "--runtime", engines.RUNC, *run, engines.IMAGE, "true"],
            "podman + runc + CDI (our spec)": [*podman, "--runtime", engines.RUNC, *run, "--device",
                                               "nvidia.com/gpu=all", engines.IMAGE, "true"],
            "podman + sandbox, GPUs native": [*podman, "--runtime", engines.SANDBOX, "--runtime-flag",
                                              f"driver-root={driver}", *run, "-e", "NVIDIA_VISIBLE_DEVICES=all",
                                              engines.IMAGE, "true"],
        }
        times: dict[str, list[float]] = {k: [] for k in variants}
        for i in range(N + 1):  # the first round warms caches and is dropped
            for name, cmd in variants.items():
                t = time.perf_counter()
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    raise SystemExit(f"{name}: {r.stderr}")
                if i:
                    times[name].append((time.perf_counter() - t) * 1e3)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    floor = med["podman + runc, no GPU"]
    print(f"podman run --rm IMAGE true, median of {N} interleaved runs:")
    for k, v in med.items():
        print(f"  {k:34s} {v:7.1f} ms  ({v - floor:+.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
