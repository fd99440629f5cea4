"""cgroup v2: the device rules as an eBPF program the kernel runs, the container's cgroup in
the unified hierarchy, and the hook adding the GPU nodes to the program runc attached.

This host is hybrid (v1 controllers, an empty unified hierarchy at /sys/fs/cgroup/unified):
each test gives itself a pure v2 view in a private mount namespace (cgroup2 mounted over
/sys/fs/cgroup), where the unified hierarchy has no controllers but runs device programs,
as on any v2 host."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gofer.cgroups import CgroupV2
from gofer.devfilter import Rule
from tests.integration.helpers import CLI, sandbox

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

DISK = "mknod /dev/disk b 8 0 && (head -c 1 /dev/disk >/dev/null 2>&1 && echo DISK-READ || echo disk-denied)"
GPU = "head -c 1 /dev/nvidiactl; head -c 1 /dev/nvidia0; head -c 1 /dev/null && echo null-ok"


def _v2_root() -> str:
    with open("/proc/self/mounts") as f:
        for line in f:
            _, point, fstype, *_ = line.split()
            if fstype == "cgroup2":
                return point
    pytest.skip("no cgroup2 hierarchy mounted")


def in_v2_view(script: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``script`` (sh) in a private mount namespace whose /sys/fs/cgroup is cgroup2."""
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                           f"mount -t cgroup2 none /sys/fs/cgroup && {script}"],
                          capture_output=True, text=True, timeout=timeout)


def _cli() -> str:
    return f"{CLI[0]}"


def _mknod_bundle(make_bundle, script: str, env=(), path: str | None = None):
    bundle = make_bundle(["sh", "-c", script], list(env))
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["capabilities"] = {k: ["CAP_MKNOD", "CAP_DAC_OVERRIDE"] for k in
                                       ("bounding", "effective", "permitted")}
    spec["linux"]["resources"] = {"devices": [{"allow": False, "access": "rwm"}]}
    spec["linux"]["cgroupsPath"] = path or f"/sandbox-v2-{os.getpid()}-{bundle.name}"
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle, spec["linux"]["cgroupsPath"]


@pytest.mark.parametrize("rules,expect", [
    # (rules after deny-all, {(path, flags): opened?})
    ([], {("/dev/null", os.O_RDONLY): False}),
    ([Rule(True, "c", 1, 3, "rw")], {("/dev/null", os.O_RDONLY): True, ("/dev/zero", os.O_RDONLY): False}),
    ([Rule(True, "c", 1, None, "r")], {("/dev/null", os.O_RDONLY): True, ("/dev/null", os.O_WRONLY): False,
                                       ("/dev/zero", os.O_RDONLY): True}),
    ([Rule(True, "a"), Rule(False, "c", 1, 5)], {("/dev/null", os.O_RDWR): True, ("/dev/zero", os.O_RDONLY): False}),
    ([Rule(True, "c", 1, 3), Rule(False, "c", 1, 3, "w")], {("/dev/null", os.O_RDONLY): True,
                                                            ("/dev/null", os.O_WRONLY): False}),
    ([Rule(True, "a")], {("/dev/null", os.O_RDWR): True, ("/dev/zero", os.O_RDWR): True}),
    ([Rule(True, "b", None, None), Rule(True, "c", 2**31 + 5, 0)], {("/dev/null", os.O_RDONLY): False}),
    # v1's deny takes letters away: read alone stays allowed, read and write is denied
    ([Rule(True, "c", 1, 3), Rule(False, "c", 1, 3, "w")], {("/dev/null", os.O_RDWR): False,
                                                            ("/dev/null", os.O_RDONLY): True}),
])
def test_the_kernel_runs_the_rules_as_v1_would(rules, expect):
    """The program for each rule list, attached to a real v2 cgroup, and a child in it
    opening real nodes: the last matching rule decides, access letters are subsets."""
    cg = CgroupV2(f"sandbox-devfilter-{os.getpid()}", root=_v2_root())
    cg.create()
    try:
        cg.rules = [Rule(False), *rules]
        cg.seal()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                cg.add(os.getpid())
                got = []
                for path, flags in expect:
                    try:
                        os.close(os.open(path, flags))
                        got.append(True)
                    except PermissionError:
                        got.append(False)
                os.write(w, json.dumps(got).encode())
            finally:
                os._exit(0)
        os.close(w)
        got = json.loads(os.read(r, 4096) or b"null")
        os.waitpid(pid, 0)
        os.close(r)
        assert got == list(expect.values())
    finally:
        cg.remove()
    assert not os.path.exists(cg.dirs["unified"])


