"""Every failure is one line on stderr and exit 1 or 2, never a traceback, and leaves nothing
behind: the inputs that used to crash, malformed driver-root files, and hypothesis sweeps of
config.json, the NVIDIA_* variables and the CLI flags through the CLI itself."""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import fixtures
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox import cli
from tests.integration.helpers import alive, children, create, mount_table, sandbox, stand_in, tree

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


def one_line(r: subprocess.CompletedProcess, code: int, *words: str) -> None:
    lines = [line for line in r.stderr.strip().splitlines() if ": warning: " not in line]
    assert r.returncode == code, (r.returncode, r.stderr)
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.fixture
def synthetic(tmp_path):
    """A private copy of a small driver root (its own dev/zero for the links to find)."""
    root = tmp_path / "driver"
    subprocess.run(["cp", "-a", fixtures.synthetic_driver(3), root], check=True)  # nodes too
    return root


def _set(spec: dict, path: str, value) -> None:
    *head, last = path.split(".")
    for key in head:
        spec = spec.setdefault(key, {})
    spec[last] = value


def _bundle(make_bundle, env=(), **changes):
    bundle = make_bundle(["true"], list(env))
    spec = json.loads((bundle / "config.json").read_text())
    for path, value in changes.items():
        _set(spec, path.replace("__", "."), value)
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


DEEP = 100_000


@pytest.mark.parametrize("changes,words", [  # (each rule and every parser case: tests/mounts/test_bundle.py)
    ({"linux__resources": "DEEP"}, ["nested too deeply"]),
    ({"process__user__uid": 2**64}, ["process.user.uid", "out of range"]),
    ({"mounts": [{"destination": "/mnt", "type": "bind", "source": "/tmp\0", "options": ["bind"]}]},
     ["$.mounts[0].source", "NUL"]),
    ({"linux__namespaces": [{"type": "mount"}, {"type": "time"}]}, ["linux.namespaces[1].type"]),
])
def test_bad_config_is_one_line_exit_2(changes, words, make_bundle, tmp_path, rootfs_debian):
    """From the command line: exit 2, one line, and nothing done (no mount, no state)."""
    before = (mount_table(), tree(rootfs_debian))
    bundle = make_bundle(["true"])
    if changes.get("linux__resources") == "DEEP":
        text = (bundle / "config.json").read_text()
        text = text.replace('"resources": {', '"resources": {"x": ' + "[" * DEEP + "]" * DEEP + ", ", 1)
        (bundle / "config.json").write_text(text)
    else:
        bundle = _bundle(make_bundle, **changes)
    r = sandbox("run", bundle, "--root", tmp_path / "state")
    one_line(r, 2, "config.json", *words)
    assert (mount_table(), tree(rootfs_debian)) == before
    assert not os.listdir(tmp_path / "state") if (tmp_path / "state").exists() else True


@pytest.mark.parametrize("env,flags,words", [
    (["NVIDIA_VISIBLE_DEVICES=\u00b2"], [], ["unknown device '\u00b2'"]),
    (["NVIDIA_VISIBLE_DEVICES=\u0661"], [], ["unknown device '\u0661'"]),  # Arabic-Indic one
    (["NVIDIA_VISIBLE_DEVICES=\uff10"], [], ["unknown device '\uff10'"]),  # fullwidth zero
    (["NVIDIA_VISIBLE_DEVICES=" + "1" * 5000], [], ["unknown device"]),
    (["NVIDIA_VISIBLE_DEVICES=all"], ["--gpus", "\u00b2"], ["--gpus", "unknown device"]),
    (["NVIDIA_VISIBLE_DEVICES=all"], ["--capabilities", "all,foo"], ["unknown capability 'foo'"]),
    (["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=all,foo"], [], ["unknown capability 'foo'"]),
    (["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_REQUIRE_CUDA=cuda>=\u0661\u0662"], [], ["is not a version"]),
    (["NVIDIA_VISIBLE_DEVICES=0000:3b:00.\u0660"], [], ["unknown device"]),
])
def test_bad_gpu_request_is_one_line_exit_2(env, flags, words, make_bundle, tmp_path, driver_root):
    r = sandbox("run", make_bundle(["true"], env), "--driver-root", driver_root,
                "--root", tmp_path / "state", *flags)
    one_line(r, 2, *words)


