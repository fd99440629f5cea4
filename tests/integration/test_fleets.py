"""A GPU container on the driver where GPU fleets keep it (fixtures.FLEETS), three ways: `sandbox
run`, runc with our hook, and runc given our CDI spec's edits as an engine applies them (our
spec's hook makes the links and the cache). In each: nvidia-smi is the driver's ELF and runs
(-h needs no kernel module), glibc's loader loads libcuda.so.1, the GSP firmware is there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import fixtures
import pytest

from tests.integration.helpers import mount_table, sandbox, tree

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

VERSION = "535.261.03"
FIRMWARE = {"h200": f"/usr/local/nvidia/firmware/nvidia/{VERSION}"}  # else /lib/firmware/nvidia/<v>
SCRIPT = """
head -c 4 /usr/bin/nvidia-smi | grep -q ELF && echo "nvidia-smi is an ELF file"
out=$(nvidia-smi -h); echo "nvidia-smi -h: $? $(echo "$out" | head -1)"
cudacheck
ls {firmware}
"""


def expected(layout):
    return ["nvidia-smi is an ELF file", f"nvidia-smi -h: 0 NVIDIA System Management Interface -- v{VERSION}",
            "libcuda.so.1: cuInit found", "gsp_ga10x.bin", "gsp_tu10x.bin"]


def gpu_bundle(make_bundle, layout, rootfs=None):
    script = SCRIPT.format(firmware=FIRMWARE.get(layout, f"/lib/firmware/nvidia/{VERSION}"))
    return make_bundle(["sh", "-c", script], ["NVIDIA_VISIBLE_DEVICES=all"], **({"rootfs": rootfs} if rootfs else {}))


def roots(layout):
    driver, dev = fixtures.fleet_driver(layout)
    return ["--driver-root", str(driver), "--dev-root", str(dev)]


@pytest.mark.parametrize("layout", list(fixtures.FLEETS))
def test_sandbox_run(layout, make_bundle, tmp_path, rootfs_debian):
    before = (mount_table(), tree(rootfs_debian))
    r = sandbox("run", gpu_bundle(make_bundle, layout), *roots(layout), "--root", tmp_path / "state")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout.splitlines() == expected(layout), r.stdout
    assert (mount_table(), tree(rootfs_debian)) == before


@pytest.mark.parametrize("layout", list(fixtures.FLEETS))
def test_runc_with_our_hook(layout, make_bundle, tmp_path, rootfs_debian):
    bundle = gpu_bundle(make_bundle, layout)
    r = sandbox("hook", "install", bundle, *roots(layout))
    assert r.returncode == 0, r.stderr
    before = (mount_table(), tree(rootfs_debian))
    r = subprocess.run(["runc", "--root", str(tmp_path / "runc"), "run", "--bundle", str(bundle), "fleet"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout.splitlines() == expected(layout), r.stdout
    assert (mount_table(), tree(rootfs_debian)) == before


def apply_cdi(config, spec: dict, device: str) -> None:
    """What an engine does with a CDI device: the spec's and the device's edits (env, device
    nodes, bind mounts, hooks) into config.json, its nodes allowed in the device rules."""
    doc = json.loads(config.read_text())
    for edits in (spec["containerEdits"], next(d for d in spec["devices"] if d["name"] == device)["containerEdits"]):
        doc["process"]["env"] += edits.get("env", [])
        for node in edits.get("deviceNodes", []):
            doc["linux"].setdefault("devices", []).append({k: node[k] for k in ("path", "type", "major", "minor")})
            doc["linux"]["resources"]["devices"].append({"allow": True, "type": "c", "major": node["major"],
                                                         "minor": node["minor"], "access": "rwm"})
        for m in edits.get("mounts", []):
            doc["mounts"].append({"destination": m["containerPath"], "type": "bind", "source": m["hostPath"],
                                  "options": m["options"]})
        for h in edits.get("hooks", []):
            doc.setdefault("hooks", {}).setdefault(h["hookName"], []).append(
                {"path": h["path"], "args": h["args"], "env": h.get("env", [])})
    config.write_text(json.dumps(doc))


@pytest.mark.parametrize("layout", list(fixtures.FLEETS))
def test_runc_given_our_cdi_spec(layout, make_bundle, tmp_path, rootfs_debian):
    """The spec binds each file where the driver root keeps it, binaries at /usr/bin: runc
    makes those mount points, in a copy of the image (an engine's container has its own)."""
    spec = sandbox("--dev-root", roots(layout)[3], "cdi", "generate", "--driver-root", roots(layout)[1],
                   "--format", "json")
    assert spec.returncode == 0, spec.stderr
    doc = json.loads(spec.stdout)
    smi = [m for m in doc["containerEdits"]["mounts"] if m["containerPath"] == "/usr/bin/nvidia-smi"]
    assert [m["hostPath"] for m in smi] == [roots(layout)[1] + {"h200": "/usr/local/nvidia/bin", "gke": "/bin"}.get(
        layout, "/usr/bin") + "/nvidia-smi"]
    rootfs = tmp_path / "rootfs"
    shutil.copytree(rootfs_debian, rootfs, symlinks=True)
    bundle = gpu_bundle(make_bundle, layout, rootfs)
    apply_cdi(bundle / "config.json", doc, "all")
    before = mount_table()
    r = subprocess.run(["runc", "--root", str(tmp_path / "runc"), "run", "--bundle", str(bundle), "fleet"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout.splitlines() == expected(layout), r.stdout
    assert mount_table() == before


def test_debug_names_the_wrapper_passed_over(make_bundle, tmp_path):
    """The H200 image's /usr/bin/nvidia-smi: a line under --debug, nothing without it."""
    driver, _dev = fixtures.fleet_driver("h200")
    bundle = make_bundle(["true"], ["NVIDIA_VISIBLE_DEVICES=all"])
    quiet = sandbox("run", bundle, "--driver-root", driver, "--root", tmp_path / "state")
    debug = sandbox("--debug", "run", bundle, "--driver-root", driver, "--root", tmp_path / "state")
    assert quiet.returncode == debug.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert debug.stderr == (f"sandbox: debug: nvidia-smi: took {driver}/usr/local/nvidia/bin/nvidia-smi, passed over "
                            f"{driver}/usr/bin/nvidia-smi: a script (#!/bin/bash)\n"), debug.stderr