def test_run_denies_a_disk_and_allows_the_gpu_nodes(make_bundle, tmp_path, driver_root):
    bundle, path = _mknod_bundle(make_bundle, f"{DISK}; {GPU}", ["NVIDIA_VISIBLE_DEVICES=0"])
    r = in_v2_view(f"{_cli()} --root {tmp_path}/s --driver-root {driver_root} run {bundle}; echo rc=$?; "
                   f"test -e /sys/fs/cgroup{path} && echo LEFT")
    assert r.stdout.split() == ["disk-denied", "null-ok", "rc=0"], (r.stdout, r.stderr)
    assert r.stderr.count("No such device or address") == 2, r.stderr  # allowed: no driver behind them
    assert "Operation not permitted" not in r.stderr and "CAP_MKNOD is dropped" not in r.stderr


def test_create_exec_delete_in_the_v2_cgroup(make_bundle, tmp_path):
    bundle, path = _mknod_bundle(make_bundle, "sleep 30")
    s = f"{_cli()} --root {tmp_path}/s"
    r = in_v2_view(f"{s} create -b {bundle} v2c </dev/null >/dev/null 2>&1 && {s} start v2c && "
                   f"cat /sys/fs/cgroup{path}/cgroup.procs | wc -l && "
                   f"{s} exec v2c sh -c 'grep ^0:: /proc/self/cgroup; {DISK}'; "
                   f"{s} delete -f v2c; test -e /sys/fs/cgroup{path} && echo LEFT; true")
    assert r.stdout.split() == ["1", f"0::{path}", "disk-denied"], (r.stdout, r.stderr)


def test_a_limit_without_its_controller_is_one_line(make_bundle, tmp_path):
    """The unified hierarchy here has no memory controller: memory.max cannot be written,
    the container is refused in one line naming it, and its cgroup goes."""
    bundle, path = _mknod_bundle(make_bundle, "true")
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"]["resources"]["memory"] = {"limit": 67108864}
    (bundle / "config.json").write_text(json.dumps(spec))
    r = in_v2_view(f"{_cli()} --root {tmp_path}/s run {bundle}; echo rc=$?; "
                   f"test -e /sys/fs/cgroup{path} && echo LEFT; ls {tmp_path}/s")
    assert r.stdout.split() == ["rc=1"], (r.stdout, r.stderr)
    line, = r.stderr.strip().splitlines()
    assert "linux.resources.memory.limit" in line and "memory.max" in line and "memory controller" in line, line


def test_hook_adds_the_gpu_nodes_to_runcs_program(make_bundle, driver_root, tmp_path):
    """runc attaches its own device program on v2 (deny all but its defaults); the hook puts
    the GPU nodes in front of it, so they open (ENXIO: no driver) while a disk stays denied."""
    bundle, path = _mknod_bundle(make_bundle, f"{DISK}; {GPU}", ["NVIDIA_VISIBLE_DEVICES=0"])
    r = sandbox("hook", "install", bundle, "--driver-root", driver_root, "--stage", "createRuntime")
    assert r.returncode == 0, r.stderr
    r = in_v2_view(f"runc --root {tmp_path}/runc run -b {bundle} v2hook; echo rc=$?")
    assert r.stdout.split() == ["disk-denied", "null-ok", "rc=0"], (r.stdout, r.stderr)
    assert r.stderr.count("No such device or address") == 2, r.stderr


