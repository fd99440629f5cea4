"""The engines our users run, each started privately under a temp dir with `sandbox` (or
runc, to compare) as its OCI runtime, used, and stopped by pid: podman (no daemon),
containerd (`ctr`), dockerd. Used by tests/integration/test_engines.py and
scripts/bench/engines.py.

Everything they keep lives under the given directory: podman's --root/--runroot, the
daemons' state, sockets and our runtime's own --root. What they insist on putting elsewhere
(containerd's shim sockets under /run/containerd/s, dockerd's /var/run/docker) is removed at
stop when it was not there before.

``systemd=True``: the engines' systemd cgroup drivers instead of cgroupfs (podman's
``--cgroup-manager systemd``, dockerd's ``native.cgroupdriver=systemd``, ctr's
``--runc-systemd-cgroup`` with a ``system.slice:ctr:NAME`` cgroup), so that the runtime is
run with ``--systemd-cgroup`` and each container is a transient scope; for a host whose
systemd is a private one (scripts/systemd-host, tests/integration/test_systemd_engines.py):
the cgroups are then systemd's to make and remove.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import fixtures

from gofer import cgroups

REPO = Path(__file__).resolve().parent.parent
SANDBOX = str(REPO / ".venv/bin/sandbox")
WRAPPER = str(REPO / "scripts/sandbox-runc")  # runc for what asks for no GPU, sandbox for the rest
RUNC = shutil.which("runc") or "/usr/sbin/runc"
IMAGE = fixtures.IMAGE
DOCKER = "/usr/bin/docker"  # the Debian client that matches dockerd 20.10 (not /usr/local/bin's)


class WarmServer:
    """`sandbox serve` on a socket under ``base``, started and stopped by pid: with
    SANDBOX_SERVER set to ``path``, the launcher has it run the verbs that start no process.
    In a session of its own, as a service's (systemd starts each so): the scheduler's
    autogroups then weigh it as a node's service, not as one more job of the caller's
    session (a bench's busy loops there took its CPU, while runc under conmon or a shim,
    each a session of its own, kept theirs)."""

    def __init__(self, base: Path, path: Path | None = None):
        self.path = path or base / "server" / "server.sock"
        self.log = base / "server.log"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> WarmServer:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([SANDBOX, "serve", "--server", str(self.path)], stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=out, start_new_session=True)
        deadline = time.monotonic() + 20
        while "listening on" not in self.log.read_text():  # (its socket bound, and its filter cache made)
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sandbox serve did not listen: {self.log.read_text()}")
            time.sleep(0.02)
        return self

    def served(self) -> int:
        """How many verbs and hooks it has served so far."""
        return sum(1 for line in self.log.read_text().splitlines()
                   if line.startswith("sandbox serve: ") and ": exit " in line)

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=10)


def _wait_gone(pid: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1][0] == "Z":
                    return
        except OSError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def _rm_if_new(paths: dict[str, bool | frozenset[str]]) -> None:
    """Remove the host paths an engine created that did not exist before it started: its
    directories under /run, and the cgroups it made as their parent (empty by now), or under
    a parent that was there before, the children it added (podman's libpod-ID)."""
    for path, existed in paths.items():
        if existed is True:
            continue
        if path.startswith("/sys/fs/cgroup/"):  # busy a moment after its last process is reaped
            new = [Path(path)] if existed is False else [p for p in Path(path).iterdir()
                                                        if p.is_dir() and p.name not in existed]
            cgroups.remove_dirs([str(p) for top in new for p in top.rglob("*") if p.is_dir()]
                                + [str(top) for top in new if top != Path(path)] + ([path] if existed is False else []),
                                patience=10)  # (a container's last process may take a while to be reaped)
        else:
            shutil.rmtree(path, ignore_errors=True)


def _cgroup_parents(*names: str) -> dict[str, bool | frozenset[str]]:
    """The cgroups named ``names`` under each v1 controller: False where one is not there
    now, else the names of the cgroups in it now."""
    root = Path("/sys/fs/cgroup")
    dirs = [root / c / n for c in (os.listdir(root) if root.is_dir() else []) for n in names
            if (root / c).is_dir() and not (root / c).is_symlink()]
    return {str(d): d.exists() and frozenset(p.name for p in d.iterdir() if p.is_dir()) for d in dirs}


class Engine:
    name = ""
    runtime_root: Path

    def __init__(self, base: Path, driver_root: Path, systemd: bool = False):
        self.base = base
        self.driver_root = driver_root
        self.systemd = systemd  # the engine's systemd cgroup driver (the runtime's --systemd-cgroup)
        self.runtime_root = base / "sandbox-state"
        self.wrapper_root = base / "wrapper-state"  # the --root the engine gives sandbox-runc
        base.mkdir(parents=True, exist_ok=True)

    def cli(self, *args: str, timeout: float = 120, runtime: str = "sandbox", **kw) -> subprocess.CompletedProcess:
        return subprocess.run([*self.prefix(runtime), *args], capture_output=True, text=True, timeout=timeout, **kw)

    def prefix(self, runtime: str = "sandbox") -> list[str]:
        raise NotImplementedError

    def _leave(self, *mounted: str) -> None:
        """Unmount what the engine left mounted under our dir, remove the host paths it made."""
        for sub in mounted:
            subprocess.run(["umount", "-R", str(self.base / sub)], capture_output=True)
        _rm_if_new(self.host_paths)

    def _daemon(self, argv: list[str], log: str, timeout: float, env: dict | None = None) -> None:
        """Start a daemon with its output in ``log`` and wait until its client answers."""
        self.log = open(self.base / log, "w")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=env)
        deadline = time.monotonic() + timeout
        while self.cli("version").returncode != 0:
            assert time.monotonic() < deadline and self.proc.poll() is None, (self.base / log).read_text()
            time.sleep(0.1)

    def run_args(self, gpu: bool, runtime: str = "sandbox") -> list[str]:
        """What goes between `run` and the image: the runtime, no network, the GPU env."""
        raise NotImplementedError

    def load(self, archive: Path) -> None:
        """An image from a docker-archive tar (fixtures.image_archive)."""
        r = self.cli(*(("images", "import") if self.name == "containerd" else ("load", "-i")), str(archive))
        assert r.returncode == 0, r.stderr

    def run(self, name: str, *cmd: str, gpu: bool = False, detach: bool = False, tty: bool = False,
            rm: bool = True, runtime: str = "sandbox", memory: int | None = None, image: str = IMAGE) -> list[str]:
        """The argv of `ENGINE run` for ``cmd`` in ``image`` (a container called ``name``),
        with ``runtime`` (sandbox or runc) as the OCI runtime and a ``memory`` limit (bytes)."""
        flags = (["--rm"] if rm else []) + (["-d"] if detach else []) + (["-t"] if tty else [])
        if memory is not None:
            flags += ["--memory-limit" if self.name == "containerd" else "--memory", str(memory)]
            if self.name == "containerd":  # ctr's spec mounts no cgroups: show the container its own
                flags += ["--mount", "type=cgroup,src=cgroup,dst=/sys/fs/cgroup,options=ro:nosuid:nodev:noexec"]
        args = self.run_args(gpu, runtime)
        if self.name == "containerd":
            if self.systemd:  # ctr's default cgroup is a path: the systemd driver wants slice:prefix:name
                flags += ["--runc-systemd-cgroup", "--cgroup", f"system.slice:ctr:{name}"]
            return [*self.prefix(runtime), "run", *flags, *args, image, name, *cmd]
        return [*self.prefix(runtime), "run", *flags, "--name", name, *args, image, *cmd]

    def exec(self, name: str, *cmd: str, tty: bool = False, runtime: str = "sandbox") -> list[str]:
        """(``runtime`` as the container was run with: podman forgets its runtime flags.)"""
        flags = ["-t"] if tty else []
        if self.name == "containerd":
            return [*self.prefix(), "task", "exec", *flags, "--exec-id", f"e{time.monotonic_ns()}", name, *cmd]
        return [*self.prefix(runtime), "exec", *flags, name, *cmd]

    def remove(self, name: str, runtime: str = "sandbox") -> None:
        """Stop (SIGKILL after a second) and remove the container."""
        if self.name != "containerd":
            for args in (("stop", "-t", "1", name), ("rm", name)):
                r = self.cli(*args, runtime=runtime)
                assert r.returncode == 0, r.stderr
            return
        self.cli("task", "kill", "-s", "SIGKILL", name)
        deadline = time.monotonic() + 20
        while "RUNNING" in self.cli("task", "ls").stdout and time.monotonic() < deadline:
            time.sleep(0.1)
        for args in (("task", "rm", name), ("c", "rm", name)):
            r = self.cli(*args)
            assert r.returncode == 0, r.stderr

    def bundle_of(self, name: str) -> Path:
        """The bundle our runtime was given for the running container ``name`` (its state)."""
        for state in self.base.rglob("state.json"):
            data = json.loads(state.read_text())
            if data.get("id", "").startswith(name) or name in data.get("annotations", {}).values():
                return Path(data["bundle"])
        if self.name != "containerd":
            full = self.cli("inspect", "--format", "{{.Id}}", name).stdout.strip()
            for state in self.base.rglob(f"{full}/state.json"):
                return Path(json.loads(state.read_text())["bundle"])
        raise AssertionError(f"no state of ours for {name} under {self.base}")


