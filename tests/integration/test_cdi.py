"""CDI both ways: the spec `sandbox cdi generate` writes, consumed by podman 4.3 with runc
(nothing of ours runs but the spec's hook), and CDI requests applied by `sandbox run`:
another vendor's devices edited in, NVIDIA's served natively, bad specs one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import engines
import fixtures
import pytest
import yaml

from tests.integration.helpers import CLI, mount_table, sandbox, tree
from tests.integration.test_hook import check_gpu_output

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

GPU_SCRIPT = "ls -l /dev/nvidia*; nvidia-smi; echo nvidia-smi=$?; cudacheck"


def generate(driver_root, *extra) -> subprocess.CompletedProcess:
    return sandbox("cdi", "generate", "--driver-root", driver_root, *extra)


def test_generate_is_deterministic_yaml_or_json_and_lists(driver_root, tmp_path):
    first, again = generate(driver_root), generate(driver_root)
    assert first.returncode == 0 and first.stdout == again.stdout, first.stderr
    as_json = json.loads(generate(driver_root, "--format", "json").stdout)
    assert yaml.safe_load(first.stdout) == as_json
    assert as_json["cdiVersion"] == "0.5.0" and as_json["kind"] == "nvidia.com/gpu"  # hostPath needs 0.5.0
    hook, = as_json["containerEdits"]["hooks"]
    assert hook["hookName"] == "createRuntime" and hook["args"][-2:] != ["cdi", "hook"]
    assert hook["env"] == ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                           "SANDBOX_SERVER_IDLE=0"]  # (the generator's: tests/conftest.py's)
    bare = {k: v for k, v in os.environ.items() if k != "SANDBOX_SERVER_IDLE"}
    default = json.loads(sandbox("cdi", "generate", "--driver-root", driver_root, "--format", "json", env=bare).stdout)
    assert default["containerEdits"]["hooks"][0]["env"] == [
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    assert "ldconfig" not in json.dumps(as_json)
    out = tmp_path / "cdi" / "nvidia.yaml"
    out.parent.mkdir()
    assert generate(driver_root, "--output", out).returncode == 0 and out.read_text() == first.stdout
    listed = sandbox("--cdi-spec-dir", out.parent, "cdi", "list")
    gpus = fixtures.driver_535()  # (the same fixture)
    assert gpus
    names = listed.stdout.split()
    assert {"nvidia.com/gpu=0", "nvidia.com/gpu=1"} <= set(names) and names[-1] == "nvidia.com/gpu=all", names
    assert [n for n in names if n.count(":") == 2] == ["nvidia.com/gpu=0:1:0", "nvidia.com/gpu=0:2:0",
                                                       "nvidia.com/gpu=0:2:1"], names
    assert any(n.startswith("nvidia.com/gpu=GPU-") for n in names)


@pytest.mark.parametrize("served", [False, True], ids=["cold", "warm-server"])
def test_podman_consumes_our_spec(driver_root, tmp_path, served):
    """podman 4.3 reads /etc/cdi and /var/run/cdi only: in a private mount namespace /run is a
    tmpfs of the test's with the spec in /run/cdi. runc is podman's runtime: our hook alone
    makes the links and the cache, and the GPU checks pass. With the warm server listening
    at its default socket (in that /run), every hook is its child's work."""
    if subprocess.run(["podman", "--version"], capture_output=True).returncode != 0:
        pytest.skip("podman is not installed")
    spec = generate(driver_root)
    assert spec.returncode == 0, spec.stderr
    (tmp_path / "nvidia.yaml").write_text(spec.stdout)
    base = tempfile.mkdtemp(prefix="cdi", dir="/tmp")  # podman refuses a runroot over 50 characters
    podman = (f"podman --root {base}/root --runroot {base}/runroot --tmpdir {base}/tmp --storage-driver overlay "
              "--cgroup-manager cgroupfs --events-backend file --runtime runc")
    run = f"{podman} run --rm --network none --ulimit nofile=1024:1024 --ulimit nproc=1024:1024"
    log = tmp_path / "server.log"
    server = (f"({engines.SANDBOX} serve --server /run/gpu-sandbox/hook.sock >{log} 2>&1 </dev/null & echo $! >{tmp_path}/server.pid) && "
              "while [ ! -S /run/gpu-sandbox/hook.sock ]; do sleep 0.02; done && ") if served else ""
    script = (f"mount -t tmpfs tmpfs /run && mkdir /run/cdi && cp {tmp_path}/nvidia.yaml /run/cdi/ && {server}"
              f"{podman} load -i {fixtures.image_archive()} >/dev/null && "
              f"{run} --device nvidia.com/gpu=all {engines.IMAGE} sh -c '{GPU_SCRIPT}' && echo === && "
              f"{run} --device nvidia.com/gpu=0 {engines.IMAGE} sh -c 'ls /dev/nvidia* /dev/dri/*; "
              "for f in /dev/dri/by-path/*; do readlink $f; done' && echo === && "
              f"{run} --device nvidia.com/gpu=0:2:1 {engines.IMAGE} sh -c 'ls /dev/nvidia* /dev/nvidia-caps/*'")
    parents = engines._cgroup_parents("libpod_parent")
    before = mount_table()
    try:
        r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True,
                           text=True, timeout=300)
    finally:
        if served and (tmp_path / "server.pid").exists():
            os.kill(int((tmp_path / "server.pid").read_text()), 15)
        engines._rm_if_new(parents)
        shutil.rmtree(base, ignore_errors=True)
    assert r.returncode == 0, (r.stdout, r.stderr)
    if served:  # each container the common hook, and the DRI links of its GPUs (none for the MIG one)
        hooks = [line for line in log.read_text().splitlines() if line.startswith("sandbox serve: cdi: cdi hook ")
                 and ": exit " in line]
        assert len(hooks) == 5 and all(": exit 0 in " in line for line in hooks), log.read_text()
    everything, one, mig = r.stdout.split("===\n")
    check_gpu_output(everything)
    assert "/dev/nvidia0" in one.split() and "/dev/nvidia1" not in one.split(), one
    # GPU 0's DRI nodes, and the by-path links our hook made for that device only
    assert {"/dev/dri/card1", "/dev/dri/renderD128"} <= set(one.split()) and "/dev/dri/card2" not in one, one
    assert one.split()[-2:] == ["../card1", "../renderD128"], one
    assert {"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap23"} <= set(mig.split()), mig
    assert "/dev/nvidia1" not in mig and "nvidia-cap22" not in mig, mig
    assert mount_table() == before