GRANT = """
import os, sys
from gofer import syscalls as sc
from gofer.cgroups import allow_devices
pid, cgroup, end = int(sys.argv[1]), sys.argv[2], sys.argv[3]
cg = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
theirs = sc.bpf_prog_query(cg)[1]
fds = sorted(os.listdir("/proc/self/fd"))
grant = allow_devices(pid, [(195, 0)])
ours = sc.bpf_prog_query(cg)[1]
getattr(grant, end)()
print(len(theirs), ours != theirs, sc.bpf_prog_query(cg)[1] == (theirs if end == "undo" else ours),
      sorted(os.listdir("/proc/self/fd")) == fds)
"""


@pytest.mark.parametrize("end,opens", [("undo", "Operation not permitted"), ("release", "No such device or address")])
def test_the_gpu_nodes_program_is_put_back_or_kept(make_bundle, tmp_path, end, opens):
    """The embedded setup's device grant on v2 (sandbox.api, the hook): undone, runc's own
    program is attached again and the node is denied; released, ours stays (the node opens:
    ENXIO, no driver). Either way none of the programs' or the cgroup's fds stays open."""
    bundle, path = _mknod_bundle(make_bundle, "sleep 30")
    runc = f"runc --root {tmp_path}/runc"
    r = in_v2_view(f"{runc} run -d -b {bundle} v2g </dev/null >/dev/null 2>&1 && "
                   f"pid=$({runc} state v2g | {sys.executable} -c 'import json,sys; print(json.load(sys.stdin)[\"pid\"])') && "
                   f"{sys.executable} -c '{GRANT}' $pid /sys/fs/cgroup{path} {end} && "
                   f"{runc} exec v2g sh -c 'mknod /dev/nvidia0 c 195 0 && head -c 1 /dev/nvidia0'; "
                   f"{runc} delete -f v2g; test -e /sys/fs/cgroup{path} && echo LEFT; true")
    assert r.stdout.split() == ["1", "True", "True", "True"], (r.stdout, r.stderr)
    assert opens in r.stderr, r.stderr


def test_without_the_hook_runc_denies_the_gpu_nodes(make_bundle, driver_root, tmp_path):
    """The control for the test above: the same nodes bound in by hand, no hook, are denied."""
    bundle, path = _mknod_bundle(make_bundle, GPU)
    spec = json.loads((bundle / "config.json").read_text())
    spec["mounts"] += [{"destination": f"/dev/{n}", "type": "bind", "source": f"{driver_root}/dev/{n}",
                        "options": ["bind"]} for n in ("nvidiactl", "nvidia0")]
    (bundle / "config.json").write_text(json.dumps(spec))
    r = in_v2_view(f"runc --root {tmp_path}/runc run -b {bundle} v2ctl; echo rc=$?")
    assert r.stderr.count("Operation not permitted") == 2, (r.stdout, r.stderr)


def test_a_cgroup_that_exists_gets_our_program_alone(make_bundle, tmp_path):
    """An earlier container's program (here: deny everything) left on a cgroup that
    cgroupsPath names again is replaced, as runc replaces it: the rules are the spec's."""
    bundle, path = _mknod_bundle(make_bundle, "head -c 1 /dev/null && echo null-ok")
    plant = ("from gofer.cgroups import attach_rules; from gofer.devfilter import Rule; "
             f"attach_rules('/sys/fs/cgroup{path}', [Rule(False)])")
    r = in_v2_view(f"mkdir /sys/fs/cgroup{path} && {sys.executable} -c \"{plant}\" && "
                   f"{_cli()} --root {tmp_path}/s run {bundle}; echo rc=$?; rmdir /sys/fs/cgroup{path}")
    assert r.stdout.split() == ["null-ok", "rc=0"], (r.stdout, r.stderr)
