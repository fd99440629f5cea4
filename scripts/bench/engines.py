#!/usr/bin/env python3
"""What a container costs through each engine with `sandbox` as its OCI runtime, against runc,
side by side in one run (interleaved), medians:

  ENGINE run --rm IMAGE true    runc | sandbox | sandbox with NVIDIA_VISIBLE_DEVICES=all
                                | scripts/sandbox-runc (runc for it: no GPU asked) | the same with GPUs
                                | runc and sandbox with GPUs on an image with 1400 libraries
                                  in its ld.so.cache (fixtures.fat_rootfs)
  for podman, containerd (ctr) and dockerd, each started privately (scripts/engines.py)

and each runtime verb alone on one bundle (create, start, state, kill, delete): sandbox
against runc, and sandbox with its warm server (`sandbox serve`: the verbs that start no
process served by it), there also on a GPU bundle (issue 33: a served create with GPUs within
10 ms of one without). Needs root. BENCH_N sets the run count (default 20); BENCH_ENGINES the
engines; BENCH_SERVER=1 has the engines' sandbox use a warm server too, at its default socket
(the bench then runs in a private mount namespace with a /run of its own).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engines  # noqa: E402
import fixtures  # noqa: E402

N = int(os.environ.get("BENCH_N", "20"))


def timed(cmd: list[str], **kw) -> float:
    """Wall time of ``cmd`` in ms. Its stderr goes to a file, not a pipe: a created
    container's init inherits it, and a pipe would only end when the container does."""
    with tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=err, **kw)
        dt = (time.perf_counter() - t) * 1e3
        if r.returncode != 0:
            err.seek(0)
            raise SystemExit(f"benchmark command failed ({r.returncode}): {' '.join(cmd)}\n{err.read()}")
    return dt


# A pause before each container: back to back, one's first cgroup.procs write finds the
# kernel's attach lock warm from the previous one's (an RCU grace period, 10-14 ms here, saved
# or not: cross-talk between the variants); after it each finds it cold.
COOL = 0.1


def bench_engine(name: str, work: Path) -> None:
    eng = engines.ENGINES[name](work / name, fixtures.driver_535())
    eng.start(fixtures.image_archive())
    eng.load(fixtures.image_archive(fat=True))
    fat = dict(image=fixtures.FAT_IMAGE)
    variants = {"runc": dict(runtime="runc"), "sandbox": dict(runtime="sandbox"),
                "sandbox+gpu": dict(runtime="sandbox", gpu=True), "wrapper": dict(runtime="wrapper"),
                "wrapper+gpu": dict(runtime="wrapper", gpu=True), "runc fat": dict(runtime="runc", **fat),
                "sandbox+gpu fat": dict(runtime="sandbox", gpu=True, **fat)}
    times: dict[str, list[float]] = {v: [] for v in variants}
    try:
        for i in range(N + 1):  # the first round warms caches and is dropped
            for v, kw in variants.items():
                time.sleep(COOL)
                dt = timed(eng.run(f"b{i}{v.replace('+', '').replace(' ', '')}", "true", **kw))
                if i:
                    times[v].append(dt)
    finally:
        eng.stop()
    med = {v: statistics.median(t) for v, t in times.items()}
    print(f"{name:<11} " + "  ".join(f"{v} {m:6.1f} ms" for v, m in med.items())
          + f"   over runc: sandbox {med['sandbox'] - med['runc']:+.1f} ms, gpu {med['sandbox+gpu'] - med['runc']:+.1f} ms;"
          f" sandbox-runc {med['wrapper'] - med['runc']:+.1f} ms, gpu {med['wrapper+gpu'] - med['runc']:+.1f} ms;"
          f" fat image: gpu {med['sandbox+gpu fat'] - med['runc fat']:+.1f} ms over its runc")


