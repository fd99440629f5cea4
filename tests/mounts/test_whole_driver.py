"""Beyond the libraries: DRI and display nodes, Xorg modules, EGL platforms, nvoptix.bin, MIG
and CUDA forward compatibility, on the real 535 fixture (its fake kernel side has two GPUs
with DRI nodes and a MIG layout on GPU 0: fixtures.MIG_LAYOUT)."""

import os
import re
import shutil
import subprocess

import fixtures
import msgspec
import pytest

from mounts.bundle import load_bundle
from mounts.driver import discover
from mounts.errors import DriverError, RequestError
from mounts.layout import layout_of
from mounts.plan import compute_plan
from mounts.request import CAPABILITIES, gpu_request, parse_capabilities
from mounts.spec import Spec

GPU0, GPU1 = fixtures.GPUS[0][2], fixtures.GPUS[1][2]


@pytest.fixture(scope="module")
def inventory(driver_root):
    return discover(str(driver_root))


def plan_for(make_bundle, inventory, env, rootfs=None, caps_add=()):
    path = make_bundle(env=env, **({"rootfs": rootfs} if rootfs else {}))
    if caps_add:
        cfg = path / "config.json"
        spec = msgspec.json.decode(cfg.read_bytes())
        spec["process"]["capabilities"]["bounding"] += list(caps_add)
        cfg.write_bytes(msgspec.json.encode(spec))
    bundle = load_bundle(str(path))
    return compute_plan(gpu_request(bundle.spec), inventory, layout_of(bundle.rootfs))


def targets(plan, kind):
    return [a.target for a in plan.actions if a.kind == kind]


# --- graphics and display -------------------------------------------------------------------

def test_graphics_brings_the_selected_gpus_dri_nodes_by_bus_id(make_bundle, inventory):
    """GPU 1 (bus 0000:86:00.0) is card2/renderD129 through udev's by-path links: its nodes
    and links come along, GPU 0's never do (matched by bus id, not by index or minor)."""
    plan = plan_for(make_bundle, inventory, ["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=graphics"])
    devices = {a.target: (a.major, a.minor) for a in plan.actions if a.kind == "device"}
    assert devices["/dev/dri/card2"] == (226, 2) and devices["/dev/dri/renderD129"] == (226, 129)
    assert "/dev/dri/card1" not in devices and "/dev/dri/renderD128" not in devices
    links = {a.target: a.source for a in plan.actions if a.kind == "symlink" and a.target.startswith("/dev/")}
    assert links == {"/dev/dri/by-path/pci-0000:86:00.0-card": "../card2",
                     "/dev/dri/by-path/pci-0000:86:00.0-render": "../renderD129"}
    # compute alone: no DRI nodes
    plan = plan_for(make_bundle, inventory, ["NVIDIA_VISIBLE_DEVICES=1"])
    assert not [t for t in targets(plan, "device") if t.startswith("/dev/dri/")]


