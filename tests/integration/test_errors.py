"""Every failure is one line on stderr and exit 1 or 2, never a traceback, and leaves nothing
behind: the inputs that used to crash, malformed driver-root files, and hypothesis sweeps of
config.json, the NVIDIA_* variables and the CLI flags through the CLI itself."""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import subprocess
import sys

import fixtures
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox import cli
from tests.integration.helpers import alive, children, mount_table, sandbox, tree

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
