#!/usr/bin/env python3
"""A fresh Debian 12 machine for the package's and the node installer's tests: a root made with
mmdebstrap, booted with systemd-nspawn, with no network.

- ``root_tarball()``: ``mmdebstrap --variant=minbase`` of the machine's own Debian release
  with PACKAGES (what the package depends on, systemd, and containerd as a Kubernetes node has
  it), from the machine's own archive entries (fixtures._machine_sources: no archive's address
  is written here), cached as ``.cache/debian-root-v<REV>-<key>.tar``. mmdebstrap is installed
  with apt-get when missing. It runs in a mount namespace of its own: its mounts in the root
  it builds never reach ours.
- ``nspawn()``: systemd-nspawn from Debian's systemd-container of the host's own systemd
  version, downloaded through the fixtures' private apt configuration and unpacked with
  ``dpkg -x`` into ``.cache`` (never installed on this machine).
- ``Node``: the tarball unpacked into a directory and booted: systemd-nspawn with a private
  network, in a mount namespace of ours (so that what nspawn makes under /run stays there), in
  a cgroup of ours below the caller's in every hierarchy (removed at stop), with what a real
  machine's root has (every capability but loading modules and setting the clock, no seccomp
  filter of nspawn's, the cgroup controllers writable: BOOT), its /run a directory beside the
  root (``NODE.run``: its systemd's and containerd's sockets are reachable from outside, as a
  real node's /run is below a hostPath mount of /; ``mounts()``), and its system bus up.
  ``run()`` runs a command there as a root shell of the node would; ``stop()`` powers it off
  (systemd's orderly halt) and removes what it made.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fixtures  # noqa: E402

CACHE = fixtures.CACHE
ROOT_REV = 2  # bump when what root_tarball() builds changes
# what Debian's installer writes, and no package does (containerd's host-network pods copy it)
HOSTS = 'printf "127.0.0.1\\tlocalhost\\n::1\\tlocalhost ip6-localhost ip6-loopback\\n" > "$1/etc/hosts"'
PACKAGES = ["python3", "libseccomp2", "libcap2", "init-system-helpers", "systemd", "dbus", "containerd"]


def say(what: str) -> None:
    print(f"debroot: {what}", file=sys.stderr, flush=True)


def mirrors() -> list[str]:
    """The machine's archive entries for its release and its security suite, main only, as
    mmdebstrap takes them (one-line sources)."""
    codename = fixtures._os_codename()
    keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
    lines = sorted({f"deb [signed-by={signed or keyring}] {uri} {suite} main"
                    for uri, suite, signed in fixtures._machine_sources() if suite in (codename, f"{codename}-security")})
    if not any(f" {codename} " in line for line in lines):
        raise RuntimeError(f"no Debian {codename} archive in this machine's apt sources (/etc/apt)")
    return lines


def mmdebstrap() -> str:
    found = shutil.which("mmdebstrap")
    if found is None:
        say("apt-get install mmdebstrap")
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "mmdebstrap"], check=True,
                       stdout=subprocess.DEVNULL, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        found = shutil.which("mmdebstrap")
    if found is None:
        raise RuntimeError("mmdebstrap is not installed, and apt-get could not install it")
    return found


def root_tarball() -> Path:
    codename = fixtures._os_codename()
    key = hashlib.sha256(" ".join([codename, *PACKAGES]).encode()).hexdigest()[:12]
    out = CACHE / f"debian-root-v{ROOT_REV}-{key}.tar"
    if out.exists():
        return out
    tool = mmdebstrap()
    partial = out.with_suffix(".partial.tar")
    say(f"mmdebstrap {codename} with {' '.join(PACKAGES)} into {out} ...")
    t = time.monotonic()
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", tool, "--mode=root", "--variant=minbase",
                        "--include=" + ",".join(PACKAGES), f"--customize-hook={HOSTS}", codename, str(partial),
                        *mirrors()],
                       capture_output=True, text=True)
    if r.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"mmdebstrap failed:\n{r.stderr[-3000:]}")
    partial.rename(out)
    say(f"made {out} ({out.stat().st_size >> 20} MiB) in {time.monotonic() - t:.0f} s")
    return out


def nspawn() -> Path:
    """systemd-nspawn of the host's systemd version (its libsystemd-shared is the host's)."""
    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "systemd"], capture_output=True, text=True,
                             check=True).stdout.strip()
    root = CACHE / f"systemd-container-{version}"
    if fixtures._done(root):
        return root / "usr/bin/systemd-nspawn"
    tmp = fixtures._fresh(root)
    opts = fixtures.apt_options()
    fixtures.run("apt-get", *opts, "update")
    fixtures.run("apt-get", *opts, "download", f"systemd-container={version}", cwd=tmp)
    deb = next(tmp.glob("systemd-container_*.deb"))
    fixtures.run("dpkg", "-x", deb, tmp)
    deb.unlink()
    return fixtures._finish(tmp, root) / "usr/bin/systemd-nspawn"


def extract(tarball: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    subprocess.run(["tar", "-C", str(dest), "--numeric-owner", "-xpf", str(tarball)], check=True)
    return dest


# --- the booted node ---------------------------------------------------------------------


def _own_cgroups() -> list[Path]:
    """Our cgroup's directory in every hierarchy mounted under /sys/fs/cgroup."""
    found = []
    paths = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, controllers, path = line.split(":", 2)
        paths[controllers if hid != "0" else ""] = path
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        point, fstype = fields[4], fields[fields.index("-") + 1]
        if not point.startswith("/sys/fs/cgroup") or fstype not in ("cgroup", "cgroup2"):
            continue
        opts = fields[-1].split(",")
        key = "" if fstype == "cgroup2" else next(
            (c for c in paths if c and set(c.split(",")) <= set(opts)), None)
        if key is None or key not in paths:
            continue
        root = fields[3]
        rel = paths[key][len(root.rstrip("/")):] if paths[key].startswith(root) else None
        if rel is not None:
            found.append(Path(point) / rel.lstrip("/"))
    return found