def test_graphics_files_egl_platforms_and_nvoptix(make_bundle, inventory, driver_root):
    plan = plan_for(make_bundle, inventory, ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=graphics"])
    configs = {a.target: a.source for a in plan.actions if a.kind == "config"}
    assert set(configs) == {
        "/usr/share/vulkan/icd.d/nvidia_icd.json", "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
        "/usr/share/glvnd/egl_vendor.d/10_nvidia.json", "/usr/share/nvidia/nvoptix.bin",
        "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
        "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json"}
    # nvoptix.bin: Debian keeps it in the driver's directory, its alternative links it here
    assert configs["/usr/share/nvidia/nvoptix.bin"] == f"{driver_root}/{fixtures.NV_DIR}/nvoptix.bin"
    libs = {os.path.basename(t) for t in targets(plan, "library")}
    assert {"libnvidia-egl-wayland.so.1.1.10", "libnvidia-egl-gbm.so.1.1.0"} <= libs
    # each platform file names a library the container's cache will resolve
    (cache,) = [a for a in plan.actions if a.kind == "ldcache"]
    keys = {e.key for e in cache.entries}
    for target, source in configs.items():
        if "egl_external_platform" in target:
            name = msgspec.json.decode(open(source, "rb").read())["ICD"]["library_path"]
            assert name in keys, (target, name)
    assert not [t for t in targets(plan, "library") if "/xorg/" in t]  # display only


def test_display_brings_modeset_and_xorg_modules(make_bundle, inventory, driver_version):
    plan = plan_for(make_bundle, inventory, ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=display"])
    assert "/dev/nvidia-modeset" in targets(plan, "device")
    ext = "/usr/lib/xorg/modules/extensions"
    assert {"/usr/lib/xorg/modules/drivers/nvidia_drv.so", f"{ext}/libglxserver_nvidia.so.{driver_version}"} <= set(
        targets(plan, "library"))
    links = {a.target: a.source for a in plan.actions if a.kind == "symlink"}
    assert links[f"{ext}/libglxserver_nvidia.so"] == f"libglxserver_nvidia.so.{driver_version}"
    # display implies graphics: the DRI nodes too
    assert "/dev/dri/card1" in targets(plan, "device")


def test_a_dri_link_to_elsewhere_is_an_error(tmp_path, driver_root):
    root = tmp_path / "driver"
    subprocess.run(["cp", "-a", "--reflink=auto", str(fixtures.synthetic_driver(10)), str(root)], check=True)
    link = root / "dev/dri/by-path/pci-0000:10:00.0-card"
    link.unlink()
    link.symlink_to("/dev/sda")
    with pytest.raises(DriverError, match=f"^{link}: expected a link to ../card<N> or ../renderD<N>$"):
        discover(str(root))
    link.unlink()
    link.symlink_to("../card1")
    (root / "dev/dri/card1").unlink()
    os.mknod(root / "dev/dri/card1", 0o600 | 0o020000, os.makedev(8, 0))  # a disk under card1's name
    with pytest.raises(DriverError, match=r"dev/dri/card1: expected char device 226:1$"):
        discover(str(root))


# --- MIG --------------------------------------------------------------------------------------

@pytest.mark.parametrize("entry,caps,instances", [
    ("0:1:0", [12, 13], [(1, 0)]),
    ("0:2:1", [21, 23], [(2, 1)]),
    (f"MIG-{GPU0}/2/1", [21, 23], [(2, 1)]),
    ("0:2:0,0:2:1", [21, 22, 23], [(2, 0), (2, 1)]),  # both of GI 2's compute instances
    (f"0:1:0,MIG-{GPU0}/1/0", [12, 13], [(1, 0)]),  # the same device twice: once
])
def test_mig_devices_get_their_caps_nodes_parent_and_proc_files(entry, caps, instances, make_bundle, inventory):
    plan = plan_for(make_bundle, inventory, [f"NVIDIA_VISIBLE_DEVICES={entry}"])
    devices = {a.target: (a.major, a.minor) for a in plan.actions if a.kind == "device"}
    want = {f"/dev/nvidia-caps/nvidia-cap{n}": (fixtures.CAPS_MAJOR, n) for n in caps}
    assert {t: v for t, v in devices.items() if "nvidia-caps/" in t} == want
    assert "/dev/nvidia0" in devices and "/dev/nvidia1" not in devices  # the parent GPU, only it
    assert plan.gpus == [] and [(m.gi, m.ci) for m in plan.migs] == instances
    (proc,) = [a for a in plan.actions if a.kind == "procfs"]
    assert proc.gpus == (fixtures.GPUS[0][0],)
    expect = [f for gi, ci in instances for f in (f"capabilities/gpu0/mig/gi{gi}/access",
                                                  f"capabilities/gpu0/mig/gi{gi}/ci{ci}/access")]
    assert list(proc.files) == list(dict.fromkeys(expect))


def test_mig_and_whole_gpus_mix(make_bundle, inventory):
    plan = plan_for(make_bundle, inventory, ["NVIDIA_VISIBLE_DEVICES=1,0:1:0"])
    devs = targets(plan, "device")
    assert {"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap13"} <= set(devs)
    assert [g.index for g in plan.gpus] == [1]


def test_all_means_whole_gpus_never_mig_or_its_privileged_caps(make_bundle, inventory):
    plan = plan_for(make_bundle, inventory, ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=all"])
    assert not [t for t in targets(plan, "device") if "nvidia-caps" in t]
    # the privileged capabilities are not among the names "all" stands for
    assert parse_capabilities("all") == frozenset(CAPABILITIES)
    for name in ("fabric-imex-mgmt", "profiling", "rdma"):
        assert name not in CAPABILITIES
        with pytest.raises(RequestError, match=f"unknown capability '{name}'"):
            parse_capabilities(name)


def test_mig_config_and_monitor_are_for_privileged_containers_of_whole_gpus(make_bundle, inventory):
    """The toolkit's rules: CAP_SYS_ADMIN, the value 'all', and whole GPUs (configuring MIG
    reshapes every tenant's slices: never next to one slice)."""
    env = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_MIG_CONFIG_DEVICES=all"]
    with pytest.raises(RequestError, match=r"^NVIDIA_MIG_CONFIG_DEVICES: only a privileged container"):
        plan_for(make_bundle, inventory, env)
    plan = plan_for(make_bundle, inventory, env + ["NVIDIA_MIG_MONITOR_DEVICES=all"], caps_add=["CAP_SYS_ADMIN"])
    caps = [t for t in targets(plan, "device") if "nvidia-caps" in t]
    assert caps == ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"]  # config, monitor
    (proc,) = [a for a in plan.actions if a.kind == "procfs"]
    assert proc.files == ("capabilities/mig/config", "capabilities/mig/monitor")
    for extra, message in ((["NVIDIA_MIG_MONITOR_DEVICES=0"], r"MONITOR_DEVICES: only 'all' is supported \(got '0'\)"),
                           (["NVIDIA_VISIBLE_DEVICES=0:1:0"], r"CONFIG_DEVICES: only for a container of whole GPUs "
                                                              r"\(MIG devices are selected\)"),
                           (["NVIDIA_VISIBLE_DEVICES=none"], r"CONFIG_DEVICES: only for a container of whole GPUs "
                                                             r"\(no GPU is selected\)")):
        with pytest.raises(RequestError, match=message):
            plan_for(make_bundle, inventory, env + extra, caps_add=["CAP_SYS_ADMIN"])


def test_a_missing_caps_node_and_a_bad_access_file_are_one_line(tmp_path):
    root = tmp_path / "driver"
    subprocess.run(["cp", "-a", str(fixtures.synthetic_driver(10)), str(root)], check=True)
    proc = root / "proc/driver/nvidia/capabilities/gpu0/mig/gi1"
    (proc / "ci0").mkdir(parents=True)
    (proc / "access").write_text("DeviceFileMinor: 12\n")
    (proc / "ci0/access").write_text("DeviceFileMinor: 13\n")
    inv = discover(str(root))
    assert [(m.gi, m.ci, m.gi_cap, m.ci_cap) for m in inv.migs] == [(1, 0, 12, 13)]
    spec = msgspec.convert({"ociVersion": "1.0.2", "root": {"path": "rootfs"},
                            "process": {"args": ["true"], "env": ["NVIDIA_VISIBLE_DEVICES=0:1:0"]}}, Spec)
    layout = layout_of(str(fixtures.rootfs()))
    with pytest.raises(RequestError, match=f"^{root}/dev/nvidia-caps/nvidia-cap12: device node missing$"):
        compute_plan(gpu_request(spec), inv, layout)
    (proc / "ci0/access").write_text("DeviceFileMinor: 1e\n")
    with pytest.raises(DriverError, match=r"gpu0/mig/gi1/ci0/access: no valid 'DeviceFileMinor:' line$"):
        discover(str(root))


# --- CUDA forward compatibility ------------------------------------------------------------

def _image_with_compat(tmp_path, version: str, rootfs) -> str:
    root = tmp_path / f"rootfs-{version}"
    shutil.copytree(rootfs, root, symlinks=True)
    compat = root / "usr/local/cuda/compat"
    compat.mkdir(parents=True)
    for name in (f"libcuda.so.{version}", f"libnvidia-ptxjitcompiler.so.{version}"):
        (compat / name).write_bytes(b"\x7fELF not really")  # never opened: names only
    (compat / "libcuda.so.1").symlink_to(f"libcuda.so.{version}")
    (compat / "libcuda.so").symlink_to("libcuda.so.1")
    (compat / "libnvidia-ptxjitcompiler.so.1").symlink_to(f"libnvidia-ptxjitcompiler.so.{version}")
    return str(root)


def _cache(plan):
    (cache,) = [a for a in plan.actions if a.kind == "ldcache"]
    return {e.key: e.value for e in cache.entries}, [e.key for e in cache.entries]


def test_cuda_compat_of_a_newer_branch_comes_first(tmp_path, make_bundle, inventory, rootfs_debian):
    root = _image_with_compat(tmp_path, "550.54.15", rootfs_debian)
    plan = plan_for(make_bundle, inventory, ["NVIDIA_VISIBLE_DEVICES=0"], rootfs=root)
    values, keys = _cache(plan)
    assert values["libcuda.so.1"] == "/usr/local/cuda/compat/libcuda.so.1"
    assert values["libnvidia-ptxjitcompiler.so.1"] == "/usr/local/cuda/compat/libnvidia-ptxjitcompiler.so.1"
    assert values["libnvidia-ml.so.1"] == "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"  # not in compat: ours
    assert keys.count("libcuda.so.1") == 1
    # nothing of the image becomes a mount: every bind's source is the driver root's
    assert all(a.source.startswith(inventory.root) for a in plan.actions
               if a.kind in ("library", "binary", "config", "firmware", "device"))


@pytest.mark.parametrize("version", ["535.54.03", "530.30.02"])
def test_cuda_compat_of_the_same_or_an_older_branch_is_left_alone(version, tmp_path, make_bundle, inventory,
                                                                   rootfs_debian):
    root = _image_with_compat(tmp_path, version, rootfs_debian)
    values, _ = _cache(plan_for(make_bundle, inventory, ["NVIDIA_VISIBLE_DEVICES=0"], rootfs=root))
    assert values["libcuda.so.1"] == "/usr/lib/x86_64-linux-gnu/libcuda.so.1"


def test_hostile_compat_directories_are_ignored(tmp_path, make_bundle, inventory, rootfs_debian):
    """A compat dir that is a link to the host's /, or whose libcuda.so.1 leads out of it."""
    root = _image_with_compat(tmp_path, "550.54.15", rootfs_debian)
    compat = os.path.join(root, "usr/local/cuda/compat")
    shutil.rmtree(compat)
    os.symlink("/", compat)
    values, _ = _cache(plan_for(make_bundle, inventory, ["NVIDIA_VISIBLE_DEVICES=0"], rootfs=root))
    assert values["libcuda.so.1"] == "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    os.unlink(compat)
    os.mkdir(compat)
    os.symlink("../../../lib/x86_64-linux-gnu/libcuda.so.550.54.15", os.path.join(compat, "libcuda.so.1"))
    open(os.path.join(root, "usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"), "wb").close()
    values, _ = _cache(plan_for(make_bundle, inventory, ["NVIDIA_VISIBLE_DEVICES=0"], rootfs=root))
    assert values["libcuda.so.1"] == "/usr/lib/x86_64-linux-gnu/libcuda.so.1"


def test_a_gpus_index_and_its_minor_are_never_confused(tmp_path):
    """gVisor #9389: indices count the GPUs in bus order, minors are the driver's. Here GPU 0
    (bus 10) has minor 5 and GPU 1 (bus 11) minor 2."""
    root = tmp_path / "driver"
    subprocess.run(["cp", "-a", str(fixtures.synthetic_driver(10)), str(root)], check=True)
    for busid, minor in (("0000:10:00.0", 5), ("0000:11:00.0", 2)):
        info = root / f"proc/driver/nvidia/gpus/{busid}/information"
        info.write_text(re.sub(r"Device Minor:.*", f"Device Minor: \t {minor}", info.read_text()))
    for old in ("nvidia0", "nvidia1"):
        (root / "dev" / old).unlink()
    for minor in (5, 2):
        os.mknod(root / f"dev/nvidia{minor}", 0o666 | 0o020000, os.makedev(195, minor))
    inv = discover(str(root))
    assert [(g.index, g.minor) for g in inv.gpus] == [(0, 5), (1, 2)]

    def nodes(env=(), devices=()):
        spec = msgspec.convert({"ociVersion": "1.0.2", "root": {"path": "rootfs"},
                                "process": {"args": ["true"], "env": list(env)},
                                "linux": {"devices": [{"path": p, "type": "c"} for p in devices]}}, Spec)
        plan = compute_plan(gpu_request(spec), inv, layout_of(str(fixtures.rootfs())))
        return sorted(t for t in targets(plan, "device") if t[len("/dev/nvidia"):].isdigit())

    assert nodes(["NVIDIA_VISIBLE_DEVICES=0"]) == ["/dev/nvidia5"]
    assert nodes(["NVIDIA_VISIBLE_DEVICES=1"]) == ["/dev/nvidia2"]
    with pytest.raises(RequestError, match="unknown device '5'"):
        nodes(["NVIDIA_VISIBLE_DEVICES=5"])
    # the GKE way names nodes, so there the number is the minor
    assert nodes(devices=["/dev/nvidiactl", "/dev/nvidia2"]) == ["/dev/nvidia2"]


def test_a_loader_file_naming_a_host_path_is_made_the_containers(tmp_path, make_bundle, driver_root):
    """A host whose ICD files name libraries by absolute path (an installer's layout, here
    /usr/lib64): the container gets them naming where the plan put each library; files
    naming a SONAME, as Debian's do, are bound as they are."""
    user = tmp_path / "driver"
    user.mkdir()
    for d in ("etc", "usr", "lib", "proc", "dev"):  # hard links: the same files, no 400 MB copy
        subprocess.run(["cp", "-al", str(driver_root / d), str(user / d)], check=True)
    icd = user / "usr/share/vulkan/icd.d/nvidia_icd.json"
    doc = msgspec.json.decode(icd.read_bytes())
    doc["ICD"]["library_path"] = "/usr/lib64/libGLX_nvidia.so.0"
    icd.unlink()  # (a hard link: never written through)
    icd.write_bytes(msgspec.json.encode(doc))
    ocl = user / "etc/OpenCL/vendors/nvidia.icd"
    ocl.unlink()
    ocl.write_text("/opt/nvidia/lib/libnvidia-opencl.so.1\n")
    plan = plan_for(make_bundle, discover(str(user)), ["NVIDIA_VISIBLE_DEVICES=0",
                                                        "NVIDIA_DRIVER_CAPABILITIES=graphics,compute"])
    configs = {a.target: a.data for a in plan.actions if a.kind == "config"}
    lib = "/usr/lib/x86_64-linux-gnu"
    assert msgspec.json.decode(configs["/usr/share/vulkan/icd.d/nvidia_icd.json"])["ICD"] == {
        "library_path": f"{lib}/libGLX_nvidia.so.0", "api_version": doc["ICD"]["api_version"]}
    assert configs["/etc/OpenCL/vendors/nvidia.icd"] == f"{lib}/libnvidia-opencl.so.1\n"
    assert configs["/usr/share/glvnd/egl_vendor.d/10_nvidia.json"] is None  # Debian's: as it is
    assert configs["/usr/share/nvidia/nvoptix.bin"] is None


@pytest.mark.parametrize("location,message", [
    ("zz:3b:00.0", r"'Bus Location: zz:3b:00.0' is not its directory's bus id 0000:10:00.0$"),
    ("0000:10:00.0/../../../../etc", r"is not its directory's bus id 0000:10:00.0$"),
])
def test_a_bus_location_that_is_not_its_directorys_is_one_line(location, message, tmp_path):
    """The bus id becomes a path (the GPU's /proc directory bound into the container, its DRI
    links): only a PCI bus id, the one its directory is named by."""
    root = tmp_path / "driver"
    subprocess.run(["cp", "-a", str(fixtures.synthetic_driver(10)), str(root)], check=True)
    info = root / "proc/driver/nvidia/gpus/0000:10:00.0/information"
    info.write_text(re.sub(r"Bus Location:.*", f"Bus Location: \t {location}", info.read_text()))
    with pytest.raises(DriverError, match=message):
        discover(str(root))
    info.write_text(re.sub(r"Bus Location:.*", "Bus Location: \t 0000:10:00.0", info.read_text()))
    (root / "proc/driver/nvidia/gpus/0000:10:00.0").rename(root / "proc/driver/nvidia/gpus/not-a-bus")
    with pytest.raises(DriverError, match=r"gpus/not-a-bus: not a PCI bus id"):
        discover(str(root))


def test_a_mig_directory_link_is_resolved_inside_the_dev_root(tmp_path):
    """gi1 is an absolute link: read inside the root it leads to ci1; the host's directory of
    that name (ci0) is never listed."""
    root = tmp_path / "driver"
    subprocess.run(["cp", "-a", str(fixtures.synthetic_driver(10)), str(root)], check=True)
    mig = root / "proc/driver/nvidia/capabilities/gpu0/mig"
    mig.mkdir(parents=True)
    target = tmp_path / "elsewhere"
    inside = root / str(target).lstrip("/")
    (inside / "ci1").mkdir(parents=True)
    (inside / "access").write_text("DeviceFileMinor: 12\n")
    (inside / "ci1/access").write_text("DeviceFileMinor: 14\n")
    (target / "ci0").mkdir(parents=True)  # the host's, at the link's own path
    (target / "ci0/access").write_text("DeviceFileMinor: 13\n")
    (mig / "gi1").symlink_to(target)
    assert [(m.gi, m.ci, m.ci_cap) for m in discover(str(root)).migs] == [(1, 1, 14)]


def _replace(path, data: bytes):
    path.unlink()
    path.write_bytes(data)


def test_discovery_reads_the_loaders_files_inside_the_driver_root(tmp_path, driver_root, driver_copy, make_bundle):
    """The loaders' files are read by discovery (the plan reads none): one naming a host
    path reaches the container naming ours; one linked out of the driver root is looked for
    inside it (nothing there: not bound), never on the host. (The rewriting itself:
    tests/mounts/test_plan_pure.py.)"""
    user = driver_copy
    icd = user / "usr/share/vulkan/icd.d/nvidia_icd.json"
    target = "/usr/share/vulkan/icd.d/nvidia_icd.json"
    _replace(icd, b'{"ICD": {"library_path": "/usr/lib64/libGLX_nvidia.so.0"}}')
    inv = discover(str(user))
    assert inv.configs[target] == str(icd) and "/usr/lib64/" in inv.loader_texts[target]
    bundle = load_bundle(str(make_bundle(env=["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=graphics"])))
    plan = compute_plan(gpu_request(bundle.spec), inv, layout_of(bundle.rootfs))
    (config,) = [a for a in plan.actions if a.target == target]
    assert '"/usr/lib/x86_64-linux-gnu/libGLX_nvidia.so.0"' in config.data
    icd.unlink()
    icd.symlink_to("/etc/passwd")
    inv = discover(str(user))
    assert target not in inv.configs and target not in inv.loader_texts


def test_opened_at_names_where_an_open_really_went(tmp_path):
    from mounts.paths import opened_at

    (tmp_path / "real").mkdir()
    (tmp_path / "real/f").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    fd = os.open(tmp_path / "link/f", os.O_RDONLY)
    try:
        assert not opened_at(fd, str(tmp_path / "link/f")) and opened_at(fd, str(tmp_path / "real/f"))
    finally:
        os.close(fd)


def test_a_driver_root_through_a_magic_link_is_refused(driver_root, rootfs_debian, tmp_path):
    """/proc/<pid>/root of a process whose root is a mount of another mount namespace: the
    kernel names it by a path that, here, is another directory (an empty one): refused, never
    planned from what that path happens to be in our tree."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount and chroot")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    p = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c",
                          f"mount --bind {rootfs_debian} {mnt} && exec chroot {mnt} sleep 30"])
    try:
        import time

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
            pid = kids[0] if kids else str(p.pid)
            try:
                if os.stat(f"/proc/{pid}/root").st_ino != os.stat("/").st_ino:
                    break  # it has chrooted
            except FileNotFoundError:
                pass  # (sh's child mount, gone already)
            time.sleep(0.01)
        with pytest.raises(DriverError, match=rf"^/proc/{pid}/root: the driver root is reached through a link"):
            discover(f"/proc/{pid}/root")
    finally:
        p.kill()
        p.wait()
    assert discover(str(driver_root)).root == str(driver_root)  # (a real path is taken as it is)
