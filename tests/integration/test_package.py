"""The Debian package (scripts/package) on a fresh Debian 12 machine with no network: a root
made with mmdebstrap (with containerd, as a node has it) and booted with systemd-nspawn
(scripts/debroot.py), where the commands of docs/install.md are run in order, each checked:
installed with dpkg -i, its socket started by its postinst, a GPU bundle run from / (served by
that socket's server), `sandbox configure containerd` applied and a GPU container run through
containerd; then dpkg -r leaves nothing of ours but the conffile, and dpkg --purge nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import fixtures
import pytest

from tests.integration import nodes

pytestmark = [pytest.mark.slow]

DOC = nodes.REPO / "docs/install.md"
IMAGE = "localhost/gpubox:latest"  # fixtures.image_archive(), imported into the node's containerd
CTR_RUN = "ctr run --rm --runc-binary /usr/lib/gpu-sandbox/bin/sandbox --env NVIDIA_VISIBLE_DEVICES=all"
# What dpkg's log and containerd's state (of the container run) change besides the package: no
# path of the package may be among them once it is purged.
BY_PRODUCTS = ("var/lib/dpkg/", "var/log/dpkg.log", "var/lib/containerd/")


def expected_commands(deb: str) -> list[str]:
    return ["./scripts/setup", "./scripts/package",
            f"dpkg -i {deb}", "systemctl is-active gpu-sandbox.socket", "sandbox --version",
            """echo 'driver-root = "/run/nvidia/driver"' >> /etc/gpu-sandbox/config.toml""",
            "sandbox configure containerd", "systemctl restart containerd",
            f"{CTR_RUN} IMAGE gpu-check nvidia-smi -L",
            "dpkg -r gpu-sandbox", "dpkg --purge gpu-sandbox"]


def changed(before: dict[str, str], after: dict[str, str]) -> dict[str, tuple[str | None, str | None]]:
    return {k: (before.get(k), after.get(k)) for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)}


def test_the_commands_of_docs_install_md_on_a_fresh_debian_12_node(tmp_path_factory, driver_root, rootfs_debian):
    why = nodes.missing()
    if why:
        pytest.skip(why)
    tarball, _ = nodes.root_tarball(), nodes.nspawn()
    deb = nodes.build_package(tmp_path_factory.getbasetemp())
    commands = nodes.doc_commands(DOC)
    assert commands == expected_commands(deb.name), "docs/install.md's commands are not the ones this test runs"
    base = tmp_path_factory.mktemp("package-node")
    mounts = nodes.mount_table()
    root = nodes.debroot.extract(tarball, base / "root")
    shutil.copy(deb, root / "root" / deb.name)
    shutil.copy(fixtures.image_archive(), root / "root/gpubox.tar")
    bundle = fixtures.bundle(base / "bundle", Path("/srv/rootfs"), ["sh", "-c", "ls /dev/nvidia0 && cudacheck"],
                             ["NVIDIA_VISIBLE_DEVICES=0"])
    node = nodes.debroot.Node(root, read_only_binds={str(driver_root): "/run/nvidia/driver",
                                                     str(rootfs_debian): "/srv/rootfs", str(bundle): "/srv/bundle"})
    node.boot()
    try:
        def sh(command: str, timeout: float = 120):
            return node.run("sh", "-c", f"cd /root && {command}", timeout=timeout)

        assert node.run("ls", "/sys/class/net").stdout.split() == ["lo"]  # no network
        original = (root / "etc/containerd/config.toml").read_bytes()  # (Debian's containerd's)
        assert sh("ctr images import gpubox.tar").returncode == 0
        before = nodes.picture(root)
        containerd_pid = node.run("systemctl", "show", "-p", "MainPID", "--value", "containerd").stdout.strip()
        commands = commands[2:]  # (the build's: done above, with --out)

        r = sh(commands.pop(0))  # dpkg -i
        assert r.returncode == 0, r.stderr
        assert "Created symlink /etc/systemd/system/sockets.target.wants/gpu-sandbox.socket" in r.stderr + r.stdout
        r = sh(commands.pop(0))  # systemctl is-active gpu-sandbox.socket
        assert (r.returncode, r.stdout) == (0, "active\n"), r.stderr
        r = sh(commands.pop(0))  # sandbox --version
        assert r.returncode == 0 and r.stdout.startswith("sandbox version ") and "libseccomp: 2." in r.stdout, r
        # a GPU bundle from /, served by the server the socket starts
        r = node.run("sandbox", "--driver-root", "/run/nvidia/driver", "run", "/srv/bundle")
        assert (r.returncode, r.stdout) == (0, "/dev/nvidia0\nlibcuda.so.1: cuInit found\n"), r.stderr
        journal = node.run("journalctl", "-u", "gpu-sandbox.service", "--no-pager").stdout
        assert "sandbox serve: run: --driver-root /run/nvidia/driver run /srv/bundle: exit 0" in journal, journal

        assert sh(commands.pop(0)).returncode == 0  # driver-root in the config file
        r = sh(commands.pop(0))  # sandbox configure containerd
        assert r.returncode == 0 and r.stdout.startswith(
            "/etc/containerd/config.toml: containerd has 'sandbox' (/usr/lib/gpu-sandbox/bin/sandbox)"), r
        assert (root / "etc/containerd/config.toml.bak").read_bytes() == original
        dump = node.run("containerd", "config", "dump").stdout  # containerd reads the handler
        handler = dump.split('[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.sandbox.options]')[1]
        assert 'BinaryName = "/usr/lib/gpu-sandbox/bin/sandbox"' in handler.split("[")[0], dump
        r = sh(commands.pop(0))  # systemctl restart containerd
        assert r.returncode == 0, r.stderr
        assert node.run("systemctl", "show", "-p", "MainPID", "--value", "containerd").stdout.strip() != containerd_pid
        plugins = node.run("ctr", "plugins", "ls").stdout  # its CRI (Kubernetes') loaded with that config
        assert [line.split()[-1] for line in plugins.splitlines() if " cri " in line] == ["ok"], plugins
        r = sh(commands.pop(0).replace("IMAGE", IMAGE))  # ctr run ... nvidia-smi -L: the driver's, mounted
        assert r.returncode == 9 and "couldn't communicate with the NVIDIA driver" in r.stdout, r

        r = sh(commands.pop(0))  # dpkg -r
        assert r.returncode == 0, r.stderr
        assert node.run("systemctl", "is-active", "gpu-sandbox.socket").stdout.strip() == "inactive"
        assert (root / "etc/containerd/config.toml").read_bytes() == original  # configure's entry taken out
        assert (root / "etc/containerd/config.toml.bak").read_bytes() == original  # (the user's backup, kept)
        assert not (node.run_dir / "gpu-sandbox").exists()
        left = changed(before, nodes.picture(root))
        assert {k for k, (_, now) in left.items() if not k.startswith(BY_PRODUCTS)} == {
            "etc/containerd/config.toml.bak", "etc/gpu-sandbox", "etc/gpu-sandbox/config.toml"}, left
        r = sh(commands.pop(0))  # dpkg --purge
        assert r.returncode == 0, r.stderr
        assert commands == []
        left = changed(before, nodes.picture(root))
        assert {k for k in left if not k.startswith(BY_PRODUCTS)} == {"etc/containerd/config.toml.bak"}, left
        assert [k for k in left if "gpu-sandbox" in k] == [], left
        status = node.run("dpkg-query", "-W", "-f=${db:Status-Status}", "gpu-sandbox")
        assert status.stdout in ("", "not-installed"), status
    finally:
        problems = node.stop()
    assert problems + nodes.left_behind(base, mounts) == []
    shutil.rmtree(base)  # (the node's root and the rest: ~400 MB a run)