# The node's PID 1 until systemd: its /run becomes a directory of ours, NODE.run beside the
# root (nspawn mounts a tmpfs at /run, takes no --bind onto /run itself, and would take a source
# inside the root from under its tmpfs), so that what systemd makes there, its private socket
# first, is reachable from outside, as a real node's /run, a file system of its own, is below a
# hostPath mount of / (``mounts()``). Binds below /run are made below /run/.node, and come along.
#
# Its cgroups: nspawn mounts the v1 controllers read-only (the unified hierarchy alone is
# delegated, but on a hybrid host it has no controller: a container's cpu.shares has no file
# there), so they are remounted read-write, as a real machine's are: their root is the node's
# cgroup (a cgroup namespace), ours, removed at stop.
BOOT = ('mount --rbind /run/.node /run && '
        'for d in /sys/fs/cgroup/*/; do [ "$(stat -f -c %T "$d")" != cgroupfs ] || mount -o remount,bind,rw "$d"; done && '
        'exec /lib/systemd/systemd')


class Node:
    """A Debian root booted by systemd-nspawn (see the module's docstring)."""

    def __init__(self, root: Path, binds: dict[str, str] | None = None, read_only_binds: dict[str, str] | None = None):
        self.root = Path(root)
        self.binds = binds or {}  # host path -> path in the node
        self.read_only_binds = read_only_binds or {}
        self.log = self.root.parent / f"{self.root.name}.boot.log"
        self.run_dir = self.root.parent / f"{self.root.name}.run"  # its /run (see BOOT)
        self.proc: subprocess.Popen | None = None
        self.leader = 0
        self.cgroups: list[Path] = []

    def boot(self, timeout: float = 60) -> Node:
        name = f"debroot-{os.getpid()}-{self.root.name}"
        self.cgroups = [d / name for d in _own_cgroups()]
        for d in self.cgroups:
            d.mkdir()
            for f in ("cpuset.cpus", "cpuset.mems"):  # (an empty cpuset takes no task)
                if (d / f).exists():
                    (d / f).write_text((d.parent / f).read_text())
        def inside(dst: str) -> str:
            return "/run/.node" + dst[len("/run"):] if dst.startswith("/run/") else dst

        self.run_dir.mkdir(exist_ok=True)
        binds = [f"--bind={self.run_dir}:/run/.node"]
        binds += [f"--bind={src}:{inside(dst)}" for src, dst in self.binds.items()]
        binds += [f"--bind-ro={src}:{inside(dst)}" for src, dst in self.read_only_binds.items()]
        procs = " ".join(str(d / "cgroup.procs") for d in self.cgroups)
        # (nspawn makes /run/systemd/nspawn on the host: a tmpfs over it, in our own mount
        # namespace, keeps that there)
        script = ('set -e; for f in ' + procs + '; do echo $$ > "$f"; done; '
                  'mkdir -p /run/systemd; mount -t tmpfs -o mode=755 tmpfs /run/systemd; '
                  'exec "$@"')
        # (a GPU node's runtime needs what a real machine's root has: every capability but the
        # module loading and the clock, which are the host's, and no seccomp filter of nspawn's,
        # which refuses bpf(), and so the devices' eBPF program)
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(nspawn()),
                "--quiet", "--register=no", "--keep-unit", "--private-network", f"--machine={name[:64]}",
                "--capability=all", "--drop-capability=CAP_SYS_MODULE,CAP_SYS_TIME", "--kill-signal=SIGRTMIN+3",
                "-D", str(self.root), *binds, "--", "/bin/sh", "-c", BOOT]
        env = {**os.environ, "SYSTEMD_SECCOMP": "0"}
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self.leader:
            self.leader = self._find_leader()
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"systemd-nspawn did not boot:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.05)
        while not (self.run_dir / "systemd/private").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the node's systemd did not listen:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.05)
        r = self.run("systemctl", "is-system-running", "--wait", timeout=timeout)
        if r.stdout.strip() not in ("running", "degraded"):
            failed = self.run("systemctl", "--failed", "--no-pager").stdout
            self.stop()
            raise RuntimeError(f"the node's systemd is {r.stdout.strip()!r} ({r.stderr.strip()}):\n{failed}")
        # The system bus up, systemd on it, as on a machine where anything has used it since
        # its boot: a client whose pid this node's pid namespace does not show (a container of
        # the host's, like the node installer's under the test's podman) has no peer
        # credentials for systemd's private socket and falls back to the bus; one that came
        # first would start dbus-daemon, then ask before systemd is on it.
        if (self.root / "lib/systemd/system/dbus.service").exists():
            r = self.run("systemctl", "start", "dbus.service")
            assert r.returncode == 0, r.stderr
            while "org.freedesktop.systemd1" not in self.run("busctl", "--system", "list", "--no-pager").stdout:
                assert time.monotonic() < deadline, "systemd is not on the node's system bus"
                time.sleep(0.05)
        return self

    def mounts(self) -> dict[str, Path]:
        """The node's file systems as a hostPath mount of its / shows them: path -> directory here."""
        return {"/": self.root, "/run": self.run_dir}

    def _find_leader(self) -> int:
        """The node's PID 1 (systemd, a child of nspawn's)."""
        for pid in _descendants(self.proc.pid if self.proc else 0):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "systemd":
                    return pid
            except OSError:
                pass
        return 0

    def run(self, *argv: str, timeout: float = 120, input: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """argv in all the node's namespaces (its root; PATH and a plain environment), in a
        transient scope of its systemd, as a root shell's command there (in its cgroups, not
        ours: a runtime places a container's cgroup by its own)."""
        base = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
        return subprocess.run(["nsenter", "-t", str(self.leader), "-a", "env", "-i",
                               *(f"{k}={v}" for k, v in {**base, **(env or {})}.items()),
                               "systemd-run", "--scope", "--quiet", "--collect", "--", *argv],
                              capture_output=True, text=True, timeout=timeout, input=input)

    def stop(self) -> list[str]:
        """Power off (nspawn's SIGTERM: the node's orderly halt), then remove our cgroups.
        Returns what did not go cleanly."""
        problems = []
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                problems.append("the node did not power off in 60 s: killed")
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for d in self.cgroups:
            for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                _rmdir(sub)
            if d.is_dir() and not _rmdir(d):
                problems.append(f"cgroup {d} left")
        return problems


def _rmdir(d: Path) -> bool:
    for _ in range(100):
        try:
            d.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.05)
    return False


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        out += [int(c) for c in children]
        todo += [int(c) for c in children]
    return out


if __name__ == "__main__":
    print(root_tarball())
    print(nspawn())
