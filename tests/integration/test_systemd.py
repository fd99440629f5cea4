"""The systemd cgroup driver against a real systemd 252 (scripts/systemd-host: PID 1 of
private namespaces on this host's own root): the container in a transient scope unit
with its limits as properties, GPUs through its device rules, the unit gone after delete
and after a run; the hook inside runc's own systemd driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import CLI

REPO = Path(__file__).resolve().parents[2]
HOST = str(REPO / "scripts" / "systemd-host")

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root"),
              pytest.mark.skipif(not os.path.exists("/lib/systemd/systemd"), reason="needs systemd installed")]

PY = sys.executable


def under_systemd(script: str, timeout: float = 120) -> subprocess.CompletedProcess:
    r = subprocess.run([HOST, "bash", "-ec", script], capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if r.returncode == 125:
        pytest.fail(f"systemd could not be booted: {r.stderr[-2000:]}")
    return r


def _bundle(make_bundle, args, env=(), path="system.slice:demo:c1", **linux):
    bundle = make_bundle(args, list(env))
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"]["cgroupsPath"] = path
    spec["linux"]["resources"] = {"memory": {"limit": 64 << 20}, "pids": {"limit": 100},
                                  "devices": [{"allow": False, "access": "rwm"}]}
    spec["linux"].update(linux)
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


def test_a_container_is_a_scope_with_its_limits(make_bundle, tmp_path):
    bundle = _bundle(make_bundle, ["sleep", "300"])
    sb = f"{CLI[0]} --systemd-cgroup --root {tmp_path}/s"
    r = under_systemd(f"""
        {sb} run -d -b {bundle} c1 </dev/null >/dev/null 2>&1
        systemctl show demo-c1.scope -p ActiveState -p MemoryLimit -p TasksMax -p ControlGroup -p Delegate
        echo seen=$({sb} exec c1 cat /proc/self/cgroup | grep -c demo-c1.scope)
        {sb} update --memory 96m c1
        systemctl show demo-c1.scope -p MemoryLimit
        cat /sys/fs/cgroup/memory/system.slice/demo-c1.scope/memory.limit_in_bytes
        {sb} delete --force c1
        systemctl show demo-c1.scope -p LoadState
        ls /sys/fs/cgroup/memory/system.slice | grep -c demo || true
        ls /sys/fs/cgroup/cpuset/system.slice 2>/dev/null | grep -c demo || true
    """)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    assert {"ActiveState=active", f"MemoryLimit={64 << 20}", "TasksMax=100", "Delegate=yes",
            "ControlGroup=/system.slice/demo-c1.scope"} <= set(lines), r.stdout
    assert f"MemoryLimit={96 << 20}" in lines and str(96 << 20) in lines, r.stdout
    assert "LoadState=not-found" in lines and lines[-2:] == ["0", "0"], r.stdout
    assert "seen=0" not in lines and any(w.startswith("seen=") for w in lines), r.stdout  # the container sees it


def test_a_gpu_container_under_the_systemd_driver(make_bundle, driver_root, tmp_path):
    """The fixture's nodes are real char devices with no driver: opening one the rules
    allow fails with ENXIO, one they deny with EPERM (as in test_cgroups.py)."""
    probe = ("head -c1 /dev/nvidia0 2>&1 | grep -o 'No such device or address' || echo denied; "
             "mknod /dev/m c 1 1 && (head -c1 /dev/m >/dev/null 2>&1 && echo MEM || echo mem-denied)")
    bundle = _bundle(make_bundle, ["sh", "-c", probe], ["NVIDIA_VISIBLE_DEVICES=all"], path="system.slice:demo:g1")
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["capabilities"] = {k: ["CAP_MKNOD"] for k in ("bounding", "effective", "permitted")}
    (bundle / "config.json").write_text(json.dumps(spec))
    r = under_systemd(f"""
        {CLI[0]} --systemd-cgroup --root {tmp_path}/s --driver-root {driver_root} run {bundle} --id g1
        systemctl show demo-g1.scope -p LoadState
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["No", "such", "device", "or", "address", "mem-denied", "LoadState=not-found"], r.stdout


