#!/usr/bin/env python3
"""The server a client starts (issue #33): `sandbox run` on a node without units, interleaved
with `runc run` of the same bundle, medians and ratios:

  runc run                      the no-GPU bundle
  sandbox run, own planner      no server, none started (SANDBOX_SERVER_IDLE=0): the launcher's
                                own `serve --once` plans it, the C executor carries it out
  sandbox run, first verb       no server listens: this verb starts one (it was stopped before)
  sandbox run, next verbs       the server that first verb started answers
  sandbox run, GPU, next verbs  the same with the 535 fixture's GPUs

Needs root. BENCH_N sets the rounds; BENCH_LOAD=K runs K busy loops beside (each setsid).
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))

import fixtures  # noqa: E402

SANDBOX = str(REPO / ".venv/bin/sandbox")


def servers(sock: Path) -> list[int]:
    """The servers that log to sock's log (a client's start writes its stdout there)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/fd/1") == f"{sock}.log":
                found.append(int(pid))
        except OSError:
            pass
    return found


def stop(sock: Path) -> None:
    for pid in servers(sock):  # (and its spare, which leaves with it)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        while os.path.exists(f"/proc/{pid}"):
            time.sleep(0.005)


def timed(cmd: list[str], env: dict) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"benchmark command failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr}")
    return (time.perf_counter() - t) * 1e3


def main() -> int:
    if os.geteuid() != 0:
        raise SystemExit("run the benchmark as root")
    fixtures.compile_project()
    n, load = int(os.environ.get("BENCH_N", "20")), int(os.environ.get("BENCH_LOAD", "0"))
    driver = fixtures.driver_535()
    work = Path(tempfile.mkdtemp(prefix="sandbox-bench-"))
    sock = work / "run" / "hook.sock"
    busy = [subprocess.Popen(["sh", "-c", "while :; do :; done"], start_new_session=True) for _ in range(load)]
    try:
        rootfs = fixtures.rootfs("debian")
        plain = fixtures.bundle(work / "plain", rootfs, ["true"])
        gpu = fixtures.bundle(work / "gpu", rootfs, ["true"], ["NVIDIA_VISIBLE_DEVICES=all"])
        state = work / "state"
        started = dict(os.environ, SANDBOX_SERVER=str(sock), SANDBOX_SERVER_IDLE="600")
        cold = dict(os.environ, SANDBOX_SERVER=str(work / "none" / "s.sock"), SANDBOX_SERVER_IDLE="0")

        def first(i):
            stop(sock)
            return timed([SANDBOX, "run", str(plain), "--root", str(state)], started)

        variants = {
            "runc run": lambda i: timed(["runc", "--root", str(state / "runc"), "run", "--bundle", str(plain),
                                         f"r{i}"], cold),
            "sandbox run, own planner": lambda i: timed([SANDBOX, "run", str(plain), "--root", str(state)], cold),
            "sandbox run, first verb (starts the server)": first,
            "sandbox run, next verbs": lambda i: timed([SANDBOX, "run", str(plain), "--root", str(state)], started),
            "sandbox run, GPU, next verbs": lambda i: timed([SANDBOX, "run", str(gpu), "--driver-root", str(driver),
                                                            "--root", str(state)], started),
        }
        results: dict[str, list[float]] = {k: [] for k in variants}
        for fn in variants.values():
            fn(-1)
        for i in range(n):
            for name, fn in variants.items():
                time.sleep(0.1)
                results[name].append(fn(i))
        if not any(": run: " in line for line in Path(f"{sock}.log").read_text().splitlines()):
            raise SystemExit("the started server served nothing")
        base = statistics.median(results["runc run"])
        print(f"server_start: N={n}, {load} busy loops beside; medians (min-max), ratio to runc run")
        for name, values in results.items():
            m = statistics.median(values)
            print(f"  {name:45s} {m:7.1f} ms ({min(values):.1f}-{max(values):.1f})  {m / base:.2f}x")
    finally:
        stop(sock)
        for p in busy:
            p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
