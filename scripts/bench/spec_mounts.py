#!/usr/bin/env python3
"""Spec mounts at scale and parallel execs, against runc on the same bundles, interleaved,
medians (issue "faults": 10,000 tmpfs mounts took 7.9 s against runc's 0.7 s):

  run     `sandbox run` and `runc run` of a busybox bundle with N tmpfs mounts (N = 1000, 10000)
  exec    P parallel `exec true` into one running container (P = 50), sandbox, sandbox with its
          warm server (the exec front end, sandbox/executor/frontend.c) and runc

Needs root. BENCH_N sets the run count (default 3), BENCH_MOUNTS the mount counts.
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

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import engines  # noqa: E402
import fixtures  # noqa: E402

SANDBOX = [str(REPO / ".venv/bin/sandbox")]


def bundle_with_mounts(work: Path, n: int) -> Path:
    """A copy of the Debian fixture rootfs with the N mount points made (neither runtime
    then writes into an image, and the fixture stays as it is)."""
    bundle = work / f"b{n}"
    rootfs = work / f"rootfs{n}"
    shutil.copytree(fixtures.rootfs("debian"), rootfs, symlinks=True)
    for i in range(n):
        (rootfs / f"tmp/m{i}").mkdir()
    spec = fixtures.default_spec(["true"], [], str(rootfs))
    spec["mounts"] += [{"destination": f"/tmp/m{i}", "type": "tmpfs", "source": "tmpfs", "options": ["size=64k"]}
                       for i in range(n)]
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd[:6])}...\n{r.stderr[-2000:]}")
    return (time.perf_counter() - t) * 1e3


def parallel_execs(runtime: list[str], cid: str, p: int, env: dict) -> float:
    t = time.perf_counter()
    procs = [subprocess.Popen([*runtime, "exec", cid, "true"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=env) for _ in range(p)]
    codes = [q.wait() for q in procs]
    if any(codes):
        raise SystemExit(f"exec failed: {codes}")
    return (time.perf_counter() - t) * 1e3


def main() -> None:
    runs = int(os.environ.get("BENCH_N", "3"))
    counts = [int(c) for c in os.environ.get("BENCH_MOUNTS", "1000,10000").split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-mounts-"))
    try:
        results: dict[str, list[float]] = {}
        for n in counts:
            bundle = bundle_with_mounts(work, n)
            for i in range(runs):
                for name, cmd in ((f"sandbox run, {n} tmpfs", [*SANDBOX, "--root", str(work / "s"), "run", "-b",
                                                               str(bundle), f"m{i}"]),
                                  (f"runc run, {n} tmpfs", ["runc", "--root", str(work / "r"), "run", "-b",
                                                            str(bundle), f"m{i}"])):
                    results.setdefault(name, []).append(timed(cmd))
        sleeper = work / "sleeper"
        spec = fixtures.default_spec(["sleep", "600"], [], str(fixtures.rootfs("debian")))
        sleeper.mkdir()
        (sleeper / "config.json").write_text(json.dumps(spec))
        runtimes = {"sandbox": [*SANDBOX, "--root", str(work / "s")], "runc": ["runc", "--root", str(work / "r")]}
        server = engines.WarmServer(work / "warm")
        envs = {"sandbox": dict(os.environ, SANDBOX_SERVER=""), "runc": dict(os.environ),
                "sandbox+server": dict(os.environ, SANDBOX_SERVER=str(server.path))}
        for rt in runtimes.values():
            subprocess.run([*rt, "run", "-d", "-b", str(sleeper), "x"], check=True, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=envs["sandbox"])
        try:
            with server:
                for _ in range(runs):
                    for name, env in envs.items():
                        rt = runtimes[name.split("+")[0]]
                        results.setdefault(f"{name}: 50 parallel exec", []).append(parallel_execs(rt, "x", 50, env))
                served = sum(" exec " in line for line in server.log.read_text().splitlines())
                if served < 50 * runs:
                    raise SystemExit(f"the warm server planned {served} execs, not {50 * runs}: {server.log}")
        finally:
            for rt in runtimes.values():
                subprocess.run([*rt, "delete", "--force", "x"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(f"{'what':<32} {'median ms':>10} {'min':>8} {'max':>8}   (n={runs}, load {os.getloadavg()[0]:.2f})")
        for name, times in results.items():
            print(f"{name:<32} {statistics.median(times):>10.0f} {min(times):>8.0f} {max(times):>8.0f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
