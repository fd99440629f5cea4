"""The container's cgroup (v1 controllers, this host's layout), read from inside the container
and compared with runc on the same bundle: memory and pids limits, and the devices controller
that keeps a container holding CAP_MKNOD (Docker grants it) away from the host's disks while
the GPU nodes stay usable. The cgroups go with the container."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from tests.integration.helpers import CLI, create, runc_run, sandbox

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root"),
              pytest.mark.skipif(not os.path.isdir("/sys/fs/cgroup/memory"), reason="needs cgroup v1")]

PROBE = ("cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max; "
         "mknod /dev/disk b 8 0 && (head -c 1 /dev/disk >/dev/null 2>&1 && echo DISK-READ || echo disk-denied); "
         "mknod /dev/mem2 c 1 1 && (head -c 1 /dev/mem2 >/dev/null 2>&1 && echo MEM-READ || echo mem-denied); "
         "head -c 1 /dev/null && echo null-ok")


def _bundle(make_bundle, env=()):
    bundle = make_bundle(["sh", "-c", PROBE], list(env))
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["capabilities"] = {k: ["CAP_MKNOD", "CAP_DAC_OVERRIDE"] for k in
                                       ("bounding", "effective", "permitted")}
    spec["linux"]["resources"] = {"devices": [{"allow": False, "access": "rwm"}],
                                  "memory": {"limit": 67108864}, "pids": {"limit": 64}}
    spec["linux"]["cgroupsPath"] = f"/sandbox-test-{os.getpid()}/{bundle.name}"
    # the cgroup controllers as runc's own config mounts them, so both read the same files
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


def _cgroup_dirs(bundle) -> list[str]:
    rel = json.loads((bundle / "config.json").read_text())["linux"]["cgroupsPath"].lstrip("/")
    return [os.path.join("/sys/fs/cgroup", c, rel) for c in ("memory", "pids", "devices")]


def test_limits_and_devices_as_under_runc(make_bundle, tmp_path):
    bundle = _bundle(make_bundle)
    ours = sandbox("run", bundle, "--root", tmp_path / "ours")
    assert ours.returncode == 0, ours.stderr
    assert not any(os.path.exists(d) for d in _cgroup_dirs(bundle)), "cgroups left behind"
    theirs = subprocess.run(["runc", "--root", str(tmp_path / "runc"), "run", "-b", str(bundle), f"cg{os.getpid()}"],
                            capture_output=True, text=True, timeout=60)
    assert theirs.returncode == 0, theirs.stderr
    lines = ours.stdout.splitlines()
    assert lines == ["67108864", "64", "disk-denied", "mem-denied", "null-ok"], ours.stdout
    assert ours.stdout == theirs.stdout


def test_gpu_nodes_are_allowed_in_the_devices_cgroup(make_bundle, tmp_path, driver_root):
    """The fixture's nodes are real char devices with no driver behind them: opening one
    fails with ENXIO when the cgroup allows it, EPERM when it does not."""
    bundle = make_bundle(["sh", "-c", "head -c 1 /dev/nvidiactl; head -c 1 /dev/nvidia0; true"],
                         ["NVIDIA_VISIBLE_DEVICES=0"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"]["resources"] = {"devices": [{"allow": False, "access": "rwm"}]}
    (bundle / "config.json").write_text(json.dumps(spec))
    r = sandbox("run", bundle, "--root", tmp_path / "s", "--driver-root", driver_root)
    assert r.returncode == 0, r.stderr
    assert "Operation not permitted" not in r.stderr, r.stderr
    assert r.stderr.count("No such device or address") == 2, r.stderr


def test_exec_joins_the_cgroup_and_delete_removes_it(make_bundle, tmp_path):
    bundle = _bundle(make_bundle)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["args"] = ["sleep", "30"]
    (bundle / "config.json").write_text(json.dumps(spec))
    state = str(tmp_path / "state")
    with open(tmp_path / "out", "w") as out:
        assert subprocess.run([*_cli(), "--root", state, "create", "--bundle", str(bundle), "e1"], stdout=out,
                              stderr=out, stdin=subprocess.DEVNULL, timeout=60).returncode == 0
    try:
        assert subprocess.run([*_cli(), "--root", state, "start", "e1"]).returncode == 0
        r = subprocess.run([*_cli(), "--root", state, "exec", "e1", "sh", "-c",
                            "cat /sys/fs/cgroup/pids/pids.max; mknod /dev/d b 8 0; head -c1 /dev/d || echo denied"],
                           capture_output=True, text=True, timeout=60)
        assert r.stdout.split() == ["64", "denied"], (r.stdout, r.stderr)
    finally:
        subprocess.run([*_cli(), "--root", state, "delete", "-f", "e1"])
    assert not any(os.path.exists(d) for d in _cgroup_dirs(bundle))


def _cli() -> list[str]:

    return [*CLI]


def teardown_module():
    """The parents of the test's cgroups (runc makes them in every hierarchy, ours too)."""
    for c in os.listdir("/sys/fs/cgroup"):
        try:
            os.rmdir(f"/sys/fs/cgroup/{c}/sandbox-test-{os.getpid()}")
        except OSError:
            pass


