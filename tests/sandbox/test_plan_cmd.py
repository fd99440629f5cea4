"""`sandbox plan` end to end, as a user runs it."""

import json

import pytest

from tests.integration.helpers import sandbox


def test_json_plan(make_bundle, driver_root, driver_version):
    b = make_bundle(env=["NVIDIA_VISIBLE_DEVICES=1"])
    r = sandbox("plan", b, "--driver-root", driver_root, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["driver"]["version"] == driver_version
    assert [g["index"] for g in out["gpus"]] == [1]
    kinds = {a["kind"] for a in out["actions"]}
    assert kinds <= {"library", "binary", "firmware", "ipc", "device", "symlink", "ldcache", "procfs", "config"}
    assert all({"kind", "source", "target", "flags"} <= a.keys() for a in out["actions"])


@pytest.mark.parametrize("by", ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0", "annotation"])
def test_a_cdi_name_plans_what_run_mounts(by, make_bundle, driver_root):
    """One request path (mounts.request.resolve): the plan of a bundle asking by CDI name is
    the plan of the GPU it names."""
    if by == "annotation":
        b = make_bundle(annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
    else:
        b = make_bundle(env=[by])
    by_cdi = sandbox("plan", b, "--driver-root", driver_root, "--json")
    by_index = sandbox("plan", make_bundle(env=["NVIDIA_VISIBLE_DEVICES=0"]), "--driver-root", driver_root, "--json")
    assert by_cdi.returncode == 0 and by_index.returncode == 0, (by_cdi.stderr, by_index.stderr)
    cdi, index = json.loads(by_cdi.stdout), json.loads(by_index.stdout)
    assert [g["index"] for g in cdi["gpus"]] == [0]
    assert cdi["actions"] == index["actions"]


def test_table_and_overrides(make_bundle, driver_root):
    b = make_bundle(env=["NVIDIA_VISIBLE_DEVICES=all"])
    r = sandbox("plan", b, "--driver-root", driver_root, "--gpus", "0", "--capabilities", "utility")
    assert r.returncode == 0, r.stderr
    assert "/dev/nvidia0" in r.stdout and "/dev/nvidia1" not in r.stdout
    assert "libnvidia-ml.so" in r.stdout and "libcuda.so" not in r.stdout


def test_no_gpu_prints_empty_plan(make_bundle):
    r = sandbox("plan", make_bundle(), "--driver-root", "/nonexistent", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["actions"] == []


@pytest.mark.parametrize("content,message", [
    (None, "config.json: no such file"),
    ("{not json", "config.json: invalid JSON"),
    ('{"ociVersion": "1", "root": {"path": 5}}', r"config.json: Expected `str`, got `int` - at `\$.root.path`"),
    ('{"ociVersion": "1", "root": {"path": "rootfs"}, "process": {"args": "sh"}}',
     r"at `\$.process.args`"),
    ('{"ociVersion": "1.0.2", "root": {"path": "missing"}}', "root.path 'missing' is not a directory"),
    ('{"ociVersion": "invalid", "root": {"path": "rootfs"}}', "ociVersion: 'invalid' is not a version 1.x.y"),
])
def test_bad_bundle_exit_2(tmp_path, content, message):
    if content is not None:
        (tmp_path / "config.json").write_text(content)
    r = sandbox("plan", tmp_path)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1
    assert str(tmp_path) in r.stderr
    import re
    assert re.search(message, r.stderr), r.stderr


def test_bad_env_value_exit_2(make_bundle, driver_root):
    b = make_bundle(env=["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=warp"])
    r = sandbox("plan", b, "--driver-root", driver_root)
    assert r.returncode == 2 and "unknown capability 'warp'" in r.stderr


def test_hook_command_line_without_argparse():
    from sandbox.flags import hook_args, parser

    argv = ["hook", "--driver-root", "/d", "--trace", "/t.json"]
    fast, full = hook_args(argv), parser().parse_args(argv)
    assert {k: getattr(fast, k) for k in ("verb", "action", "driver_root", "dev_root", "capabilities", "trace")} == \
           {k: getattr(full, k) for k in ("verb", "action", "driver_root", "dev_root", "capabilities", "trace")}
    assert hook_args(["hook", "install", "/b"]) is None and hook_args(["hook", "--bogus", "x"]) is None


def test_api_caps_capabilities_at_most(make_bundle, driver_root):
    """The hook's --capabilities is a ceiling: a compute,utility bundle gets utility only."""
    from sandbox.api import plan_bundle

    bundle = make_bundle(env=["NVIDIA_VISIBLE_DEVICES=all"])
    names = {a.target.rsplit("/", 1)[1].split(".so")[0]
             for a in plan_bundle(str(bundle), str(driver_root), max_capabilities="utility").actions
             if a.kind == "library"}
    assert names == {"libnvidia-ml", "libnvidia-cfg"}