def test_an_update_never_denies_the_running_container_its_devices(make_bundle, tmp_path):
    """systemd re-applies a unit's devices to a v1 devices controller on any property change,
    denying everything first: the container, looping on /dev/null meanwhile, got EPERM from 3
    of 6 updates until update froze it around SetUnitProperties (as runc does). (A race: 8
    updates without the freeze passed 3 times in 8; 24 make that rare.)"""
    loop = ("end=$(( $(date +%s) + 7 )); while [ $(date +%s) -lt $end ]; do echo -n > /dev/null || echo DENIED; "
            "done; echo done")
    bundle = _bundle(make_bundle, ["sh", "-c", loop], path="system.slice:demo:u1")
    sb = f"{CLI[0]} --systemd-cgroup --root {tmp_path}/s"
    out = tmp_path / "out"
    r = under_systemd(f"""
        {sb} run -d -b {bundle} u1 </dev/null >{out} 2>&1
        sleep 0.3
        for i in $(seq 1 24); do {sb} update --memory $((80 + i))m u1; done
        for i in $(seq 1 60); do {sb} state u1 | grep -q stopped && break; sleep 0.2; done
        {sb} delete --force u1
    """)
    assert r.returncode == 0, r.stderr
    lines = out.read_text().split()
    assert lines[-1:] == ["done"] and "DENIED" not in lines, out.read_text()


def test_the_hook_inside_runcs_systemd_driver(make_bundle, driver_root, tmp_path):
    from tests.integration.test_hook import SCRIPT, check_gpu_output, install

    bundle = _bundle(make_bundle, ["sh", "-c", SCRIPT], ["NVIDIA_VISIBLE_DEVICES=all"], path="system.slice:runc:h1")
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"]["resources"]["devices"] = [{"allow": False, "access": "rwm"}]
    (bundle / "config.json").write_text(json.dumps(spec))
    install(bundle, driver_root)
    r = under_systemd(f"runc --systemd-cgroup --root {tmp_path}/r run -b {bundle} h1")
    assert r.returncode == 0, r.stderr
    check_gpu_output(r.stdout + r.stderr)


def test_bad_paths_are_one_line(make_bundle, tmp_path):
    bundle = _bundle(make_bundle, ["true"], path="demo")
    r = under_systemd(f"{CLI[0]} --systemd-cgroup --root {tmp_path}/s run {bundle} --id b1 || echo rc=$?")
    assert 'expected "slice:prefix:name" for systemd cgroups' in r.stderr and "rc=2" in r.stdout, (r.stdout, r.stderr)