def test_block_io_throttle_as_under_runc(make_bundle, tmp_path):
    """linux.resources.blockIO on the blkio controller: the container reads its own limit."""
    with open("/sys/block/vda/dev") if os.path.exists("/sys/block/vda/dev") else open("/sys/block/loop0/dev") as f:
        major, minor = map(int, f.read().split(":"))
    bundle = make_bundle(["cat", "/sys/fs/cgroup/blkio/blkio.throttle.read_bps_device",
                          "/sys/fs/cgroup/blkio/blkio.throttle.write_iops_device"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"]["resources"] = {"blockIO": {
        "throttleReadBpsDevice": [{"major": major, "minor": minor, "rate": 1048576}],
        "throttleWriteIOPSDevice": [{"major": major, "minor": minor, "rate": 100}]}}
    spec["linux"]["cgroupsPath"] = f"/sandbox-test-{os.getpid()}/{bundle.name}"
    (bundle / "config.json").write_text(json.dumps(spec))
    ours = sandbox("run", bundle, "--root", tmp_path / "ours")
    theirs = runc_run(bundle, tmp_path / "runc", f"bio{os.getpid()}")
    assert ours.returncode == 0 and theirs.returncode == 0, (ours.stderr, theirs.stderr)
    assert ours.stdout.split("\n")[:2] == [f"{major}:{minor} 1048576", f"{major}:{minor} 100"], ours.stdout
    assert ours.stdout == theirs.stdout


