"""gpu-smoke: does a real GPU work in our containers? For the day a GPU host is at hand.

Runs scripts/cudasmoke.c (the CUDA driver API through dlopen("libcuda.so.1"): cuInit, the
devices and their names, memory, a PTX kernel JIT-compiled by the driver, launched and
checked) and nvidia-smi in a container, through `sandbox run` and through runc with our hook,
one line per check; then the start time of a GPU container on this driver against the same
on the fixture driver (medians, side by side).

  scripts/gpu-smoke                       the host's driver (driver root /)
  scripts/gpu-smoke --driver-root DIR     another driver root, e.g. the fixture: there the
                                          program runs up to cuInit's error
Exit 0 when every check passed. With no driver at all: one line, exit 1.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

import fixtures  # noqa: E402

from mounts.driver import discover  # noqa: E402
from mounts.errors import DriverError  # noqa: E402

SANDBOX = [str(REPO / ".venv/bin/sandbox")]
GPU_ENV = ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]


def smoke_rootfs(work: Path) -> Path:
    """fixtures.rootfs() plus cudasmoke, built here (the host's gcc and glibc)."""
    root = work / "rootfs"
    shutil.copytree(fixtures.rootfs("debian"), root, symlinks=True)
    subprocess.run(["gcc", "-O1", "-o", root / "usr/bin/cudasmoke", REPO / "scripts/cudasmoke.c", "-ldl"], check=True,
                   timeout=120)
    return root


def container(work: Path, rootfs: Path, name: str, script: str) -> Path:
    return fixtures.bundle(work / name, rootfs, ["sh", "-c", script], GPU_ENV)


def report(how: str, r: subprocess.CompletedProcess) -> bool:
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    for line in lines:
        print(f"{how}: {line}")
    return r.returncode == 0


def start_ms(bundle: Path, driver_root: str, state: Path, n: int) -> float:
    times = []
    for i in range(n):
        t = time.perf_counter()
        subprocess.run([*SANDBOX, "run", "--root", str(state), "--driver-root", driver_root, "--id", f"t{i}", str(bundle)],
                       check=True, capture_output=True, timeout=60)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--driver-root", default="/", type=lambda p: str(Path(p).resolve()))
    p.add_argument("-n", type=int, default=10, help="runs per start-time median")
    args = p.parse_args()
    try:
        inventory = discover(args.driver_root)
    except DriverError as e:
        print(f"gpu-smoke: {e}")
        return 1
    print(f"driver {inventory.version} at {inventory.root}: {len(inventory.gpus)} GPUs "
          + " ".join(f"{g.index}:{g.busid}:{g.model}" for g in inventory.gpus))
    work = Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    try:
        return _checks(args, inventory, work)
    except (subprocess.SubprocessError, OSError) as e:  # a hang or a failed step: one line
        print(f"gpu-smoke: {e}")
        return 1
    finally:
        if shutil.which("runc"):  # a runc container left by a timeout
            subprocess.run(["runc", "--root", str(work / "runc"), "delete", "--force", "smoke"], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def _checks(args, inventory, work: Path) -> int:
    rootfs = smoke_rootfs(work)
    program = "cudasmoke; echo cudasmoke exit $?; nvidia-smi -L; echo nvidia-smi exit $?"
    ok = True
    run_bundle = container(work, rootfs, "run", program)
    r = subprocess.run([*SANDBOX, "run", "--root", str(work / "state"), "--driver-root", args.driver_root,
                        "--id", "smoke", str(run_bundle)], capture_output=True, text=True, timeout=300)
    ok &= report("sandbox run", r) and "cudasmoke exit 0" in r.stdout and "nvidia-smi exit 0" in r.stdout
    if shutil.which("runc"):
        hook_bundle = container(work, rootfs, "hook", program)
        subprocess.run([*SANDBOX, "hook", "install", str(hook_bundle), "--driver-root", args.driver_root],
                       check=True, capture_output=True)
        r = subprocess.run(["runc", "--root", str(work / "runc"), "run", "--bundle", str(hook_bundle), "smoke"],
                           capture_output=True, text=True, timeout=300)
        ok &= report("runc + hook", r) and "cudasmoke exit 0" in r.stdout
    else:
        print("runc + hook: skipped (no runc on PATH)")
    true_bundle = container(work, rootfs, "true", "true")
    here = start_ms(true_bundle, args.driver_root, work / "t1", args.n)
    try:
        fixture_root = str(fixtures.driver_535())  # Debian's packages: needs its archive
    except (SystemExit, subprocess.SubprocessError, OSError) as e:
        print(f"start (sandbox run, GPU container, /bin/true, median of {args.n}): {here:.1f} ms on "
              f"{inventory.root}; the fixture driver could not be built here ({e})")
    else:
        fixture = start_ms(true_bundle, fixture_root, work / "t2", args.n)
        print(f"start (sandbox run, GPU container, /bin/true, median of {args.n}): {here:.1f} ms on "
              f"{inventory.root}, {fixture:.1f} ms on the fixture ({here / fixture:.2f}x)")
    print("gpu-smoke: " + ("every check passed" if ok else "FAILED"))
    return 0 if ok else 1

if __name__ == "__main__":
    sys.exit(main())
