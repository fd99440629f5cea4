"""Debian's real Vulkan and EGL loaders (libvulkan1, libegl1 from glvnd) in a container find
the driver's ICDs through the files the plan binds, and load NVIDIA's libraries through the
cache we write. There is no GPU: creating a Vulkan instance then fails, and that is the end."""

from __future__ import annotations

import os

import fixtures
import pytest

from tests.integration.helpers import sandbox

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

VULKAN = "VK_LOADER_DEBUG=all loadercheck vulkan 2>&1"
LIBDIR = "/usr/lib/x86_64-linux-gnu"


@pytest.fixture(scope="module")
def loaders_rootfs():
    return fixtures.loaders_rootfs()


def run(make_bundle, driver_root, tmp_path, rootfs, script, env):
    bundle = make_bundle(["sh", "-c", script], env, rootfs=rootfs)
    r = sandbox("run", bundle, "--driver-root", driver_root, "--root", tmp_path / "state")
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_vulkan_loader_finds_nvidias_icd(make_bundle, driver_root, driver_version, tmp_path, loaders_rootfs):
    out = run(make_bundle, driver_root, tmp_path, loaders_rootfs, VULKAN,
              ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=graphics"])
    lines = [" ".join(line.split()) for line in out.splitlines()]
    # The line that proves the ICD was found: the loader read our nvidia_icd.json ...
    assert 'DRIVER: Found ICD manifest file /usr/share/vulkan/icd.d/nvidia_icd.json, version "1.0.0"' in lines, out
    assert "DEBUG | DRIVER: Searching for ICD drivers named libGLX_nvidia.so.0" in lines, out
    # ... and the library it names was loaded, with its closure, from where we bound them
    assert f"mapped {LIBDIR}/libGLX_nvidia.so.{driver_version}" in lines, out
    assert f"mapped {LIBDIR}/libnvidia-glcore.so.{driver_version}" in lines, out
    # no GPU behind /dev/nvidia0: the ICD gives the loader no vkCreateInstance, and the
    # instance fails as VK_ERROR_INCOMPATIBLE_DRIVER (-9)
    assert "vkCreateInstance: -9" in lines, out
    assert "Found manifest file /usr/share/vulkan/implicit_layer.d/nvidia_layers.json" in out


def test_without_a_gpu_request_the_loader_finds_no_icd(make_bundle, driver_root, tmp_path, loaders_rootfs):
    """The control: the same image without NVIDIA_VISIBLE_DEVICES has no NVIDIA manifest."""
    out = run(make_bundle, driver_root, tmp_path, loaders_rootfs, VULKAN, [])
    assert "nvidia_icd.json" not in out and "libGLX_nvidia" not in out, out
    assert "vkCreateInstance: -9" in out, out


def test_glvnd_egl_loads_nvidias_vendor_library(make_bundle, driver_root, driver_version, tmp_path, loaders_rootfs):
    out = run(make_bundle, driver_root, tmp_path, loaders_rootfs, "loadercheck egl",
              ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=graphics"])
    lines = out.splitlines()
    # glvnd read 10_nvidia.json and loaded libEGL_nvidia.so.0: NVIDIA's client extensions
    assert "EGL_EXT_platform_device" in lines[0].split(), out
    assert f"mapped {LIBDIR}/libEGL_nvidia.so.{driver_version}" in lines, out
    assert f"mapped {LIBDIR}/libnvidia-eglcore.so.{driver_version}" in lines, out
    control = run(make_bundle, driver_root, tmp_path, loaders_rootfs, "loadercheck egl", [])
    assert "libEGL_nvidia" not in control and "EGL_EXT_platform_device" not in control, control