def _vendor(tmp_path, **edits) -> str:
    """Another vendor's spec (hand-written, YAML): a char device, a bind mount, an env var and
    a createContainer hook that leaves a marker."""
    d = tmp_path / "cdi"
    d.mkdir(exist_ok=True)
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "hello").write_text("vendor data\n")
    spec = {"cdiVersion": "0.5.0", "kind": "example.com/device",
            "devices": [{"name": "foo", "containerEdits": {
                "deviceNodes": [{"path": "/dev/example-null", "hostPath": "/dev/null"}],
                "env": ["EXAMPLE_DEVICE=foo"]}}],
            "containerEdits": {"mounts": [{"hostPath": str(data), "containerPath": "/data",
                                           "options": ["ro", "nosuid", "nodev"]}],
                               "hooks": [{"hookName": "createContainer", "path": "/bin/sh",
                                          "args": ["sh", "-c", f"echo ran > {tmp_path}/marker"]}],
                               **edits}}
    (d / "example.yaml").write_text(yaml.safe_dump(spec))
    return str(d)


def test_another_vendors_devices_are_edited_in(make_bundle, tmp_path, rootfs_debian):
    spec_dir = _vendor(tmp_path)
    script = "echo $EXAMPLE_DEVICE; stat -c '%F %t:%T' /dev/example-null; cat /data/hello; id -G"
    bundle = make_bundle(["sh", "-c", script], annotations={"cdi.k8s.io/test": "example.com/device=foo"})
    before = (mount_table(), tree(rootfs_debian))
    r = sandbox("--cdi-spec-dir", spec_dir, "run", bundle, "--root", tmp_path / "s")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:3] == ["foo", "character special file 1:3", "vendor data"], r.stdout
    assert (tmp_path / "marker").read_text() == "ran\n"
    assert (mount_table(), tree(rootfs_debian)) == before


