#!/usr/bin/env python3
"""Benchmark container start, side by side in one run (interleaved), medians and ratios:

  sandbox run  busybox bundle with GPUs (compute,utility, all GPUs of the 535 fixture)
  sandbox run  the same bundle without GPUs (each also through the warm server: "served")
  runc run     the same bundle without GPUs
  runc run     with `sandbox hook` as createRuntime hook (GPUs), and with a no-op hook
  sandbox run  with/without GPUs on an image whose ld.so.cache has 1400 entries
  raw mounts   the plan's bind mounts done by a minimal C loop (scripts/bench/rawmounts.c)
  isolation    sandbox run and runc run of the no-GPU bundle with an engine's default seccomp
               profile, a memory and a pids limit, against the same bundle without them

plus, from traced GPU runs: the gofer's mount phase against the raw loop, the supervisor's
peak RSS, and the phase table of one GPU start. Needs root. BENCH_N sets the run count.
"""

from __future__ import annotations

import atexit
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
sys.path.insert(0, str(REPO))

import engines  # noqa: E402
import fixtures  # noqa: E402

PY = str(REPO / ".venv/bin/python")
SANDBOX = [str(REPO / ".venv/bin/sandbox")]  # what engines run


# A pause before each timed run: back to back, a run's first cgroup.procs write finds the
# kernel's attach lock warm from the previous run's (an RCU grace period, 10-14 ms here, saved
# or not by whatever ran just before: cross-talk between the variants). After the pause
# every run finds it cold, as on a node that starts a container now and then.
COOL = 0.1


COLD = dict(os.environ, SANDBOX_SERVER="")  # the launcher's own planner, whatever listens at the default socket


def timed(cmd: list[str], env: dict | None = None) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env or COLD)
    dt = (time.perf_counter() - t) * 1e3
    if r.returncode != 0:
        raise SystemExit(f"benchmark command failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr}")
    return dt


def raw_script(plan: dict, rootfs: Path) -> str:
    """The mounts `sandbox run` makes for the plan, as rawmounts.c lines: the root's private
    overlay, a tmpfs on /dev (the spec's), the directories the targets need, every bind."""
    letters = {"ro": "r", "nosuid": "n", "nodev": "d", "noexec": "x"}
    root = os.path.realpath(rootfs)
    binds, dirs = [], set()
    for a in plan["actions"]:
        if a["kind"] not in ("library", "binary", "firmware", "device", "ipc"):
            continue
        parent = os.path.realpath(root + os.path.dirname(a["target"]))
        dirs.add(parent)
        flags = "".join(letters[f] for f in a["flags"]) or "-"
        binds.append(f"B {a['source']} {parent}/{os.path.basename(a['target'])} {flags}")
    lines = [f"O {root}", f"T {root}/dev"] + [f"D {d}" for d in sorted(dirs)] + binds
    return "\n".join(lines) + "\n"