def test_limits_and_device_rules_as_runcs_systemd_driver(make_bundle, tmp_path):
    """test_cgroups.py's probe (memory and pids limits read inside, a disk and /dev/mem
    denied to a container holding CAP_MKNOD, /dev/null usable), under both runtimes'
    systemd drivers on the same bundle: the same lines."""
    from tests.integration.test_cgroups import PROBE

    bundle = _bundle(make_bundle, ["sh", "-c", PROBE], path="system.slice:demo:i1")
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["capabilities"] = {k: ["CAP_MKNOD", "CAP_DAC_OVERRIDE"] for k in ("bounding", "effective",
                                                                                        "permitted")}
    spec["mounts"].append({"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
                           "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]})
    (bundle / "config.json").write_text(json.dumps(spec))
    r = under_systemd(f"""
        echo ours; {CLI[0]} --systemd-cgroup --root {tmp_path}/s run {bundle} --id i1
        echo runc; runc --systemd-cgroup --root {tmp_path}/r run -b {bundle} i1
        systemctl show demo-i1.scope -p LoadState
    """)
    assert r.returncode == 0, r.stderr
    ours, theirs = r.stdout.split("runc\n")
    expected = [str(64 << 20), "100", "disk-denied", "mem-denied", "null-ok"]
    assert ours.split()[1:] == expected, r.stdout
    assert theirs.split()[:5] == expected and theirs.split()[5] == "LoadState=not-found", r.stdout


def test_a_served_create_under_the_systemd_driver(make_bundle, tmp_path):
    """create through the warm server: the launcher goes into the container's scope before
    it forks pid 1, which is then the scope's, with its limits; delete removes the unit."""
    launcher = REPO / ".venv/bin/sandbox"
    if not launcher.is_file() or launcher.read_bytes()[:4] != b"\x7fELF":
        pytest.skip("the C launcher is not built (scripts/setup builds it)")
    bundle = _bundle(make_bundle, ["sleep", "300"], path="system.slice:demo:w1")
    sock = tmp_path / "srv.sock"
    sb = f"{launcher} --systemd-cgroup --root {tmp_path}/s"
    r = under_systemd(f"""
        {launcher} serve --server {sock} >{tmp_path}/srv.log 2>&1 &
        for i in $(seq 200); do [ -S {sock} ] && break; sleep 0.05; done
        export SANDBOX_SERVER={sock}
        {sb} create -b {bundle} w1 </dev/null >/dev/null 2>&1
        systemctl show demo-w1.scope -p ActiveState -p MemoryLimit -p TasksMax
        pid=$({sb} state w1 | sed -n 's/.*"pid": \\([0-9]*\\).*/\\1/p')
        echo scope=$(grep -c demo-w1.scope /proc/$pid/cgroup)
        {sb} start w1
        {sb} delete --force w1
        systemctl show demo-w1.scope -p LoadState
        kill $!
    """)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    log = (tmp_path / "srv.log").read_text()
    assert "sandbox serve: create: " in log and "declined" not in log, log
    assert {"ActiveState=active", f"MemoryLimit={64 << 20}", "TasksMax=100", "LoadState=not-found"} <= set(lines), \
        r.stdout
    assert any(w.startswith("scope=") and w[6:].isdigit() and int(w[6:]) > 0 for w in lines), r.stdout


def test_a_resize_with_a_swap_limit_under_the_systemd_driver(make_bundle, tmp_path):
    """kubelet's resize under runc's systemd driver on v1: MemoryLimit on the unit (systemd's
    own write of it, unordered, is refused where it would pass memory+swap), then the files
    in the order the kernel takes them; a failed update (a memory limit below the 20 MiB the
    container holds in its /dev/shm, after memory+swap was raised) puts back the files and
    the unit's MemoryLimit."""
    fill = "head -c 20971520 /dev/zero > /dev/shm/fill && exec sleep 300"
    bundle = _bundle(make_bundle, ["sh", "-c", fill], path="system.slice:demo:r1")
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"]["resources"]["memory"] = {"limit": 64 << 20, "swap": 64 << 20}
    (bundle / "config.json").write_text(json.dumps(spec))
    sb = f"{CLI[0]} --systemd-cgroup --root {tmp_path}/s"
    m = "/sys/fs/cgroup/memory/system.slice/demo-r1.scope"
    show = f"echo $(cat {m}/memory.limit_in_bytes {m}/memory.memsw.limit_in_bytes) " \
           "$(systemctl show demo-r1.scope -p MemoryLimit --value)"
    r = under_systemd(f"""
        {sb} run -d -b {bundle} r1 </dev/null >/dev/null 2>&1
        for i in $(seq 1 100); do [ $(cat {m}/memory.usage_in_bytes) -ge 20971520 ] && break; sleep 0.05; done
        {show}
        echo '{{"memory": {{"limit": 134217728, "swap": 134217728}}}}' | {sb} update -r - r1
        {show}
        {sb} update --memory 32m --memory-swap 48m r1
        {show}
        {sb} update --memory 16m --memory-swap 256m r1 2>{tmp_path}/err && echo UPDATED
        {show}
        {sb} delete --force r1
    """)
    assert r.returncode == 0, r.stderr
    sizes = [tuple(int(v) for v in line.split()) for line in r.stdout.splitlines()]
    assert sizes == [(64 << 20,) * 3, (128 << 20,) * 3, (32 << 20, 48 << 20, 32 << 20),
                     (32 << 20, 48 << 20, 32 << 20)], r.stdout
    assert "the container uses" in (tmp_path / "err").read_text()


def test_a_unit_that_was_there_is_never_the_containers(make_bundle, tmp_path):
    """A scope of that name that exists already, someone else's (systemd-run's) or another
    container's, is refused in one line and left running (runc 1.1 joined it and its delete
    stopped it; runc 1.2 refuses it); a failed one left behind is reset and started anew (runc
    1.2); and a unit of a container's name started after the container's own ended is not the
    container's: delete leaves it alone."""
    sb = f"{CLI[0]} --systemd-cgroup --root {tmp_path}/s"
    victim = _bundle(make_bundle, ["sleep", "300"], path="system.slice:victim:1")
    first, second = (_bundle(make_bundle, ["sleep", "300"], path="system.slice:demo:a1") for _ in range(2))
    left = _bundle(make_bundle, ["sleep", "300"], path="system.slice:left:1")
    r = under_systemd(f"""
        active() {{ for i in $(seq 200); do systemctl -q is-active "$1" && return; sleep 0.02; done; }}
        systemd-run --scope --unit=victim-1 sleep 300 >/dev/null 2>&1 & v=$!
        active victim-1.scope
        {sb} run -d -b {victim} v1 </dev/null 2>{tmp_path}/v1.err || echo v1=$?
        echo victim=$(systemctl is-active victim-1.scope) $(kill -0 $v && echo alive) left=$(ls {tmp_path}/s)

        {sb} run -d -b {first} a1 </dev/null >/dev/null 2>&1
        {sb} run -d -b {second} b1 </dev/null 2>{tmp_path}/b1.err || echo b1=$?
        echo a1=$({sb} state a1 | grep -c running) $(systemctl is-active demo-a1.scope)

        systemd-run --scope --unit=left-1 -p TimeoutStopSec=1 sh -c 'trap "" TERM; sleep 300' >/dev/null 2>&1 &
        active left-1.scope
        systemctl stop left-1.scope || true
        echo before=$(systemctl is-active left-1.scope || true)
        {sb} run -d -b {left} l1 </dev/null >/dev/null 2>&1 || echo l1=$?
        echo l1=$({sb} state l1 | grep -c running) $(systemctl is-active left-1.scope)
        {sb} delete --force l1

        systemctl kill -s KILL demo-a1.scope
        for i in $(seq 200); do systemctl -q is-active demo-a1.scope || break; sleep 0.02; done
        systemctl reset-failed demo-a1.scope 2>/dev/null || true
        systemd-run --scope --unit=demo-a1 sleep 300 >/dev/null 2>&1 & f=$!
        active demo-a1.scope
        {sb} delete a1
        echo foreign=$(systemctl is-active demo-a1.scope) $(kill -0 $f && echo alive)
        kill $v $f
    """)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    errors = [(tmp_path / f"{c}.err").read_text() for c in ("v1", "b1")]
    assert lines[:2] == ["v1=1", "victim=active alive left="], (r.stdout, errors)
    assert lines[2:4] == ["b1=1", "a1=1 active"], (r.stdout, errors)
    for err, unit in zip(errors, ("victim-1.scope", "demo-a1.scope"), strict=True):
        assert len(err.splitlines()) == 1 and f"the systemd unit {unit} already exists (active)" in err, err
    assert lines[4:6] == ["before=failed", "l1=1 active"], r.stdout
    assert lines[6:] == ["foreign=active alive"], r.stdout