class Podman(Engine):
    name = "podman"

    def prefix(self, runtime: str = "sandbox") -> list[str]:
        b = self.base
        # podman passes the runtime no environment of its own (PATH, XDG_RUNTIME_DIR) on its
        # direct calls (start, kill, delete) and conmon's containers.conf's on create: ours
        # (a warm server named by SANDBOX_SERVER; SANDBOX_SERVER_IDLE, tests' 0: no server
        # started at the node's socket) reach it through a runtime that sets them
        ours = [f"{k}={shlex.quote(os.environ[k])}" for k in ("SANDBOX_SERVER", "SANDBOX_SERVER_IDLE") if k in os.environ]

        def with_env(binary: str) -> str:
            if not ours:
                return binary
            script = b / f"{Path(binary).name}-env"
            if not script.exists():
                b.mkdir(parents=True, exist_ok=True)
                script.write_text(f"#!/bin/sh\nexport {' '.join(ours)}\nexec {binary} \"$@\"\n")
                script.chmod(0o755)
            return str(script)

        common = ["podman", "--root", str(b / "root"), "--runroot", str(b / "runroot"), "--tmpdir", str(b / "tmp"),
                  "--storage-driver", "overlay", "--cgroup-manager", "systemd" if self.systemd else "cgroupfs",
                  "--events-backend", "file"]
        if runtime == "runc":
            return [*common, "--runtime", RUNC, "--runtime-flag", f"root={self.base / 'runc-state'}"]
        binary, root = (WRAPPER, self.wrapper_root) if runtime == "wrapper" else (SANDBOX, self.runtime_root)
        return [*common, "--runtime", with_env(binary), "--runtime-flag", f"driver-root={self.driver_root}",
                "--runtime-flag", f"root={root}"]

    def start(self, image: Path) -> None:
        self.host_paths = {} if self.systemd else _cgroup_parents("libpod_parent")  # (systemd: machine.slice)
        self.load(image)

    def run_args(self, gpu: bool, runtime: str = "sandbox") -> list[str]:
        # this VM gives us no CAP_SYS_RESOURCE for podman's default nofile/nproc limits
        args = ["--network", "none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
        return args + (["-e", "NVIDIA_VISIBLE_DEVICES=all"] if gpu else [])

    def stop(self) -> None:
        self.cli("rm", "-af", "-t", "1")
        for pidfile in (self.base / "runroot").glob("overlay-containers/*/userdata/conmon.pid"):
            try:
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        self._leave("root/overlay", "root")


class Containerd(Engine):
    name = "containerd"

    def start(self, image: Path) -> None:
        b = self.base
        self.host_paths = ({p: os.path.exists(p) for p in ("/run/containerd",)}
                           | ({} if self.systemd else _cgroup_parents("test")))
        (b / "config.toml").write_text(
            f'version = 2\nroot = "{b}/root"\nstate = "{b}/state"\n'
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            f'[grpc]\n  address = "{b}/containerd.sock"\n[ttrpc]\n  address = "{b}/containerd.sock.ttrpc"\n'
            f'[debug]\n  address = "{b}/debug.sock"\n')
        (b / "sandbox.toml").write_text(f'driver-root = "{self.driver_root}"\n')
        env = dict(os.environ, SANDBOX_CONFIG=str(b / "sandbox.toml"))  # the shims pass it on to us
        self._daemon(["containerd", "--config", str(b / "config.toml")], "containerd.log", 30, env)
        self.load(image)

    def prefix(self, runtime: str = "sandbox") -> list[str]:
        return ["ctr", "-a", str(self.base / "containerd.sock"), "-n", "test"]

    def run_args(self, gpu: bool, runtime: str = "sandbox") -> list[str]:
        root, binary = {"runc": (self.base / "runc-state", RUNC), "wrapper": (self.wrapper_root, WRAPPER)}.get(
            runtime, (self.runtime_root, SANDBOX))
        # --seccomp: containerd's default profile (podman and Docker add theirs unasked)
        args = ["--seccomp", "--fifo-dir", str(self.base / "fifo"), "--runc-root", str(root), "--runc-binary", binary]
        return args + (["--env", "NVIDIA_VISIBLE_DEVICES=all"] if gpu else [])

    def stop(self) -> None:
        for task in self.cli("task", "ls", "-q").stdout.split():
            self.cli("task", "kill", "-s", "SIGKILL", task)
        time.sleep(0.3)
        for c in self.cli("c", "ls", "-q").stdout.split():
            self.cli("task", "rm", "-f", c)
            self.cli("c", "rm", c)
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()
        self._leave("root")


class Docker(Engine):
    name = "docker"

    def start(self, image: Path, edit=None, env: dict | None = None) -> None:
        """``edit(path)``: a last change to daemon.json before dockerd reads it; ``env``: dockerd's
        (its containerd's, shims' and so the runtime's)."""
        b = self.base
        self.host_paths = ({p: os.path.exists(p) for p in ("/var/run/docker", "/run/containerd")}
                           | ({} if self.systemd else _cgroup_parents("docker")))
        config = {"iptables": False, "ip6tables": False, "ip-forward": False, "ip-masq": False, "bridge": "none",
                  "storage-driver": "overlay2",
                  "runtimes": {"sandbox": {"path": SANDBOX, "runtimeArgs": ["--driver-root", str(self.driver_root)]},
                               "wrapper": {"path": WRAPPER, "runtimeArgs": ["--driver-root", str(self.driver_root)]},
                               "plainrunc": {"path": RUNC}}}
        if self.systemd:  # (its containers: system.slice's docker-ID.scope)
            config["exec-opts"] = ["native.cgroupdriver=systemd"]
        (b / "daemon.json").write_text(json.dumps(config))
        if edit is not None:
            edit(b / "daemon.json")
        self._daemon(["dockerd", "--config-file", str(b / "daemon.json"), "--data-root", str(b / "data"),
                      "--exec-root", str(b / "exec"), "--pidfile", str(b / "dockerd.pid"),
                      "-H", f"unix://{b}/docker.sock"], "dockerd.log", 60, env)
        self.load(image)
        # docker keeps its own runc root; ours is the one under exec-root it passes as --root
        self.runtime_root = b / "exec/runtime-sandbox/moby"
        self.wrapper_root = b / "exec/runtime-wrapper/moby"

    def prefix(self, runtime: str = "sandbox") -> list[str]:
        return [DOCKER, "-H", f"unix://{self.base}/docker.sock"]

    def run_args(self, gpu: bool, runtime: str = "sandbox") -> list[str]:
        name = {"runc": "plainrunc", "wrapper": "wrapper"}.get(runtime, "sandbox")
        return ["--runtime", name, "--network", "none"] + (["-e", "NVIDIA_VISIBLE_DEVICES=all"] if gpu else [])

    def stop(self) -> None:
        ids = self.cli("ps", "-aq").stdout.split()
        if ids:
            self.cli("rm", "-f", *ids)
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()
        self._leave("data", "exec")


ENGINES = {"podman": Podman, "containerd": Containerd, "docker": Docker}