def test_a_controller_that_is_not_mounted_is_one_line(make_bundle, tmp_path):
    """hugetlb is not mounted on this host: a hugepage limit refuses the container, naming
    the field and the controller, and leaves no cgroup behind."""
    bundle = make_bundle(["true"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"]["resources"] = {"hugepageLimits": [{"pageSize": "2MB", "limit": 2097152}]}
    spec["linux"]["cgroupsPath"] = f"/sandbox-test-{os.getpid()}/{bundle.name}"
    (bundle / "config.json").write_text(json.dumps(spec))
    if os.path.isdir("/sys/fs/cgroup/hugetlb"):
        pytest.skip("this host mounts hugetlb")
    r = sandbox("run", bundle, "--root", tmp_path / "s")
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip() == ("sandbox run: linux.resources.hugepageLimits: the hugetlb cgroup controller is "
                                "not mounted under /sys/fs/cgroup"), r.stderr
    assert not any(os.path.exists(d) for d in _cgroup_dirs(bundle))


def test_the_container_sees_only_its_own_cgroups_as_under_runc(make_bundle, tmp_path):
    """Every v1 hierarchy, the named systemd one included, holds a cgroup of the container's
    own, and only those are mounted in it: no hierarchy root, none of the caller's cgroups,
    not the hybrid host's unified hierarchy (where a writable mount let a container kill
    host cgroups through cgroup.kill)."""
    bundle = make_bundle(["sh", "-c", "grep -v '^0::' /proc/self/cgroup; ls /sys/fs/cgroup; "
                                      "ls /sys/fs/cgroup/systemd | grep -c cgroup.procs"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"]["cgroupsPath"] = f"/sandbox-test-{os.getpid()}/{bundle.name}"
    (bundle / "config.json").write_text(json.dumps(spec))
    ours = sandbox("run", bundle, "--root", tmp_path / "ours")
    theirs = runc_run(bundle, tmp_path / "runc", f"own{os.getpid()}")
    assert ours.returncode == 0 and theirs.returncode == 0, (ours.stderr, theirs.stderr)
    assert f"name=systemd:/sandbox-test-{os.getpid()}/{bundle.name}" in ours.stdout
    assert "unified" not in ours.stdout.split()
    assert ours.stdout == theirs.stdout
    assert not os.path.exists(f"/sys/fs/cgroup/systemd/sandbox-test-{os.getpid()}/{bundle.name}")


def test_no_device_rules_no_container(make_bundle, tmp_path):
    """A host without any device cgroup (here: a view without the v1 devices hierarchy):
    refused in one line, nothing left. Dropping CAP_MKNOD alone left the image's own nodes
    (a /dev/kmsg, a disk) open to the container."""
    bundle = make_bundle(["true"])
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        f"umount -l /sys/fs/cgroup/devices && {' '.join(_cli())} --root {tmp_path}/s run {bundle}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip() == ("sandbox run: no devices cgroup here (a v1 devices controller, or cgroup v2) to "
                                "restrict the container's device access: refusing to run it"), r.stderr
    assert not os.listdir(tmp_path / "s")


INSIDE = ("mkdir /tmp/x 2>&1 | tail -1; cat /sys/fs/cgroup/memory/memory.limit_in_bytes; "
          "mknod /dev/disk b 8 0 && (head -c 1 /dev/disk >/dev/null 2>&1 && echo DISK-READ || echo disk-denied); "
          "head -c 1 /dev/nvidiactl 2>&1 | grep -c 'No such device or address'; "
          "echo masked=$(wc -c < /proc/version); cat /proc/sys/net/ipv4/ip_forward; "
          # last: a fork bomb stops at pids.max, and its killed processes free their pids only
          # once reaped (under load, after the next fork was refused); then builtins alone
          "sh -c 'while :; do sleep 5 & done' 2>/dev/null; "
          "set -- /proc/[0-9]*; echo forks=$#; kill -9 -1")


@pytest.mark.parametrize("verb", ["run", "create"])
def test_isolation_seen_from_inside(verb, make_bundle, tmp_path, driver_root):
    """Everything at once, in `sandbox run` and in create/start: a seccomp-denied mkdir is
    EPERM, memory.limit_in_bytes reads the limit, pids.max stops a fork bomb, a disk made
    with mknod cannot be opened while a GPU node can (ENXIO: no driver behind it), a masked
    path is empty, a sysctl is set."""
    bundle = make_bundle(["sh", "-c", INSIDE], ["NVIDIA_VISIBLE_DEVICES=0"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["capabilities"] = {k: ["CAP_MKNOD", "CAP_KILL"] for k in ("bounding", "effective", "permitted")}
    spec["process"]["noNewPrivileges"] = True
    spec["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
        {"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}]}
    spec["linux"]["resources"] = {"devices": [{"allow": False, "access": "rwm"}],
                                  "memory": {"limit": 67108864}, "pids": {"limit": 16}}
    spec["linux"]["sysctl"] = {"net.ipv4.ip_forward": "1"}
    spec["linux"]["maskedPaths"] = ["/proc/version"]
    spec["linux"]["cgroupsPath"] = f"/sandbox-test-{os.getpid()}/{bundle.name}"
    spec["mounts"].append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]})
    (bundle / "config.json").write_text(json.dumps(spec))
    root = str(tmp_path / "s")
    if verb == "run":
        r = sandbox("run", bundle, "--root", root, "--driver-root", driver_root)
        assert r.returncode == 0, r.stderr
        out = r.stdout
    else:
        log = tmp_path / "out"
        assert create(root, bundle, "iso1", "--driver-root", driver_root, log=log).returncode == 0
        try:
            assert subprocess.run([*_cli(), "--root", root, "start", "iso1"]).returncode == 0
            for _ in range(200):  # until its last line
                if len(log.read_text().split("\n")) > 7:
                    break
                time.sleep(0.05)
        finally:
            subprocess.run([*_cli(), "--root", root, "delete", "--force", "iso1"])
        out = log.read_text()
    lines = out.split("\n")
    assert lines[0] == "mkdir: can't create directory '/tmp/x': Operation not permitted", out
    assert lines[1] == "67108864", out
    assert lines[2:6] == ["disk-denied", "1", "masked=0", "1"], out
    forks = int(lines[6].removeprefix("forks="))
    assert 0 < forks <= 16, out  # every process the container has, counted from inside
    assert not any(os.path.exists(d) for d in _cgroup_dirs(bundle))


@pytest.mark.skipif(os.path.isdir("/run/systemd/system"), reason="systemd runs here")
def test_systemd_cgroup_manager_without_systemd_is_one_line(make_bundle, tmp_path):
    """No systemd here: --systemd-cgroup with a slice:prefix:name path is one line (runc's
    words), before anything is made. (Under systemd: tests/integration/test_systemd.py.)"""
    bundle = make_bundle(["true"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"]["cgroupsPath"] = "system.slice:sandbox:sd1"
    (bundle / "config.json").write_text(json.dumps(spec))
    r = subprocess.run([*_cli(), "--systemd-cgroup", "--root", str(tmp_path / "s"), "run", "-b", str(bundle), "sd1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--systemd-cgroup: systemd not running on this host" in r.stderr, r.stderr
    assert not os.listdir(tmp_path / "s")


def test_a_cgroup_namespace_still_shows_only_the_containers_own(make_bundle, tmp_path):
    """With a cgroup namespace every path in /proc/self/cgroup reads "/": the mount must still
    be the container's own cgroups (it bound each hierarchy's root, rw, and with CAP_MKNOD the
    container moved itself into the host's root devices cgroup and read /dev/kmsg)."""
    marker = f"/sys/fs/cgroup/pids/sandbox-marker-{os.getpid()}"
    os.mkdir(marker)
    try:
        bundle = make_bundle(["sh", "-c", "ls /sys/fs/cgroup/pids; echo $$ > /sys/fs/cgroup/devices/cgroup.procs "
                                          "2>&1 | tail -1; mknod /dev/k c 1 11; head -c1 /dev/k 2>&1 | tail -1"])
        spec = json.loads((bundle / "config.json").read_text())
        spec["linux"]["namespaces"].append({"type": "cgroup"})
        spec["linux"]["cgroupsPath"] = f"/sandbox-test-{os.getpid()}/{bundle.name}"
        spec["linux"]["resources"] = {"devices": [{"allow": False, "access": "rwm"}]}
        spec["process"]["capabilities"] = {k: ["CAP_MKNOD", "CAP_DAC_OVERRIDE"] for k in
                                           ("bounding", "effective", "permitted")}
        for m in spec["mounts"]:
            if m["type"] == "cgroup":
                m["options"] = [o for o in m["options"] if o != "ro"] + ["rw"]
        (bundle / "config.json").write_text(json.dumps(spec))
        r = sandbox("run", bundle, "--root", tmp_path / "s")
        assert r.returncode == 0, r.stderr
        assert os.path.basename(marker) not in r.stdout and "Operation not permitted" in r.stdout, r.stdout
    finally:
        os.rmdir(marker)


def test_a_hierarchy_reached_through_a_symlink(make_bundle, tmp_path):
    """systemd's v1 layout: cpu and cpuacct are links to the one cpu,cpuacct hierarchy.
    Made here in a private mount namespace (the host's hierarchies bound under a tmpfs, cpu
    bound at cpu,cpuacct and linked): the container gets its cpu cgroup, joined once, and
    every cgroup is removed after."""
    if not os.path.isdir("/sys/fs/cgroup/cpu") or os.path.islink("/sys/fs/cgroup/cpu"):
        pytest.skip("needs a separate v1 cpu hierarchy to rebuild as a link")
    bundle = make_bundle(["sh", "-c", "cat /sys/fs/cgroup/cpu,cpuacct/cpu.shares; grep -c :cpu: /proc/self/cgroup"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"]["resources"] = {"cpu": {"shares": 512}}
    rel = f"sandbox-link-{os.getpid()}"
    spec["linux"]["cgroupsPath"] = f"/{rel}"
    (bundle / "config.json").write_text(json.dumps(spec))
    stage = tmp_path / "cg"
    stage.mkdir()
    binds = " && ".join(f"mkdir '{stage}/{n}' && mount --bind /sys/fs/cgroup/{n} '{stage}/{n}'"
                        for n in os.listdir("/sys/fs/cgroup") if n != "cpu")
    script = (f"mount -t tmpfs tmpfs '{stage}' && {binds} && mkdir '{stage}/cpu,cpuacct' && "
              f"mount --bind /sys/fs/cgroup/cpu '{stage}/cpu,cpuacct' && ln -s cpu,cpuacct '{stage}/cpu' && "
              f"mount --move '{stage}' /sys/fs/cgroup && "
              f"{CLI[0]} --root '{tmp_path}/state' run '{bundle}'")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.split() == ["512", "1"], (r.stdout, r.stderr)
    assert not os.path.exists(f"/sys/fs/cgroup/cpu/{rel}") and not os.path.exists(f"/sys/fs/cgroup/memory/{rel}")


@pytest.fixture
def occupied_cgroup():
    """A cgroup someone else made, with a host process in it: (its path relative to the
    hierarchies, the process)."""
    rel = f"sandbox-occupied-{os.getpid()}"
    dirs = [os.path.join("/sys/fs/cgroup", c, rel) for c in ("memory", "pids", "devices")]
    host = subprocess.Popen(["sleep", "300"])
    for d in dirs:
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "cgroup.procs"), "w") as f:
            f.write(str(host.pid))
    yield rel, host
    host.kill()
    host.wait()
    for d in dirs:
        for _ in range(100):
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)


def test_a_cgroup_with_host_processes_is_not_the_containers(occupied_cgroup, make_bundle, tmp_path):
    """cgroupsPath naming an existing cgroup that has a host process in it: a warning, and
    kill --all and delete --force signal the container's own pid namespace, never the host's
    process. Without a pid namespace of its own, the container is refused in one line."""
    rel, host = occupied_cgroup
    bundle = make_bundle(["sleep", "300"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"]["cgroupsPath"] = "/" + rel
    (bundle / "config.json").write_text(json.dumps(spec))
    root = tmp_path / "s"
    cli = [*CLI, "--root", str(root)]
    with open(tmp_path / "log", "w") as log:
        r = subprocess.run([*cli, "run", "-d", "-b", str(bundle), "occ"], stdin=subprocess.DEVNULL, stdout=log,
                           stderr=log, timeout=60)
    assert r.returncode == 0, (tmp_path / "log").read_text()
    assert "is not empty: 1 process(es) found" in (tmp_path / "log").read_text()
    try:
        ps = subprocess.run([*cli, "ps", "--format", "json", "occ"], capture_output=True, text=True, timeout=60)
        assert host.pid not in json.loads(ps.stdout) and len(json.loads(ps.stdout)) == 1, ps.stdout
        assert subprocess.run([*cli, "kill", "--all", "occ", "KILL"], timeout=60).returncode == 0
        assert subprocess.run([*cli, "delete", "--force", "occ"], timeout=60).returncode == 0
        assert host.poll() is None, "the host's process was killed"
    finally:
        subprocess.run([*cli, "delete", "--force", "occ"], timeout=60)
    spec["linux"]["namespaces"] = [ns for ns in spec["linux"]["namespaces"] if ns["type"] != "pid"]
    (bundle / "config.json").write_text(json.dumps(spec))
    r = subprocess.run([*cli, "run", "-d", "-b", str(bundle), "occ2"], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=60)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "already has 1 process(es)" in r.stderr and not (root / "occ2").exists()
    assert host.poll() is None


def test_update_changes_the_limits_and_keeps_the_device_rules(make_bundle, tmp_path):
    """runc's update: single-value flags (sizes as runc reads them) and --resources on stdin
    land in the running container's cgroup; its device rules stay as they were."""
    bundle = make_bundle(["sleep", "300"])
    spec = json.loads((bundle / "config.json").read_text())
    rel = f"sandbox-update-{os.getpid()}"
    spec["linux"]["cgroupsPath"] = "/" + rel
    spec["linux"]["resources"] = {"memory": {"limit": 128 << 20}, "pids": {"limit": 100},
                                  "devices": [{"allow": False, "access": "rwm"}]}
    (bundle / "config.json").write_text(json.dumps(spec))
    cli = [*CLI, "--root", str(tmp_path / "s")]
    assert subprocess.run([*cli, "run", "-d", "-b", str(bundle), "up1"], stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60).returncode == 0
    mem, pids, dev = (f"/sys/fs/cgroup/{c}/{rel}" for c in ("memory", "pids", "devices"))
    try:
        rules = open(f"{dev}/devices.list").read()
        r = subprocess.run([*cli, "update", "--memory", "64m", "--pids-limit", "50", "up1"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert open(f"{mem}/memory.limit_in_bytes").read().strip() == str(64 << 20)
        assert open(f"{pids}/pids.max").read().strip() == "50"
        r = subprocess.run([*cli, "update", "-r", "-", "up1"], input=json.dumps(
            {"memory": {"limit": 96 << 20}, "devices": [{"allow": True, "access": "rwm"}]}),
            capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert open(f"{mem}/memory.limit_in_bytes").read().strip() == str(96 << 20)
        assert open(f"{dev}/devices.list").read() == rules
        r = subprocess.run([*cli, "update", "--memory", "lots", "up1"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "update --memory: 'lots' is not a size" in r.stderr, r.stderr
    finally:
        subprocess.run([*cli, "delete", "--force", "up1"], timeout=60)
    r = subprocess.run([*cli, "update", "--memory", "1g", "up1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "does not exist" in r.stderr


def _memory(rel: str) -> tuple[int, int]:
    d = f"/sys/fs/cgroup/memory/{rel}"
    return tuple(int(open(f"{d}/memory.{f}limit_in_bytes").read()) for f in ("", "memsw."))  # type: ignore[return-value]


def _updating(make_bundle, tmp_path, args, memory, cid):
    """A running container made with ``memory`` (linux.resources.memory), its cli and cgroup."""
    if not os.path.exists("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes"):
        pytest.skip("this kernel accounts no swap (memory.memsw.*): swapaccount=1")
    bundle = make_bundle(args)
    spec = json.loads((bundle / "config.json").read_text())
    rel = f"sandbox-resize-{os.getpid()}-{cid}"
    spec["linux"]["cgroupsPath"] = "/" + rel
    spec["linux"]["resources"] = {"memory": memory}
    (bundle / "config.json").write_text(json.dumps(spec))
    cli = [*CLI, "--root", str(tmp_path / "s")]
    assert subprocess.run([*cli, "run", "-d", "-b", str(bundle), cid], stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60).returncode == 0
    return cli, rel


def _update(cli, cid, *args, resources=None):
    return subprocess.run([*cli, "update", *(["-r", "-"] if resources else []), *args, cid], capture_output=True,
                          text=True, timeout=60, input=json.dumps(resources) if resources else None)


def test_update_resizes_memory_with_a_swap_limit_as_runc(make_bundle, tmp_path):
    """kubelet's resize (crictl update: containerd's UpdateContainerResources, memory+swap set
    to the limit) of a running container: on v1 the kernel keeps memory <= memory+swap at every
    write, so memory.memsw.limit_in_bytes goes first when raised and last when lowered (runc's
    setMemoryAndSwap). Memory alone keeps the memory+swap limit (runc keeps the container's
    config and merges the update into it), and refuses a limit above it; -1 alone lifts both."""
    cli, rel = _updating(make_bundle, tmp_path, ["sleep", "300"], {"limit": 64 << 20, "swap": 64 << 20}, "rs1")
    try:
        assert _memory(rel) == (64 << 20, 64 << 20)
        r = _update(cli, "rs1", resources={"memory": {"limit": 128 << 20, "swap": 128 << 20}})
        assert r.returncode == 0, r.stderr
        assert _memory(rel) == (128 << 20, 128 << 20)
        r = _update(cli, "rs1", "--memory", "32m", "--memory-swap", "48m")
        assert r.returncode == 0, r.stderr
        assert _memory(rel) == (32 << 20, 48 << 20)
        r = _update(cli, "rs1", "--memory", "40m")
        assert r.returncode == 0, r.stderr
        assert _memory(rel) == (40 << 20, 48 << 20)
        r = _update(cli, "rs1", "--memory", "64m")
        assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
        assert "memory+swap limit" in r.stderr, r.stderr
        assert _memory(rel) == (40 << 20, 48 << 20)
        r = _update(cli, "rs1", "--memory-swap", "256m")
        assert r.returncode == 0, r.stderr
        assert _memory(rel) == (40 << 20, 256 << 20)
        r = _update(cli, "rs1", "--memory", "-1")
        assert r.returncode == 0, r.stderr
        unlimited = int(open("/sys/fs/cgroup/memory/memory.limit_in_bytes").read())
        assert _memory(rel) == (unlimited, unlimited)
        r = _update(cli, "rs1", resources={"memory": {"limit": 96 << 20, "swap": 96 << 20}})
        assert r.returncode == 0, r.stderr
        assert _memory(rel) == (96 << 20, 96 << 20)
    finally:
        subprocess.run([*cli, "delete", "--force", "rs1"], timeout=60)
    assert not os.path.exists(f"/sys/fs/cgroup/memory/{rel}")


def test_a_failed_update_changes_nothing(make_bundle, tmp_path):
    """The container holds 40 MiB (a file in its /dev/shm: no swap here to move it to). A
    memory limit below that is refused by the kernel (EBUSY) after the raised memory+swap
    limit went in first, which is put back; a value the kernel refuses after the memory
    limits went in (a CFS quota under 1 ms) puts them back; memory+swap below memory is
    refused before anything is written."""
    fill = "head -c 41943040 /dev/zero > /dev/shm/fill && exec sleep 300"
    cli, rel = _updating(make_bundle, tmp_path, ["sh", "-c", fill], {"limit": 64 << 20, "swap": 128 << 20}, "rs2")
    cpu = f"/sys/fs/cgroup/cpu/{rel}/cpu.cfs_quota_us"
    try:
        for _ in range(300):
            if int(open(f"/sys/fs/cgroup/memory/{rel}/memory.usage_in_bytes").read()) >= 40 << 20:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the container did not fill its /dev/shm")
        quota = open(cpu).read()
        r = _update(cli, "rs2", "--memory", "32m", "--memory-swap", "256m")
        assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
        assert "uses" in r.stderr and "memory.limit_in_bytes" in r.stderr, r.stderr
        assert _memory(rel) == (64 << 20, 128 << 20)
        r = _update(cli, "rs2", "--memory", "96m", "--memory-swap", "192m", "--cpu-quota", "500")
        assert r.returncode == 1 and "cpu.cfs_quota_us" in r.stderr, r.stderr
        assert _memory(rel) == (64 << 20, 128 << 20) and open(cpu).read() == quota
        r = _update(cli, "rs2", "--memory", "96m", "--memory-swap", "80m")
        assert r.returncode == 1 and "below the memory limit" in r.stderr, r.stderr
        assert _memory(rel) == (64 << 20, 128 << 20)
        # a device's throttle (a line of a file keyed by device), then a hugepage limit this
        # host has no controller for: the memory, pids and throttle lines as they were
        with open("/proc/partitions") as f:
            major, minor = f.read().splitlines()[2].split()[:2]
        throttle = f"/sys/fs/cgroup/blkio/{rel}/blkio.throttle.read_bps_device"
        pids = f"/sys/fs/cgroup/pids/{rel}/pids.max"
        before = open(throttle).read(), open(pids).read()
        r = _update(cli, "rs2", resources={
            "memory": {"limit": 96 << 20, "swap": 192 << 20}, "pids": {"limit": 77},
            "blockIO": {"throttleReadBpsDevice": [{"major": int(major), "minor": int(minor), "rate": 1 << 20}]},
            "hugepageLimits": [{"pageSize": "3MB", "limit": 1 << 20}]})
        assert r.returncode == 1 and "hugepageLimits" in r.stderr, r.stderr
        assert _memory(rel) == (64 << 20, 128 << 20) and (open(throttle).read(), open(pids).read()) == before
    finally:
        subprocess.run([*cli, "delete", "--force", "rs2"], timeout=60)
    assert not os.path.exists(f"/sys/fs/cgroup/memory/{rel}")


def test_create_in_an_existing_cgroup_orders_memory_and_swap_too(make_bundle, tmp_path):
    """create writes its limits in update's order: a cgroupsPath naming a memory cgroup that
    exists with 32 MiB of memory and memory+swap takes 128 MiB of both, memory+swap first
    (and keeps them: the cgroup was not the container's to remove)."""
    if not os.path.exists("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes"):
        pytest.skip("this kernel accounts no swap (memory.memsw.*): swapaccount=1")
    rel = f"sandbox-existing-{os.getpid()}"
    d = f"/sys/fs/cgroup/memory/{rel}"
    os.mkdir(d)
    try:
        for name in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"):
            with open(f"{d}/{name}", "w") as f:
                f.write(str(32 << 20))
        bundle = make_bundle(["true"])
        spec = json.loads((bundle / "config.json").read_text())
        spec["linux"]["cgroupsPath"] = "/" + rel
        spec["linux"]["resources"] = {"memory": {"limit": 128 << 20, "swap": 128 << 20}}
        (bundle / "config.json").write_text(json.dumps(spec))
        r = sandbox("run", bundle, "--root", tmp_path / "s")
        assert r.returncode == 0, r.stderr
        assert _memory(rel) == (128 << 20, 128 << 20)
    finally:
        os.rmdir(d)
    assert not os.path.exists(f"/sys/fs/cgroup/pids/{rel}")
