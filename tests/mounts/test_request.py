import msgspec
import pytest

from mounts.errors import RequestError
from mounts.request import CAPABILITIES, GpuRequest, brand_of, check_requirements, gpu_request
from mounts.spec import Spec

CU = frozenset({"compute", "utility"})


def spec(env=(), devices=()):
    return msgspec.convert({"ociVersion": "1.0.2", "root": {"path": "rootfs"},
                            "process": {"args": ["true"], "env": list(env)},
                            "linux": {"devices": [{"path": p, "type": "c"} for p in devices]}}, Spec)


@pytest.mark.parametrize("env,devices,caps", [
    ([], None, None),
    (["NVIDIA_VISIBLE_DEVICES="], None, None),
    (["NVIDIA_VISIBLE_DEVICES=void"], None, None),
    (["NVIDIA_VISIBLE_DEVICES=none"], (), CU),
    (["NVIDIA_VISIBLE_DEVICES=all"], ("all",), CU),
    (["NVIDIA_VISIBLE_DEVICES=0,1"], ("0", "1"), CU),
    (["NVIDIA_VISIBLE_DEVICES=GPU-abc, 1"], ("GPU-abc", "1"), CU),
    (["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_VISIBLE_DEVICES=all"], ("all",), CU),
    (["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES="], ("all",), CU),
    (["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=all"], ("all",), frozenset(CAPABILITIES)),
    (["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=graphics,video"], ("all",),
     frozenset({"graphics", "video"})),
    # legacy CUDA image: all devices, all capabilities, cuda>=major.minor
    (["CUDA_VERSION=12.1.1"], ("all",), frozenset(CAPABILITIES)),
    (["CUDA_VERSION=12.1.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.1"], None, None),
])
def test_env_rules(env, devices, caps):
    req = gpu_request(spec(env))
    if devices is None:
        assert req is None
    else:
        assert req.devices == devices and req.capabilities == caps


def test_legacy_image_requires_its_cuda():
    req = gpu_request(spec(["CUDA_VERSION=12.1.1"]))
    assert req.requirements == (("CUDA_VERSION", "cuda>=12.1"),)


def test_requirements_collected_and_disabled():
    env = ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_REQUIRE_CUDA=cuda>=12.0", "NVIDIA_REQUIRE_DRIVER=driver>=535"]
    assert gpu_request(spec(env)).requirements == (
        ("NVIDIA_REQUIRE_CUDA", "cuda>=12.0"), ("NVIDIA_REQUIRE_DRIVER", "driver>=535"))
    assert gpu_request(spec(env + ["NVIDIA_DISABLE_REQUIRE=true"])).requirements == ()


def test_cli_overrides_env():
    req = gpu_request(spec(["NVIDIA_VISIBLE_DEVICES=all"]), gpus="1", capabilities="utility")
    assert req.devices == ("1",) and req.capabilities == {"utility"} and req.source == "--gpus"
    assert gpu_request(spec([]), gpus="all").devices == ("all",)


def test_gke_linux_devices():
    req = gpu_request(spec([], ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia1"]))
    assert req.devices == ("1",) and req.capabilities == frozenset() and req.source == "linux.devices"
    assert gpu_request(spec([], ["/dev/null"])) is None


@pytest.mark.parametrize("env,message", [
    (["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,bogus"],
     "NVIDIA_DRIVER_CAPABILITIES: unknown capability 'bogus'"),
    (["CUDA_VERSION=abc"], "CUDA_VERSION: 'abc' is not a version"),
])
def test_bad_values_are_named(env, message):
    with pytest.raises(RequestError, match=message):
        gpu_request(spec(env))


def req(*requirements):
    return GpuRequest(("all",), CU, tuple(("NVIDIA_REQUIRE_X", r) for r in requirements))


@pytest.mark.parametrize("expr,ok", [
    ("cuda>=12.0", True), ("cuda>=12.2", True), ("cuda>=12.3", False), ("cuda>=12", True),
    ("driver>=535", True), ("driver>=535.261.03", True), ("driver<535", False),
    ("cuda>=13.0 driver>=530", True),  # space = OR
    ("cuda>=12.0,driver>=550", False),  # comma = AND
    ("brand=nvidia", True), ("brand=tesla", False), ("brand=tesla,driver>=470 cuda>=12.2", True),
    ("arch=9.0", False),  # /proc does not tell the architecture
])
def test_requirements(expr, ok):
    args = (req(expr), "535.261.03", "12.2", [brand_of("NVIDIA H100 80GB HBM3")], [])
    if ok:
        check_requirements(*args)
    else:
        with pytest.raises(RequestError, match="not met"):
            check_requirements(*args)


def test_unparsable_requirement():
    with pytest.raises(RequestError, match="cannot parse condition 'gpus>2'"):
        check_requirements(req("gpus>2"), "535.1.1", "12.2", [], [])



@pytest.mark.parametrize("value", ["all,foo", "foo,all", "compute,\u00b2"])
def test_unknown_capability_even_beside_all(value):
    with pytest.raises(RequestError, match="unknown capability"):
        gpu_request(spec(["NVIDIA_VISIBLE_DEVICES=all", f"NVIDIA_DRIVER_CAPABILITIES={value}"]))


@pytest.mark.parametrize("expr", ["cuda>=\u0661\u0662", "driver>=" + "9" * 5000, "cuda>=12..0"])
def test_requirement_versions_are_ascii_and_short(expr):
    req = GpuRequest(("all",), CU, (("NVIDIA_REQUIRE_CUDA", expr),))
    with pytest.raises(RequestError, match="is not a version"):
        check_requirements(req, "535.261.03", "12.2", [], [])


@pytest.mark.parametrize("value,imex", [
    (None, ()), ("", ()), ("none", ()), ("all", ("all",)), ("0", ("0",)), ("1,0,1", ("1", "0")), ("007", ("7",)),
])
def test_imex_channels(value, imex):
    env = ["NVIDIA_VISIBLE_DEVICES=all"] + ([f"NVIDIA_IMEX_CHANNELS={value}"] if value is not None else [])
    assert gpu_request(spec(env)).imex == imex


@pytest.mark.parametrize("value", ["x", "-1", "١", "1234567890"])
def test_bad_imex_channels_are_one_line(value):
    with pytest.raises(RequestError, match="NVIDIA_IMEX_CHANNELS"):
        gpu_request(spec(["NVIDIA_VISIBLE_DEVICES=all", f"NVIDIA_IMEX_CHANNELS={value}"]))
