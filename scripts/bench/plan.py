#!/usr/bin/env python3
"""Benchmark the plan: `sandbox plan` as a whole process (cold, interpreter included) and
the in-process part alone (discover + plan, files in the page cache), on the real 535
fixture and on synthetic driver roots of 10, 100 and 1000 libraries. Medians."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))

import fixtures  # noqa: E402

from mounts.bundle import load_bundle  # noqa: E402
from mounts.driver import discover  # noqa: E402
from mounts.layout import layout_of  # noqa: E402
from mounts.plan import compute_plan  # noqa: E402
from mounts.request import gpu_request  # noqa: E402


def median_ms(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def in_process(bundle: Path, driver: Path, n: int) -> tuple[float, int]:
    b = load_bundle(str(bundle))

    def once():
        return compute_plan(gpu_request(b.spec), discover(str(driver)), layout_of(b.rootfs))

    plan = once()
    libs = sum(1 for a in plan.actions if a.kind == "library")
    return median_ms(once, n), libs


def main() -> int:
    fixtures.compile_project()
    n = int(os.environ.get("BENCH_N", "30"))
    bundle = fixtures.bundle(fixtures.CACHE / "bundles/bench-plan", fixtures.rootfs("debian"), ["true"],
                             ["NVIDIA_VISIBLE_DEVICES=all"])
    driver = fixtures.driver_535()
    py = str(REPO / ".venv/bin/python")
    cmd = [py, "-m", "sandbox.cli", "plan", str(bundle), "--driver-root", str(driver), "--json"]
    bare = median_ms(lambda: subprocess.run([py, "-c", "pass"], check=True), n)
    whole = median_ms(lambda: subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL), n)
    imports = median_ms(lambda: subprocess.run(
        [py, "-c", "import sandbox.cli, sandbox.verbs.plan, mounts.driver, mounts.plan"], check=True), n)
    ms, libs = in_process(bundle, driver, n * 10)
    print(f"535 fixture ({libs} libraries, compute+utility, 2 GPUs), median of {n} runs:")
    print(f"  sandbox plan --json, whole process  {whole:7.2f} ms")
    print(f"    python -c pass (interpreter)      {bare:7.2f} ms")
    print(f"    interpreter + our imports         {imports:7.2f} ms")
    print(f"  in-process discover + plan          {ms:7.3f} ms")
    print("synthetic driver roots (in-process discover + plan):")
    rows = []
    for size in (10, 100, 1000):
        root = fixtures.synthetic_driver(size)
        ms, libs = in_process(bundle, root, max(5, 300 // size))
        rows.append((size, ms))
        print(f"  {libs:5d} libraries  {ms:8.3f} ms  {ms * 1e3 / libs:6.1f} us/library")
    slope = (rows[-1][1] - rows[-2][1]) * 1e3 / (rows[-1][0] - rows[-2][0])
    print(f"  marginal cost 100 -> 1000: {slope:.1f} us/library")
    return 0


if __name__ == "__main__":
    sys.exit(main())
