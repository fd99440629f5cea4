#!/usr/bin/env python3
"""A pod through containerd's CRI as kubelet starts one (scripts/cri.py), per runtime handler,
interleaved (runc, sandbox, sandbox with NVIDIA_VISIBLE_DEVICES=all, runc, ...), medians in ms:

  pod start   RunPodSandbox (host network) + CreateContainer + StartContainer of `sleep`
  exec        ExecSync of `true` in that container (BENCH_EXECS of them per pod)
  teardown    StopPodSandbox + RemovePodSandbox

Needs root. BENCH_N sets the run count (default 20; one more round warms caches and is
dropped). CRI_PAUSE_DIRS=1 uses a pause image that also has /proc, /dev and /sys (where the
runtime cannot start a pod of /pause alone). BENCH_SERVER=1 starts a warm server (`sandbox
serve`) and has containerd pass SANDBOX_SERVER on to the runtime.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

# scripts/ (cri, fixtures) and the repository (gofer, mounts), not this folder: its mounts.py
# and this very cri.py would shadow the project's
HERE = Path(__file__).resolve().parent
sys.path[:] = [str(HERE.parents[1]), str(HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() != HERE]

import cri  # noqa: E402
import engines  # noqa: E402
import fixtures  # noqa: E402

N = int(os.environ.get("BENCH_N", "20"))
EXECS = int(os.environ.get("BENCH_EXECS", "3"))
COOL = 0.1  # a pause before each pod (see scripts/bench/engines.py)
VARIANTS = {"runc": ("runc", {}), "sandbox": ("sandbox", {}),
            "sandbox+gpu": ("sandbox", {"NVIDIA_VISIBLE_DEVICES": "all"})}


def one(c: cri.CRI, handler: str, env: dict, i: int) -> tuple[float, list[float], float]:
    t = time.perf_counter()
    pod = c.run_pod(f"bench-{handler}-{i}", handler)
    cid = c.run_container(pod, "app", ["sleep", "1000"], env=env)
    start = (time.perf_counter() - t) * 1e3
    execs = []
    for _ in range(EXECS):
        t = time.perf_counter()
        r = c.exec_sync(cid, ["true"])
        execs.append((time.perf_counter() - t) * 1e3)
        if r.exit_code != 0:
            raise SystemExit(f"ExecSync of true under {handler}: exit {r.exit_code}: {r.stderr!r}")
    t = time.perf_counter()
    errors = c.teardown_pod(pod)
    down = (time.perf_counter() - t) * 1e3
    if errors:
        raise SystemExit(f"teardown under {handler}: {errors}")
    return start, execs, down


def main() -> int:
    if os.geteuid() != 0:
        raise SystemExit("bench/cri.py: needs root")
    fixtures.compile_project()
    work = Path(tempfile.mkdtemp(prefix="cri-bench-", dir="/tmp"))
    c = cri.CRI(work, fixtures.driver_535(), trace=False,
                pause_with_mount_points=os.environ.get("CRI_PAUSE_DIRS") == "1")
    times: dict[str, dict[str, list[float]]] = {v: {"start": [], "exec": [], "down": []} for v in VARIANTS}
    server = engines.WarmServer(work / "warm") if os.environ.get("BENCH_SERVER") == "1" else None
    try:
        if server:
            server.__enter__()
            os.environ["SANDBOX_SERVER"] = str(server.path)  # containerd's, and so its shims' and ours
        c.start()
        for i in range(N + 1):
            for v, (handler, env) in VARIANTS.items():
                time.sleep(COOL)
                try:
                    start, execs, down = one(c, handler, env, i)
                except cri.CRIError as e:
                    hint = "" if c.pause_dirs else " (CRI_PAUSE_DIRS=1: a pause image with mount points)"
                    raise SystemExit(f"{v}: {e}{hint}") from None
                if i:
                    times[v]["start"].append(start)
                    times[v]["exec"] += execs
                    times[v]["down"].append(down)
    finally:
        problems = c.stop()
        if problems:
            print("cleanup:", problems, file=sys.stderr)
        served = None
        if server:
            served = server.served()
            server.__exit__()
        shutil.rmtree(work, ignore_errors=True)
    pause = "pause with /proc,/dev,/sys" if c.pause_dirs else "pause (/pause alone)"
    print(f"containerd {c.version} CRI, {N} pods per handler, {EXECS} execs each, interleaved; {pause}"
          + (f"; sandbox with its warm server ({served} verbs served)" if server else ""))
    print(f"{'handler':<14}{'pod start':>12}{'exec':>10}{'teardown':>12}   (median ms)")
    for v, t in times.items():
        print(f"{v:<14}{statistics.median(t['start']):>12.1f}{statistics.median(t['exec']):>10.1f}"
              f"{statistics.median(t['down']):>12.1f}")
    base = times["runc"]
    for v in VARIANTS:
        if v != "runc":
            print(f"{v} - runc: pod start {statistics.median(times[v]['start']) - statistics.median(base['start']):+.1f} ms,"
                  f" exec {statistics.median(times[v]['exec']) - statistics.median(base['exec']):+.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