def test_nvidia_devices_are_served_natively(make_bundle, tmp_path, driver_root):
    """nvidia.com/gpu=1 from our spec: the native path (our mounts, our cache), GPU 1 only."""
    spec = generate(driver_root)
    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi" / "nvidia.yaml").write_text(spec.stdout)
    bundle = make_bundle(["sh", "-c", "ls /dev/nvidia*; cudacheck; echo $NVIDIA_VISIBLE_DEVICES"],
                         annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=1"})
    r = sandbox("--cdi-spec-dir", tmp_path / "cdi", "--driver-root", driver_root, "run", bundle,
                "--root", tmp_path / "s")
    assert r.returncode == 0, r.stderr
    out = r.stdout.split()
    assert "/dev/nvidia1" in out and "/dev/nvidia0" not in out and "cuInit" in r.stdout and out[-1] == "1", r.stdout


def test_round_trip_same_container_as_the_native_path(make_bundle, tmp_path, driver_root):
    """Our spec consumed by our own run gives the container the native request gives: the
    same mounts and the same cache entries."""
    spec = generate(driver_root)
    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi" / "nvidia.yaml").write_text(spec.stdout)
    probe = "awk '{print $5}' /proc/self/mountinfo | sort; cat /etc/ld.so.cache | md5sum"
    native = make_bundle(["sh", "-c", probe], ["NVIDIA_VISIBLE_DEVICES=all"])
    viacdi = make_bundle(["sh", "-c", probe], ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=all"])
    out = [sandbox("--cdi-spec-dir", tmp_path / "cdi", "--driver-root", driver_root, "run", b, "--root",
                   tmp_path / "s") for b in (native, viacdi)]
    assert out[0].returncode == out[1].returncode == 0, (out[0].stderr, out[1].stderr)
    assert out[0].stdout == out[1].stdout


def test_a_bad_spec_is_one_line_and_costs_only_its_own_devices(make_bundle, tmp_path):
    spec_dir = _vendor(tmp_path)
    with open(os.path.join(spec_dir, "broken.yaml"), "w") as f:
        f.write("cdiVersion: 0.5.0\nkind: broken.com/thing\ndevices:\n- name: '1'\n  containerEdits:\n"
                "    deviceNodes:\n    - path: /dev/x\n      colour: blue\n")
    good = make_bundle(["sh", "-c", "echo $EXAMPLE_DEVICE"], annotations={"cdi.k8s.io/a": "example.com/device=foo"})
    r = sandbox("--cdi-spec-dir", spec_dir, "run", good, "--root", tmp_path / "s")
    assert r.returncode == 0 and r.stdout == "foo\n", r.stderr
    bad = make_bundle(["true"], annotations={"cdi.k8s.io/a": "broken.com/thing=1"})
    r = sandbox("--cdi-spec-dir", spec_dir, "run", bad, "--root", tmp_path / "s")
    line, = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "broken.com/thing=1" in line and "broken.yaml" in line and "colour" in line, line
    assert not os.listdir(tmp_path / "s")


def test_cdi_hook_refuses_bad_arguments_in_one_line(tmp_path):
    r = subprocess.run([*CLI, "cdi", "hook", "--link", "no-separator"], input='{"id":"x","pid":1,"bundle":"/"}',
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.strip() == (
        "sandbox cdi: --link 'no-separator': expected RELATIVE-CONTENT::/ABSOLUTE/PATH"), r.stderr


def test_the_hook_serves_nvidias_cdi_names_and_refuses_others(make_bundle, driver_root, tmp_path):
    from tests.integration.test_hook import install, runc

    bundle = make_bundle(["sh", "-c", "ls /dev/nvidia*; cudacheck"], ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0"])
    install(bundle, driver_root)
    r = runc(bundle, tmp_path / "state", "ch1")
    assert r.returncode == 0 and "/dev/nvidia0" in r.stdout and "/dev/nvidia1" not in r.stdout, r.stderr
    assert "cuInit found" in r.stdout
    other = make_bundle(["true"], annotations={"cdi.k8s.io/x": "example.com/device=foo"})
    install(other, driver_root)
    r = runc(other, tmp_path / "state", "ch2")
    assert r.returncode != 0 and "sandbox hook: CDI device 'example.com/device=foo'" in r.stderr, r.stderr


def test_cdi_hook_outside_the_containers_mount_namespace_mounts_nothing(make_bundle, tmp_path):
    """Run by hand with a state naming a process of the host's mount namespace, it would mount
    in the host's tree: refused, nothing left."""
    bundle = make_bundle(["true"])
    before = mount_table()
    state = json.dumps({"id": "x", "pid": os.getpid(), "bundle": str(bundle)})
    r = subprocess.run([*CLI, "cdi", "hook", "--link", "libx.so.1::/usr/lib/x86_64-linux-gnu/libx.so",
                        "--cache-entry", "libx.so.1::/usr/lib/x86_64-linux-gnu/libx.so.1::0x303"],
                       input=state, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "refusing to mount" in r.stderr, r.stderr
    assert mount_table() == before


def test_the_env_asks_for_nvidias_devices_only(make_bundle, tmp_path):
    """NVIDIA_VISIBLE_DEVICES is the pod author's to write: another vendor's device (its host
    mounts, its hooks) is asked for by annotation, never through it."""
    spec_dir = _vendor(tmp_path)
    bundle = make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=example.com/device=foo"])
    r = sandbox("--cdi-spec-dir", spec_dir, "run", bundle, "--root", tmp_path / "s")
    assert r.returncode == 2 and "only nvidia.com devices" in r.stderr and not (tmp_path / "marker").exists(), r.stderr


def test_the_cdi_hook_writes_a_loader_file_as_given(make_bundle, tmp_path, rootfs_debian):
    """--file (what generate writes for a host ICD file that names a host path): runc runs
    the hook as createContainer, the container reads that content, read-only; the image
    keeps its own file."""
    content = '{"file_format_version":"1.0.0","ICD":{"library_path":"libnvidia-egl-gbm.so.1"}}'
    target = "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json"
    bundle = make_bundle(["sh", "-c", f"cat {target}; echo; touch {target} 2>&1 | tail -1"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["hooks"] = {"createContainer": [{"path": CLI[0], "args": [*CLI, "cdi", "hook", "--file",
                                                                    f"{target}::{content}"]}]}
    (bundle / "config.json").write_text(json.dumps(spec))
    before = (mount_table(), tree(rootfs_debian))
    r = subprocess.run(["runc", "--root", str(tmp_path / "runc"), "run", "-b", str(bundle), f"f{os.getpid()}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == content and "Read-only file system" in lines[1], r.stdout
    assert (mount_table(), tree(rootfs_debian)) == before


@pytest.mark.parametrize("args,message", [
    (["--file", "/etc/a.json::x", "--file", "/etc//a.json::y"], "--file '/etc//a.json': given twice"),
    (["--cache-entry", "libx.so.1::/usr/lib/libx.so.1::0x1ffffffff"], "FLAGS is out of range"),
])
def test_cdi_hook_arguments_are_checked_in_one_line(args, message):
    r = subprocess.run([*CLI, "cdi", "hook", *args], input='{"id":"x","pid":1,"bundle":"/"}',
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_the_hook_finds_the_containers_mount_namespace_by_the_states_pid():
    """The state's pid decides, not our ancestors: seen in another mount namespace it is
    joined (createRuntime, the warm server's child, whatever namespaces its parents are in);
    ours, and ours not the host's, means we are in it (createContainer)."""
    init = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "30"])
    try:
        ours = os.stat("/proc/self/ns/mnt").st_ino
        deadline = time.monotonic() + 10
        while os.stat(f"/proc/{init.pid}/ns/mnt").st_ino == ours and time.monotonic() < deadline:
            time.sleep(0.01)
        probe = f"from sandbox.verbs.cdi import _mount_here; print(_mount_here({init.pid}))"
        # from a mount namespace of its own, its parent in another (as a server started inside
        # a private namespace by a script is): the container's is elsewhere, to be joined
        r = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", probe],
                           capture_output=True, text=True, timeout=30, cwd=REPO)
        assert r.stdout.strip() == "False", r.stderr
        # in the container's mount namespace itself: mount there
        r = subprocess.run(["nsenter", "-t", str(init.pid), "-m", sys.executable, "-c", probe],
                           capture_output=True, text=True, timeout=30, cwd=REPO)
        assert r.stdout.strip() == "True", r.stderr
    finally:
        init.kill()
        init.wait()