def bench_verbs(work: Path) -> None:
    """create / start / state / kill / delete on one no-GPU bundle (`sleep` as the process),
    and served on a GPU one (NVIDIA_VISIBLE_DEVICES=all, the 535 fixture)."""
    plain = fixtures.bundle(work / "verbs", fixtures.rootfs("debian"), ["sleep", "60"])
    gpu = fixtures.bundle(work / "verbs-gpu", fixtures.rootfs("debian"), ["sleep", "60"], ["NVIDIA_VISIBLE_DEVICES=all"])
    runtimes = {"runc": [engines.RUNC, "--root", str(work / "runc-state")],
                "sandbox": [engines.SANDBOX, "--root", str(work / "sandbox-state")],
                "sandbox+server": [engines.SANDBOX, "--root", str(work / "served-state")],
                "sandbox+server+gpu": [engines.SANDBOX, "--root", str(work / "served-gpu-state"), "--driver-root",
                                       str(fixtures.driver_535())]}
    server = engines.WarmServer(work / "verbs-server")
    verbs = ("create", "start", "state", "kill", "delete")
    times: dict[tuple[str, str], list[float]] = {(r, v): [] for r in runtimes for v in verbs}

    def run_round(i: int) -> None:
        for r, base in runtimes.items():
            time.sleep(COOL)
            cid = f"v{i}"
            bundle = gpu if r.endswith("+gpu") else plain
            steps = {"create": [*base, "create", "--bundle", str(bundle), cid], "start": [*base, "start", cid],
                     "state": [*base, "state", cid], "kill": [*base, "kill", cid, "KILL"],
                     "delete": [*base, "delete", "--force", cid]}
            env = dict(os.environ, SANDBOX_SERVER=str(server.path) if r.startswith("sandbox+server") else "")
            for v in verbs:
                dt = timed(steps[v], stdin=subprocess.DEVNULL, env=env)
                if i:
                    times[(r, v)].append(dt)
    with server:
        for i in range(N + 1):
            run_round(i)
        served = server.served()
        declined = [line for line in server.log.read_text().splitlines() if ": declined: " in line]
    if served != 2 * len(verbs) * (N + 1) or declined:  # (else "served" figures are Python's)
        raise SystemExit(f"the warm server served {served} of {2 * len(verbs) * (N + 1)} verbs; declined: {declined}")
    print(f"  (the warm server served all {served} verbs)")
    for v in verbs:
        med = {r: statistics.median(times[(r, v)]) for r in runtimes}
        print(f"  {v:<7} sandbox {med['sandbox']:6.1f} ms   with server {med['sandbox+server']:6.1f} ms   "
              f"runc {med['runc']:6.1f} ms   {med['sandbox'] - med['runc']:+6.1f} / "
              f"{med['sandbox+server'] - med['runc']:+6.1f} ms   served GPU {med['sandbox+server+gpu']:6.1f} ms "
              f"({med['sandbox+server+gpu'] - med['sandbox+server']:+.1f} over served without)")


DEFAULT_SOCKET = Path("/run/gpu-sandbox/hook.sock")


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)
    if os.geteuid() != 0:
        raise SystemExit("needs root")
    served = os.environ.get("BENCH_SERVER") == "1"
    if served and os.environ.get("SANDBOX_BENCH_NS") != "1":
        # The engines' warm server at its default socket, as installed: podman gives the
        # runtime a fixed environment for start, state, kill and delete (SANDBOX_SERVER
        # never reaches them). So once more, in a private mount namespace with its own /run.
        return subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, __file__],
                              env=dict(os.environ, SANDBOX_BENCH_NS="1")).returncode
    if served:
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/run"], check=True)
        DEFAULT_SOCKET.parent.mkdir(mode=0o700)
    fixtures.compile_project()
    names = os.environ.get("BENCH_ENGINES", "podman containerd docker").split()
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        work = Path(tmp)
        print(f"runtime verbs alone (median of {N}):")
        bench_verbs(work)
        print(f"\n`run --rm IMAGE true` through each engine (median of {N}, interleaved"
              f"{'; sandbox with its warm server at its default socket' if served else ''}):")
        server = engines.WarmServer(work / "engine-server", DEFAULT_SOCKET)
        if served:
            server.__enter__()
        try:
            for name in names:
                bench_engine(name, work)
        finally:
            if served:
                declined = sorted({line.split(": declined: ")[1] for line in server.log.read_text().splitlines()
                                   if ": declined: " in line})
                print(f"(the warm server served {server.served()} verbs; declined: {declined or 'none'})")
                server.__exit__()
    return 0


if __name__ == "__main__":
    sys.exit(main())