def test_trace_into_a_missing_directory_fails_before_the_container_runs(make_bundle, tmp_path):
    marker = tmp_path / "ran"
    bundle = make_bundle(["sh", "-c", "echo ran"])
    r = sandbox("run", bundle, "--root", tmp_path / "state", "--trace", tmp_path / "nowhere/t.json")
    one_line(r, 1, "--trace", "does not exist")
    assert "ran" not in r.stdout and not marker.exists()


def test_a_driver_library_with_absurd_program_headers(synthetic, make_bundle):
    """e_phnum = 0xFFFF and a PT_DYNAMIC that claims exabytes: an error naming the file,
    never a MemoryError."""
    lib = next((synthetic / fixtures.ARCH_DIR).glob("libcuda.so.*.*"))
    data = bytearray(lib.read_bytes())
    data[56:58] = (0xFFFF).to_bytes(2, "little")  # e_phnum of a 64-bit header
    lib.write_bytes(bytes(data) + b"\0" * (0xFFFF * 56))
    r = sandbox("plan", make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=all"]), "--driver-root", synthetic)
    one_line(r, 1, str(lib.name), "malformed")


def test_version_and_libraries_that_disagree(synthetic, make_bundle):
    version = synthetic / "proc/driver/nvidia/version"
    version.write_text(version.read_text().replace("999.1.2", "999.9.9"))
    r = sandbox("plan", make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=all"]), "--driver-root", synthetic)
    one_line(r, 1, "999.9.9", "999.1.2", "does not match")


def test_a_libcuda_link_loop_is_an_error_not_a_dropped_library(synthetic, make_bundle):
    link = synthetic / fixtures.ARCH_DIR / "libcuda.so.1"
    link.unlink()
    link.symlink_to("libcuda.so.1")
    r = sandbox("plan", make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=all"]), "--driver-root", synthetic)
    one_line(r, 1, "libcuda.so.1", "loop")


DRIVER_FILES = ["etc/ld.so.cache", "proc/driver/nvidia/version", "proc/driver/nvidia/gpus/0000:10:00.0/information",
                "proc/devices"]


@pytest.mark.parametrize("kind", ["fifo", "abs-link-to-dev-zero", "rel-link-out-of-root", "directory", "dangling"])
@pytest.mark.parametrize("rel", DRIVER_FILES)
def test_driver_files_that_are_not_regular_files(rel, kind, synthetic, make_bundle):
    """Would hang (a FIFO) or grow without bound (/dev/zero): a one-line error naming the
    path instead, quickly, and never a silent skip."""
    os.mknod(synthetic / "dev/zero", 0o666 | stat.S_IFCHR, os.makedev(1, 5))
    path = synthetic / rel
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "abs-link-to-dev-zero":
        path.symlink_to("/dev/zero")  # inside the driver root: its own dev/zero
    elif kind == "rel-link-out-of-root":
        path.symlink_to("../" * 12 + "dev/zero")  # clamped at the driver root, as ".." at "/"
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to("/nonexistent/file")
    r = sandbox("plan", make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=all"]), "--driver-root", synthetic,
                timeout=20)
    one_line(r, 1, str(synthetic))


def test_hook_takes_a_relative_driver_root_relative_to_its_cwd(make_bundle, driver_root):
    """The hook chdirs to "/" before it works: a relative --driver-root is made absolute first.
    (Our own pid is given as the container's: the hook refuses it after planning, which
    shows the driver root was found.)"""
    bundle = make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=all"])
    state = json.dumps({"ociVersion": "1.0.2", "id": "x", "pid": os.getpid(), "bundle": str(bundle)})
    r = subprocess.run([sys.executable, "-m", "sandbox.cli", "hook", "--driver-root", driver_root.name],
                       input=state, capture_output=True, text=True, cwd=driver_root.parent, timeout=30)
    one_line(r, 1, "shares our mount namespace")


# --- hypothesis sweeps -------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
FIELDS = ["process.args", "process.env", "process.cwd", "process.user", "process.user.uid",
          "process.user.additionalGids", "process.rlimits", "process.capabilities",
          "process.capabilities.bounding", "process.noNewPrivileges", "process.terminal", "root",
          "root.path", "root.readonly", "hostname", "mounts", "linux", "linux.devices", "linux.namespaces",
          "linux.maskedPaths", "linux.resources", "annotations", "ociVersion", "hooks"]
NVIDIA_VARS = ["NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_REQUIRE_CUDA",
               "NVIDIA_REQUIRE_DRIVER", "CUDA_VERSION", "NVIDIA_DISABLE_REQUIRE"]
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=24) | \
    st.sampled_from(["all", "none", "void", "0", "1", "0,1", "GPU-", "0000:3b:00.0", "compute,utility",
                     "cuda>=12.0", "driver>=535 cuda>=99", "12.2", "true", "MIG-1", "0:1:0", "",
                     "\u00b2", "\u0661", "\uff10", "1" * 5000, "all,foo", "cuda>=\u0661", "0000:3b:00.\u0660"])


def _cli(argv: list[str]) -> tuple[int, str]:
    """cli.main in this process: any exception that escapes it is a crash the user would see
    as a traceback, so it fails the test as it is."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli.main(argv)
        except SystemExit as e:  # argparse's own refusal: one line too, exit 2
            code = e.code
    return code, err.getvalue()


def _check(code: int, err: str) -> None:
    if code == 0:
        return
    assert code in (1, 2), (code, err)
    lines = [line for line in err.strip().splitlines() if "warning" not in line]
    assert len(lines) == 1 and lines[0].startswith("sandbox "), err


SWEEP = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


@SWEEP
@given(field=st.sampled_from(FIELDS), value=JSON)
def test_sweep_config_json(tmp_path_factory, field, value):
    bundle = tmp_path_factory.mktemp("b")
    spec = fixtures.default_spec(["true"], ["NVIDIA_VISIBLE_DEVICES=all"], str(fixtures.rootfs("debian")))
    _set(spec, field, value)
    (bundle / "config.json").write_text(json.dumps(spec))
    _check(*_cli(["plan", str(bundle), "--driver-root", str(fixtures.synthetic_driver(3))]))


@SWEEP
@given(env=st.dictionaries(st.sampled_from(NVIDIA_VARS), TEXT, max_size=4),
       gpus=st.none() | TEXT, caps=st.none() | TEXT)
def test_sweep_nvidia_env_and_flags(tmp_path_factory, env, gpus, caps):
    bundle = fixtures.bundle(tmp_path_factory.mktemp("b"), fixtures.rootfs("debian"), ["true"],
                             [f"{k}={v}" for k, v in env.items()])
    argv = ["plan", str(bundle), "--driver-root", str(fixtures.synthetic_driver(3))]
    argv += ["--gpus", gpus] if gpus is not None else []
    argv += ["--capabilities", caps] if caps is not None else []  # "-x" values: argparse refuses
    _check(*_cli(argv))


PROCESS_FIELDS = ["process.user.uid", "process.user.gid", "process.user.umask", "process.rlimits",
                  "process.cwd", "process.args", "process.capabilities.bounding", "process.env", "hostname",
                  "linux.namespaces", "linux.devices", "mounts"]


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(field=st.sampled_from(PROCESS_FIELDS), value=JSON, gpu=st.booleans())
def test_sweep_run_leaves_nothing_behind(tmp_path_factory, field, value, gpu):
    """The whole start, gofer included, on mutated process fields: one line or a run, and in
    every case no mount, state directory or process left."""
    rootfs = fixtures.rootfs("debian")
    tmp = tmp_path_factory.mktemp("r")
    env = ["NVIDIA_VISIBLE_DEVICES=all"] if gpu else []
    spec = fixtures.default_spec(["true"], env, str(rootfs))
    _set(spec, field, value)
    (tmp / "config.json").write_text(json.dumps(spec))
    before = (mount_table(), tree(rootfs), children(os.getpid()))
    r = sandbox("run", tmp, "--root", tmp / "state", "--driver-root", fixtures.driver_535(), timeout=30)
    if r.returncode > 128:  # the container's process killed by a signal (a tiny rlimit...): said by
        # the exit status alone, as runc's; a crash of ours would print (a traceback, a line)
        assert not [line for line in r.stderr.splitlines() if "warning" not in line], (r.returncode, r.stderr)
    else:
        _check(r.returncode if r.returncode != 127 else 1, r.stderr)  # (127: exec failed, one line)
    assert "Traceback" not in r.stderr
    assert (mount_table(), tree(rootfs)) == before[:2]
    assert not any(alive(p) for p in children(os.getpid()) if p not in before[2])
    assert not (tmp / "state").exists() or not os.listdir(tmp / "state")


# --- issue #29 (finding 10, and 2's --preserve-fds): each bad input one line naming the field,
# in Python and served alike (the warm server: tests/integration/test_served.py), and nothing left

LAUNCHER = Path(__file__).resolve().parents[2] / ".venv/bin/sandbox"
MODES = ["own", "served"]


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """`sandbox serve` on a socket of this module's (scripts/engines.py's WarmServer)."""
    import engines

    if not LAUNCHER.is_file() or LAUNCHER.read_bytes()[:4] != b"\x7fELF":
        pytest.skip("the C launcher is not built (scripts/setup builds it)")
    with engines.WarmServer(tmp_path_factory.mktemp("warm")) as server:
        yield server


def unique(name: str) -> str:
    """A container id no one else's is: the default cgroupsPath is the id, and other test
    sessions on the host make theirs too."""
    return f"{name}-{os.getpid()}"


def launcher(mode: str, warm, *args, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    """The `sandbox` executable, served (``mode`` "served") or in its own Python."""
    env = dict(os.environ, SANDBOX_SERVER=str(warm.path) if mode == "served" else "")
    return subprocess.run([str(LAUNCHER), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=env, stdin=subprocess.DEVNULL, **kw)


def _cgroups_named(name: str) -> list[str]:
    return [d for d in glob.glob(f"/sys/fs/cgroup/*/{name}") + glob.glob(f"/sys/fs/cgroup/{name}") if os.path.isdir(d)]


def _mounts(tmp_path: Path) -> list[tuple[str, str, str]]:
    """The host's mounts but other sessions' (under /tmp and /work, not ours: an engine's
    test elsewhere on the host mounts and unmounts its containers' roots meanwhile)."""
    ours = (str(tmp_path.parent), str(Path(__file__).resolve().parents[2]))
    return [m for m in mount_table() if not m[0].startswith(("/tmp/", "/work/")) or m[0].startswith(ours)]


def _nothing_left(before, state: Path, cgroup: str, rootfs) -> None:
    assert not state.exists() or not os.listdir(state), os.listdir(state)
    assert not _cgroups_named(cgroup), _cgroups_named(cgroup)
    assert (_mounts(state.parent), tree(rootfs)) == before[:2]
    deadline = time.monotonic() + 5  # (the launcher's children, reaped by now; a served one's waiter: soon)
    while any(alive(p) for p in children(os.getpid()) if p not in before[2]) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(alive(p) for p in children(os.getpid()) if p not in before[2])


BAD_INPUT = [  # (config.json's changes, the words of the one line)
    ({"hostname": "h" * 65}, ["config.json: hostname: 65 bytes is over the kernel's limit of 64"]),
    ({"linux__sysctl": {"net.ipv4.nope_nope": "1"}},
     ["linux.sysctl: 'net.ipv4.nope_nope': no such sysctl in the container's namespaces"]),
    ({"process__user__additionalGids": list(range(1, 70001))},
     ["config.json: process.user.additionalGids: 70000 groups is over the kernel's limit of 65536"]),
    ({"process__rlimits": [{"type": "RLIMIT_NOFILE", "hard": 2**63, "soft": 2**63}]},  # (over fs.nr_open)
     ["process.rlimits[0]: RLIMIT_NOFILE soft 9223372036854775808 hard 9223372036854775808: Operation not "
      "permitted"]),
    ({"process__rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 2**63}]},
     ["config.json: process.rlimits[0]: RLIMIT_NOFILE soft 9223372036854775808 is above hard 1024"]),
    ({"linux__resources__memory": {"limit": 4096}}, ["config.json: linux.resources.memory.limit: 4096 is below"]),
    ({"hooks": {"prestart": [{"path": "bin/true"}]}}, ["config.json: hooks.prestart[0].path: 'bin/true'"]),
    ({"process__env": ["PATH=/bin:/usr/bin", "FOO"]}, ["config.json: process.env[1]: 'FOO' is not NAME=VALUE"]),
    ({"linux__devices": [{"path": "/dev/..", "type": "c", "major": 1, "minor": 3}]},
     ["config.json: linux.devices[0].path: '/dev/..'"]),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("changes,words", BAD_INPUT, ids=[next(iter(c)) for c, _ in BAD_INPUT])
def test_bad_input_is_one_line_naming_the_field(mode, changes, words, warm, make_bundle, tmp_path, rootfs_debian):
    """Each said with no field before ("[Errno 22]", "[Errno 11]", "Python int too large",
    a killed launcher), or accepted (a relative hook, an env entry without "="): exit 2,
    one line, no state, cgroup, process or mount left, the image untouched."""
    cgroup = f"sandbox-input-{os.getpid()}-{mode}"
    bundle = _bundle(make_bundle, **changes, linux__cgroupsPath=f"/{cgroup}")
    before = (_mounts(tmp_path), tree(rootfs_debian), children(os.getpid()))
    r = launcher(mode, warm, "--root", tmp_path / "state", "run", "-b", bundle, unique("bad"))
    one_line(r, 2, *words)
    _nothing_left(before, tmp_path / "state", cgroup, rootfs_debian)


@pytest.mark.parametrize("mode", MODES)
def test_a_device_path_through_dotdot_is_made_inside_the_root(mode, warm, make_bundle, tmp_path, rootfs_debian):
    """runc takes /etc/../../x as /x (securejoin): so do we, the node in our overlay of the
    root, the image untouched (it said "[Errno 9] Bad file descriptor": the overlay of the
    root left /dev's fd stale)."""
    before = tree(rootfs_debian)
    devices = [{"path": "/etc/../../x", "type": "c", "major": 1, "minor": 3, "fileMode": 0o640},
               {"path": "/y", "type": "c", "major": 1, "minor": 5}]
    bundle = _bundle(make_bundle, process__args=["sh", "-c", "ls -ln /x /y /dev/null; ls /dev/fd/ >/dev/null && "
                                                 "echo fd; echo 1 >/x && head -c 3 /y | wc -c"],
                     linux__devices=devices)
    r = launcher(mode, warm, "--root", tmp_path / "state", "run", "-b", bundle, unique("dev"))
    assert r.returncode == 0, r.stderr
    lines = [line.split() for line in r.stdout.splitlines()]  # (mode, links, uid, gid, major, minor, date, path)
    assert [(f[0], f[4], f[5], f[-1]) for f in lines[:3]] == [
        ("crw-rw-rw-", "1,", "3", "/dev/null"), ("crw-r-----", "1,", "3", "/x"), ("crw-rw-rw-", "1,", "5", "/y")], lines
    assert lines[3:] == [["fd"], ["3"]], lines  # (/dev as it was: its links too)
    assert tree(rootfs_debian) == before


@pytest.fixture
def netns_with_a_dotted_interface():
    """A network namespace of the test's own (its process's), with a bridge named d.100."""
    holder = subprocess.Popen(["unshare", "--net", "--", "sleep", "600"])
    try:
        path = f"/proc/{holder.pid}/ns/net"
        deadline = time.monotonic() + 5
        while os.readlink(path) == os.readlink("/proc/self/ns/net") and time.monotonic() < deadline:
            time.sleep(0.01)
        subprocess.run(["nsenter", f"--net={path}", "ip", "link", "add", "d.100", "type", "bridge"], check=True)
        yield path
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("mode", MODES)
def test_a_sysctl_of_an_interface_with_a_dot(mode, warm, make_bundle, tmp_path, netns_with_a_dotted_interface):
    """sysctl(8)'s two forms of d.100's keys: net.ipv4.conf.d/100.forwarding (a "/" for the
    name's dot) and net/ipv4/conf/d.100/rp_filter, each written to conf/d.100/ (it wrote
    conf/d/100/: no such file)."""
    path = netns_with_a_dotted_interface
    namespaces = [{"type": t} for t in ("pid", "ipc", "uts", "mount")] + [{"type": "network", "path": path}]
    bundle = _bundle(make_bundle, process__args=["cat", "/proc/sys/net/ipv4/conf/d.100/forwarding",
                                                 "/proc/sys/net/ipv4/conf/d.100/rp_filter"],
                     linux__namespaces=namespaces,
                     linux__sysctl={"net.ipv4.conf.d/100.forwarding": "1", "net/ipv4/conf/d.100/rp_filter": "2"})
    r = launcher(mode, warm, "--root", tmp_path / "state", "run", "-b", bundle, unique("sysctl"))
    assert (r.returncode, r.stdout.split()) == (0, ["1", "2"]), r.stderr


@pytest.mark.parametrize("mode", MODES)
def test_a_missing_bundle_is_one_line(mode, warm, tmp_path):
    r = launcher(mode, warm, "--root", tmp_path / "state", "run", tmp_path / "missing")
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"sandbox run: {tmp_path}/missing: no such directory (the "
                                                  "bundle: a directory with a config.json)\n")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("limit", [1, 2, 3])
def test_a_low_pids_limit_the_runtime_fits_in_runs(mode, limit, warm, make_bundle, tmp_path):
    """A create has four processes in the container's cgroup while it is made (the launcher,
    pid 1, the gofer, its builder, a createContainer hook): the limit is written once they are
    gone, and holds for the container (a limit of 1: its shell cannot fork)."""
    bundle = _bundle(make_bundle, process__args=["sh", "-c", "echo ok; read m </sys/fs/cgroup/pids/pids.max; echo $m; (true) && echo forked"],
                     linux__resources__pids={"limit": limit}, hooks={"createContainer": [{"path": "/bin/true"}]})
    r = launcher(mode, warm, "--root", tmp_path / "state", "run", "-b", bundle, unique("pids"))
    assert r.stdout.split() == ["ok", str(limit), *(["forked"] if limit > 1 else [])], r.stderr


@pytest.mark.parametrize("mode", MODES)
def test_a_foreground_runs_launcher_keeps_its_own_oom_score_adj(mode, warm, make_bundle, tmp_path):
    """process.oomScoreAdj is the container's: a served run's launcher (pid 1's parent while it
    runs) wrote it to itself to pass it on, and kept it."""
    with open("/proc/self/oom_score_adj") as f:
        ours = f.read().strip()
    bundle = _bundle(make_bundle, process__args=["sh", "-c", "cat /proc/self/oom_score_adj; sleep 3"],
                     process__oomScoreAdj=500)
    env = dict(os.environ, SANDBOX_SERVER=str(warm.path) if mode == "served" else "")
    p = subprocess.Popen([str(LAUNCHER), "--root", str(tmp_path / "state"), "run", "-b", str(bundle), unique("oom")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(_comm(c) == "sleep" for c in _descendants(p.pid)):
            time.sleep(0.02)
        assert any(_comm(c) == "sleep" for c in _descendants(p.pid)), "the container never ran"
        with open(f"/proc/{p.pid}/oom_score_adj") as f:
            launcher_oom = f.read().strip()
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
        p.wait()
    assert (p.returncode, out, launcher_oom) == (0, "500\n", ours), err


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _planners(mode: str, warm) -> list[int]:
    """The processes under the planner of ``mode``: the warm server, or an own planner."""
    if mode == "served":
        return _descendants(warm.proc.pid)
    tops = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and Path(f"/proc/{entry}/cmdline").read_bytes().endswith(b"\0serve\0--once\0"):
                tops.append(int(entry))
        except OSError:
            pass
    return [pid for top in tops for pid in _descendants(top)]


@pytest.mark.parametrize("mode", MODES)
def test_a_create_whose_gofer_is_killed_says_so(mode, warm, make_bundle, tmp_path, rootfs_debian):
    """The gofer (and pid 1 with it) SIGKILLed while a prestart hook runs: the supervisor's
    Resume met the dead socket and said "Broken pipe"; it says what died, and leaves nothing."""
    cgroup = f"sandbox-input-{os.getpid()}-killed-{mode}"
    bundle = _bundle(make_bundle, hooks={"prestart": [{"path": "/bin/sleep", "args": ["sleep", "2"]}]},
                     linux__cgroupsPath=f"/{cgroup}")
    before = (_mounts(tmp_path), tree(rootfs_debian), children(os.getpid()))
    env = dict(os.environ, SANDBOX_SERVER=str(warm.path) if mode == "served" else "")
    with open(tmp_path / "create.err", "w+") as err:
        p = subprocess.Popen([str(LAUNCHER), "--root", str(tmp_path / "state"), "create", "-b", str(bundle), unique("k")],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env)
        # ours only: the warm server's descendants (the test's own), or the launcher's own
        # planner's (`serve --once`, detached from it)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(_comm(c) == "sleep" for c in _planners(mode, warm)):
            time.sleep(0.02)
        for pid in _planners(mode, warm):
            if _comm(pid) == "sandbox-gofer":
                os.kill(pid, signal.SIGKILL)
        assert p.wait(timeout=30) == 1
        time.sleep(0.5)  # (a served create's line comes from the server's child, through our stderr)
        err.seek(0)
        text = err.read()
    assert text in ("sandbox create: the container's init or its builder was killed by signal 9 before it was ready\n",
                    "sandbox create: the gofer was killed by signal 9 before the container started\n"), text
    _nothing_left(before, tmp_path / "state", cgroup, rootfs_debian)


@pytest.mark.parametrize("mode", MODES)
def test_a_negative_preserve_fds_starts_nothing(mode, warm, make_bundle, tmp_path):
    """`exec 5</; sandbox run --preserve-fds -4 ...` passed every fd on (5 -> / in the
    container) where runc passes none: one line, exit 2, nothing started, for run, create
    and exec."""
    bundle = _bundle(make_bundle, process__args=["sh", "-c", "echo ran; ls -l /proc/self/fd"])
    root = tmp_path / "state"
    env = dict(os.environ, SANDBOX_SERVER=str(warm.path) if mode == "served" else "")

    def with_fd_5(*args):
        return subprocess.run(["bash", "-c", 'exec 5</; exec "$@"', "bash", str(LAUNCHER), "--root", str(root),
                               *map(str, args)], capture_output=True, text=True, timeout=60, env=env,
                              stdin=subprocess.DEVNULL)

    cid = unique("p1")
    for argv in (["run", "--preserve-fds", "-4", "-b", bundle, cid], ["run", "--preserve-fds=-1", "-b", bundle, cid],
                 ["create", "--preserve-fds", "-4", "-b", bundle, cid]):
        r = with_fd_5(*argv)
        one_line(r, 2, "--preserve-fds: must be 0 or more")
        assert "ran" not in r.stdout and (not root.exists() or not os.listdir(root)), argv
    live = unique("live")
    r = create(root, make_bundle(["sleep", "100"]), live, log=tmp_path / "create.log")
    assert r.returncode == 0, (tmp_path / "create.log").read_text()
    try:
        r = with_fd_5("exec", "--preserve-fds", "-4", live, "sh", "-c", "echo ran")
        one_line(r, 2, "--preserve-fds: must be 0 or more")
        assert "ran" not in r.stdout
        # (and exec's -e as runc reads it: NAME=VALUE, else "invalid environment variable")
        r = launcher(mode, warm, "--root", root, "exec", "-e", "FOO", live, "sh", "-c", "echo ran")
        one_line(r, 2, "--env 'FOO': expected NAME=VALUE")
        assert "ran" not in r.stdout
    finally:
        launcher("own", warm, "--root", root, "delete", "--force", live)


@pytest.mark.parametrize("preserve", ["-4", "-1", "x", "", "0"])
def test_the_launcher_refuses_a_negative_preserve_in_a_plan(preserve, tmp_path):
    """frontend.c read "preserve N" with atoi: -4 kept every fd past stdio (3 + (unsigned)-4).
    A plan with one is not carried out at all; "0" is (the stand-in's plan runs)."""
    if not LAUNCHER.is_file() or LAUNCHER.read_bytes()[:4] != b"\x7fELF":
        pytest.skip("the C launcher is not built (scripts/setup builds it)")
    marker = tmp_path / "ran"
    plan = b"".join(r.encode() + b"\0" for r in ["plan 1", "detach 1", f"preserve {preserve}".rstrip(),
                                                  "arg /bin/sh", "arg -c", f"arg touch {marker}"])
    thread = stand_in(tmp_path / "s.sock", [plan, b'{"code": 0}'])  # (the plan, then the code for the report)
    r = subprocess.run([str(LAUNCHER), "--root", str(tmp_path / "state"), "exec", "x", "true"], capture_output=True,
                       text=True, timeout=30, env=dict(os.environ, SANDBOX_SERVER=str(tmp_path / "s.sock")),
                       stdin=subprocess.DEVNULL)
    thread.join(10)
    deadline = time.monotonic() + 5
    if preserve == "0":
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (r.returncode, r.stderr, marker.exists()) == (0, "", True)
    else:
        assert (r.returncode, r.stderr) == (1, "sandbox exec: the server's plan is not one this launcher reads "
                                               "(rebuild both)\n")
        time.sleep(0.2)
        assert not marker.exists()


@pytest.mark.parametrize("mode", MODES)
def test_bytes_that_are_not_utf8_and_a_closed_stdin_reach_the_container_as_they_are(mode, warm, make_bundle, tmp_path):
    """An argument and a variable that are not UTF-8 go to the planner as Python's
    surrogateescape reads them back, and the container gets the very bytes; a closed stdin is
    /dev/null in the container, as under runc (such verbs went to a second path). A bundle
    path that is not UTF-8 is one line (the state records it as a JSON string; it was a
    traceback)."""
    env = dict(os.environ, SANDBOX_SERVER=str(warm.path) if mode == "served" else "")
    cid, root = unique("odd").encode(), os.fsencode(tmp_path / "state")
    sb = [os.fsencode(str(LAUNCHER)), b"--root", root]
    odd = os.fsencode(tmp_path) + b"/b\xff"
    bundle = _bundle(make_bundle, process__args=["sleep", "60"])
    os.symlink(bundle, odd)
    r = subprocess.run([*sb, b"run", b"-d", b"-b", odd, cid], capture_output=True, timeout=60, env=env,
                       stdin=subprocess.DEVNULL)
    assert (r.returncode, r.stderr) == (2, b"sandbox run: --bundle " + repr(odd).encode() + b": not UTF-8 (the container's state "
                                        b"and spec record paths as JSON strings)\n")
    with open(tmp_path / "run.err", "w+") as err:  # (the container keeps what it is given: no pipe)
        r = subprocess.run([*sb, b"run", b"-d", b"-b", os.fsencode(bundle), cid], timeout=60, env=env,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    assert r.returncode == 0, (tmp_path / "run.err").read_text()
    try:
        r = subprocess.run([*sb, b"exec", b"--env", b"X=\xfd", cid, b"sh", b"-c",
                            b'printf %s "$0$X" | od -An -tx1; readlink /proc/self/fd/0', b"\xfe"],
                           capture_output=True, timeout=60, env=env, stdin=subprocess.DEVNULL,
                           preexec_fn=lambda: os.close(0))
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [b"fe", b"fd", b"/dev/null"], r.stdout
    finally:
        subprocess.run([*sb, b"delete", b"--force", cid], capture_output=True, env=env)
