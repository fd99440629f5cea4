#!/usr/bin/env python3
"""What a GPU container costs through podman 4.3 four ways, interleaved, medians:

  podman + runc, no GPU                         the floor
  podman + runc + CDI, cold hook                our spec, its hook a Python process per container
  podman + runc + CDI, warm server              our spec as generated: its hook the C client of
                                                the warm server (`sandbox serve`, listening here)
  podman + sandbox as the runtime               -e NVIDIA_VISIBLE_DEVICES=all, GPUs native

(runc with our OCI hook is in scripts/bench/run.py.) podman reads CDI specs from /etc/cdi and
/var/run/cdi only: the benchmark runs in a private mount namespace whose /run is a tmpfs of
its own with the spec in /run/cdi. Needs root. BENCH_N sets the run count (default 15).
"""

from __future__ import annotations

import json
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
    spec = subprocess.run([engines.SANDBOX, "cdi", "generate", "--driver-root", str(driver), "--format", "json"],
                          check=True, capture_output=True, text=True).stdout
    cold = json.loads(spec)  # the same spec, its hooks told to ask no server (SANDBOX_SERVER=): our Python's
    cold["kind"] = "sandbox.bench/gpu"
    for edits in [cold["containerEdits"], *(d["containerEdits"] for d in cold["devices"])]:
        for hook in edits.get("hooks", []):
            hook["env"] = [*hook.get("env", []), "SANDBOX_SERVER="]
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/run"], check=True)
    os.mkdir("/run/cdi")
    Path("/run/cdi/nvidia.json").write_text(spec)
    Path("/run/cdi/cold.json").write_text(json.dumps(cold))
    base = tempfile.mkdtemp(prefix="cdib", dir="/tmp")  # podman wants a runroot under 50 characters
    # the warm server at its default socket, in this namespace's own /run
    server = engines.WarmServer(Path(base), Path("/run/gpu-sandbox/hook.sock")).__enter__()
    try:
        podman = ["podman", "--root", f"{base}/root", "--runroot", f"{base}/runroot", "--tmpdir", f"{base}/tmp",
                  "--storage-driver", "overlay", "--cgroup-manager", "cgroupfs", "--events-backend", "file"]
        subprocess.run([*podman, "load", "-i", str(fixtures.image_archive())], check=True, capture_output=True)
        run = ["run", "--rm", "--network", "none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
        variants = {
            "podman + runc, no GPU": [*podman, "--runtime", engines.RUNC, *run, engines.IMAGE, "true"],
            "podman + runc + CDI, cold hook": [*podman, "--runtime", engines.RUNC, *run, "--device",
                                               "sandbox.bench/gpu=all", engines.IMAGE, "true"],
            "podman + runc + CDI, warm server": [*podman, "--runtime", engines.RUNC, *run, "--device",
                                                 "nvidia.com/gpu=all", engines.IMAGE, "true"],
            "podman + sandbox, GPUs native": [*podman, "--runtime", engines.SANDBOX, "--runtime-flag",
                                              f"driver-root={driver}", *run, "-e", "NVIDIA_VISIBLE_DEVICES=all",
                                              engines.IMAGE, "true"],
        }
        # each GPU variant's container really has the driver: libcuda.so.1 in its ld.so.cache,
        # which only a hook that worked in the container's mount namespace (or sandbox) wrote
        for name, cmd in variants.items():
            if "no GPU" in name:
                continue
            check = [*cmd[:-1], "sh", "-c", "grep -c libcuda.so.1 /etc/ld.so.cache"]
            r = subprocess.run(check, capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"{name}: the container has no libcuda.so.1 in its ld.so.cache: {r.stderr[-500:]}")
        times: dict[str, list[float]] = {k: [] for k in variants}
        for i in range(N + 1):  # the first round warms caches and is dropped
            for name, cmd in variants.items():
                t = time.perf_counter()
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    raise SystemExit(f"{name}: {r.stderr}")
                if i:
                    times[name].append((time.perf_counter() - t) * 1e3)
        served = server.served()
    finally:
        server.__exit__()
        shutil.rmtree(base, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    floor = med["podman + runc, no GPU"]
    print(f"podman run --rm IMAGE true, median of {N} interleaved runs ({served} hooks served warm):")
    for k, v in med.items():
        print(f"  {k:36s} {v:7.1f} ms  ({v - floor:+.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