def main() -> int:
    if os.geteuid() != 0:
        raise SystemExit("run the benchmark as root")
    fixtures.compile_project()
    n = int(os.environ.get("BENCH_N", "20"))
    driver = fixtures.driver_535()
    work = Path(tempfile.mkdtemp(prefix="sandbox-bench-"))
    try:
        return _bench(n, driver, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _bench(n: int, driver: Path, work: Path) -> int:
    gpu_env = ["NVIDIA_VISIBLE_DEVICES=all"]
    rootfs = fixtures.rootfs("debian")
    gpu = fixtures.bundle(work / "gpu", rootfs, ["true"], gpu_env)
    plain = fixtures.bundle(work / "plain", rootfs, ["true"])
    big = fixtures.fat_rootfs()  # an ld.so.cache of 1400 libraries
    big_gpu = fixtures.bundle(work / "big-gpu", big, ["true"], gpu_env)
    big_plain = fixtures.bundle(work / "big-plain", big, ["true"])
    hooked = fixtures.bundle(work / "hooked", rootfs, ["true"], gpu_env)
    hook_trace = work / "hook-trace.json"
    subprocess.run(SANDBOX + ["hook", "install", str(hooked), "--driver-root", str(driver), "--trace",
                              str(hook_trace)], check=True, stdout=subprocess.DEVNULL)
    server_sock = work / "run" / "hook.sock"
    warm = fixtures.bundle(work / "warm", rootfs, ["true"], gpu_env)
    big_hooked = fixtures.bundle(work / "big-hooked", big, ["true"], gpu_env)
    big_warm = fixtures.bundle(work / "big-warm", big, ["true"], gpu_env)
    big_none = fixtures.bundle(work / "big-none", big, ["true"], gpu_env)
    for b, extra in ((warm, ["--server", str(server_sock)]), (big_hooked, []),
                     (big_warm, ["--server", str(server_sock)])):
        subprocess.run(SANDBOX + ["hook", "install", str(b), "--driver-root", str(driver), *extra], check=True,
                       stdout=subprocess.DEVNULL)
    server = engines.WarmServer(work, server_sock).__enter__()
    atexit.register(server.__exit__)  # whatever happens below
    noop = fixtures.bundle(work / "noop", rootfs, ["true"], gpu_env)
    spec = json.loads((noop / "config.json").read_text())
    spec["hooks"] = {"createRuntime": [{"path": "/bin/true", "args": ["true"]}]}
    (noop / "config.json").write_text(json.dumps(spec))

    isolated = fixtures.bundle(work / "isolated", rootfs, ["true"])
    spec = json.loads((isolated / "config.json").read_text())
    spec["linux"]["seccomp"] = fixtures.engine_seccomp_profile()
    spec["linux"]["resources"] = {"devices": [{"allow": False, "access": "rwm"}],
                                  "memory": {"limit": 67108864}, "pids": {"limit": 64}}
    spec["process"]["noNewPrivileges"] = True
    (isolated / "config.json").write_text(json.dumps(spec))

    raw = work / "rawmounts"
    subprocess.run(["gcc", "-O2", "-o", str(raw), str(REPO / "scripts/bench/rawmounts.c")], check=True)
    plan = json.loads(subprocess.run(SANDBOX + ["plan", str(gpu), "--driver-root", str(driver), "--json"],
                                     check=True, capture_output=True, text=True).stdout)
    binds = raw_script(plan, rootfs)

    state = work / "state"
    served = dict(os.environ, SANDBOX_SERVER=str(server_sock))  # `sandbox run` through the same server
    variants = {
        "sandbox run, GPU": lambda i: timed(SANDBOX + ["run", str(gpu), "--driver-root", str(driver),
                                                       "--root", str(state)]),
        "sandbox run, no GPU": lambda i: timed(SANDBOX + ["run", str(plain), "--root", str(state)]),
        "sandbox run, GPU, served": lambda i: timed(SANDBOX + ["run", str(gpu), "--driver-root", str(driver),
                                                               "--root", str(state)], served),
        "sandbox run, no GPU, served": lambda i: timed(SANDBOX + ["run", str(plain), "--root", str(state)], served),
        "runc run, no GPU": lambda i: timed(["runc", "--root", str(state / "runc"), "run", "--bundle",
                                             str(plain), f"b{i}"]),
        "runc run, GPU bundle, no hook": lambda i: timed(["runc", "--root", str(state / "runc"), "run",
                                                          "--bundle", str(gpu), f"g{i}"]),
        "runc run + sandbox hook, GPU": lambda i: timed(["runc", "--root", str(state / "runc"), "run",
                                                         "--bundle", str(hooked), f"h{i}"]),
        "runc run + no-op hook": lambda i: timed(["runc", "--root", str(state / "runc"), "run", "--bundle",
                                                  str(noop), f"n{i}"]),
        "runc run + sandbox hook, warm server, GPU": lambda i: timed(
            ["runc", "--root", str(state / "runc"), "run", "--bundle", str(warm), f"w{i}"]),
        "runc run, 1400-lib image, no hook": lambda i: timed(
            ["runc", "--root", str(state / "runc"), "run", "--bundle", str(big_none), f"bn{i}"]),
        "runc run + sandbox hook, 1400-lib image": lambda i: timed(
            ["runc", "--root", str(state / "runc"), "run", "--bundle", str(big_hooked), f"bh{i}"]),
        "runc run + sandbox hook, warm server, 1400-lib image": lambda i: timed(
            ["runc", "--root", str(state / "runc"), "run", "--bundle", str(big_warm), f"bw{i}"]),
        "sandbox run, no GPU, seccomp + limits": lambda i: timed(SANDBOX + ["run", str(isolated), "--root",
                                                                           str(state)]),
        "runc run, no GPU, seccomp + limits": lambda i: timed(["runc", "--root", str(state / "runc"), "run",
                                                               "--bundle", str(isolated), f"s{i}"]),
        "sandbox run, GPU, 1400-entry image cache": lambda i: timed(
            SANDBOX + ["run", str(big_gpu), "--driver-root", str(driver), "--root", str(state)]),
        "sandbox run, no GPU, 1400-entry image cache": lambda i: timed(
            SANDBOX + ["run", str(big_plain), "--root", str(state)]),
    }
    results: dict[str, list[float]] = {k: [] for k in variants}
    raw_ms: list[float] = []
    for fn in variants.values():  # warm-up
        fn(-1)
    for i in range(n):
        for name, fn in variants.items():
            time.sleep(COOL)
            results[name].append(fn(i))
        out = subprocess.run([str(raw)], input=binds, capture_output=True, text=True, check=True).stdout
        raw_ms.append(int(out) / 1e6)

    # traced runs: time to exec (start of the run verb to the container's execve, from the trace:
    # the start latency, free of the event loop's import that follows it), the GPU mount
    # phase, the supervisor's peak memory, and one phase table
    trace = work / "trace.json"
    traced = {"GPU": gpu, "no GPU": plain, "GPU, 1400-entry image": big_gpu, "no GPU, 1400-entry image": big_plain,
              "no GPU, seccomp + limits": isolated}
    isolation_spans: dict[str, list[float]] = {"seccomp compile": [], "cgroup": [], "device rules": []}
    to_exec: dict[str, list[float]] = {k: [] for k in traced}
    launch_to_exec: dict[str, list[float]] = {k: [] for k in traced}
    mount_ms, rss = [], []
    for _ in range(n):
        for name, b in traced.items():
            launched = time.monotonic_ns()
            timed(SANDBOX + ["run", str(b), "--driver-root", str(driver), "--root", str(state), "--trace", str(trace)])
            data = json.loads(trace.read_text())
            events = data["traceEvents"]
            spans = {e["name"]: e for e in events if e["ph"] == "X"}
            to_exec[name].append(spans["exec"]["ts"] / 1e3)
            launch_to_exec[name].append((data["otherData"]["origin_monotonic_ns"] - launched) / 1e6
                                        + spans["exec"]["ts"] / 1e3)
            if name == "no GPU, seccomp + limits":
                for key, values in isolation_spans.items():
                    values.append(sum(e["dur"] for e in events if e["ph"] == "X" and e["name"] == key) / 1e3)
            if name == "GPU":
                mount_ms.append(sum(e["dur"] for e in events if e["ph"] == "X" and e["name"].startswith("gpu ")
                                    and e["name"] not in ("gpu ld.so.cache", "gpu procfs")) / 1e3)
                rss.append(spans["supervisor done"]["args"]["maxrss_kib"] / 1024)
                shutil.copy(trace, work / "gpu-trace.json")

    server.__exit__()
    runs = server.log.read_text().count(": run: ")
    if runs != 2 * (n + 1):  # (the warm-up's too)
        raise SystemExit(f"the 'served' runs were not all served: {runs} of {2 * (n + 1)} in {work}/server.log")
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"container start, median of {n} interleaved runs (wall ms, whole process):")
    for k, v in med.items():
        print(f"  {k:45s} {v:8.2f}")
    print(f"  {'raw bind+remount loop of the plan (' + str(binds.count(chr(10))) + ' binds)':45s} "
          f"{statistics.median(raw_ms):8.2f}")
    ex = {k: statistics.median(v) for k, v in to_exec.items()}
    lx = {k: statistics.median(v) for k, v in launch_to_exec.items()}
    print(f"time to the container's execve (traced runs, median of {n}), ms:")
    print(f"  {'':45s} {'from launch':>11s} {'from fork':>10s}")
    for k, v in ex.items():
        print(f"  {k:45s} {lx[k]:11.2f} {v:10.2f}")
    print("derived:")
    print(f"  GPU support adds to time to exec                     {ex['GPU'] - ex['no GPU']:7.2f} ms"
          f" (from launch: {lx['GPU'] - lx['no GPU']:.2f} ms)")
    print(f"  ... on the 1400-entry image                          "
          f"{ex['GPU, 1400-entry image'] - ex['no GPU, 1400-entry image']:7.2f} ms")
    print(f"  GPU support adds to sandbox run, whole process       {med['sandbox run, GPU'] - med['sandbox run, no GPU']:7.2f} ms")
    print(f"  ... on the 1400-entry image                          "
          f"{med['sandbox run, GPU, 1400-entry image cache'] - med['sandbox run, no GPU, 1400-entry image cache']:7.2f} ms")
    print(f"  sandbox hook adds to runc run (hook - no hook)       {med['runc run + sandbox hook, GPU'] - med['runc run, GPU bundle, no hook']:7.2f} ms")
    print(f"  sandbox hook adds to runc run (hook - no-op hook)    {med['runc run + sandbox hook, GPU'] - med['runc run + no-op hook']:7.2f} ms")
    print(f"  ... with the warm hook server (hook - no hook)       "
          f"{med['runc run + sandbox hook, warm server, GPU'] - med['runc run, GPU bundle, no hook']:7.2f} ms")
    print(f"  ... 1400-lib image (hook - no hook)                  "
          f"{med['runc run + sandbox hook, 1400-lib image'] - med['runc run, 1400-lib image, no hook']:7.2f} ms"
          f" (warm server: {med['runc run + sandbox hook, warm server, 1400-lib image'] - med['runc run, 1400-lib image, no hook']:.2f} ms)")
    print(f"  sandbox run, no GPU / runc run, no GPU               {med['sandbox run, no GPU'] / med['runc run, no GPU']:7.2f} x")
    print(f"  ... served by the warm server                        "
          f"{med['sandbox run, no GPU, served'] / med['runc run, no GPU']:7.2f} x"
          f" (GPU: {med['sandbox run, GPU, served'] / med['runc run, no GPU']:.2f} x)")
    print(f"  seccomp + limits add to sandbox run                  "
          f"{med['sandbox run, no GPU, seccomp + limits'] - med['sandbox run, no GPU']:7.2f} ms"
          f" (to its execve: {ex['no GPU, seccomp + limits'] - ex['no GPU']:.2f} ms)")
    print(f"  seccomp + limits add to runc run                     "
          f"{med['runc run, no GPU, seccomp + limits'] - med['runc run, no GPU']:7.2f} ms")
    print("  of which, in sandbox's trace (medians): " + ", ".join(
        f"{k} {statistics.median(v):.2f} ms" for k, v in isolation_spans.items()))
    mm, rm = statistics.median(mount_ms), statistics.median(raw_ms)
    print(f"  gofer bind phases (traced runs) / raw loop           {mm:5.2f} / {rm:5.2f} ms = {mm / rm:.2f} x")
    print(f"  supervisor peak RSS                                  {statistics.median(rss):7.1f} MiB")
    print("phase table of the last traced GPU start:")
    sys.stdout.write(subprocess.run(SANDBOX + ["trace", str(work / "gpu-trace.json")], capture_output=True,
                                    text=True).stdout)
    print("phase table of the last hook run (inside runc's createRuntime):")
    sys.stdout.write(subprocess.run(SANDBOX + ["trace", str(hook_trace)], capture_output=True, text=True).stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
