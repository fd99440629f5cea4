"""CVE-2019-5736's class, tried as the attacker: a process of the container holding
CAP_SYS_PTRACE watches its pid namespace while other processes arrive (plain execs, execs
granted the capability in every spelling, a second container created into the namespace)
and opens every exe, cwd, root, fd and mapped file of every process it sees. None of those
may be a host file that opens for writing; none may be the host's root or a directory of
its procfs (the way to /proc/1/root), except the root of the init of a container created
into the namespace while it sets up, before pivot_root (runc's init shows the host's root
there too: the pid namespace is joined before the mounts). runc passes the same probe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.helpers import CLI

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

SOURCE = Path(__file__).parent / "programs" / "watcher.c"
ETXTBSY = 26  # busy now is not unwritable: the attack waits for the interpreter to be idle


def _bundle(make_bundle, tmp_path, name: str, args: list[str], caps: list[str], pid_ns: str | None = None) -> Path:
    bundle = make_bundle(args)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["capabilities"] = {k: caps for k in ("bounding", "effective", "permitted")}
    spec["mounts"].append({"destination": "/w", "type": "bind", "source": str(tmp_path / "w"),
                           "options": ["rbind", "rw"]})
    if pid_ns is not None:
        spec["linux"]["namespaces"] = [ns if ns["type"] != "pid" else {"type": "pid", "path": pid_ns}
                                       for ns in spec["linux"]["namespaces"]]
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


def _host_files(pid: int) -> set[tuple[int, int]]:
    """(dev, ino) of every host file ``pid`` maps (an interpreter of ours, as the host sees
    it: its libraries and extension modules; a sealed copy is no host file), and of the
    interpreter itself."""
    real = os.stat(os.path.realpath(sys.executable))
    out = {(real.st_dev, real.st_ino)}
    for name in os.listdir(f"/proc/{pid}/map_files"):
        try:
            if os.readlink(f"/proc/{pid}/map_files/{name}").startswith("/memfd:"):
                continue
            st = os.stat(f"/proc/{pid}/map_files/{name}")
        except OSError:
            continue
        out.add((st.st_dev, st.st_ino))
    return out


def _mark(w: Path) -> None:
    """A new phase of the watcher's records."""
    (w / "mark").touch()
    while (w / "mark").exists():
        time.sleep(0.01)


def _probe(runtime: list[str], make_bundle, tmp_path, tag: str) -> tuple[list[list[str]], set, str]:
    w = tmp_path / "w"
    w.mkdir()
    subprocess.run(["gcc", "-static", "-O2", "-o", str(w / "watcher"), str(SOURCE)], check=True)
    watcher = _bundle(make_bundle, tmp_path, "a", ["/w/watcher", "/w/out", "/w/stop", "/w/mark"], ["CAP_SYS_PTRACE"])
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "timeout": 60}
    a, b = f"watch{tag}{os.getpid()}", f"joined{tag}{os.getpid()}"
    assert subprocess.run([*runtime, "run", "-d", "-b", str(watcher), a], **quiet).returncode == 0
    host: set = set()
    try:
        while not (w / "out").exists():
            time.sleep(0.01)
        init = json.loads(subprocess.run([*runtime, "state", a], capture_output=True, text=True).stdout)["pid"]
        spellings = [["--cap=CAP_SYS_PTRACE", "true"], ["-c", "CAP_SYS_PTRACE", "true"]]
        if runtime[0] != "runc":  # (its flag parser has no -cVALUE)
            spellings.append(["-cCAP_SYS_PTRACE", "true"])
        for args in (["true"], ["true"], *spellings, ["true"]):
            r = subprocess.run([*runtime, "exec", *args[:-1], a, args[-1]], capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
        _mark(w)
        # a second container into the watcher's pid namespace: its init waits for start there
        joined = _bundle(make_bundle, tmp_path, "b", ["true"], ["CAP_KILL"], pid_ns=f"/proc/{init}/ns/pid")
        assert subprocess.run([*runtime, "create", "-b", str(joined), b], **quiet).returncode == 0
        binit = json.loads(subprocess.run([*runtime, "state", b], capture_output=True, text=True).stdout)["pid"]
        host = _host_files(binit)
        _mark(w)  # created: from here on the init is as it waits for start
        time.sleep(0.5)
        subprocess.run([*runtime, "delete", "--force", b], **quiet)
    finally:
        (w / "stop").touch()
        subprocess.run([*runtime, "kill", a, "KILL"], **quiet)
        time.sleep(0.2)
        subprocess.run([*runtime, "delete", "--force", a], **quiet)
        subprocess.run([*runtime, "delete", "--force", b], **quiet)
        state = subprocess.run([*runtime, "state", b], capture_output=True, text=True).stdout
    return [line.split() for line in (w / "out").read_text().splitlines()], host, state


def _verdict(records: list[list[str]], host_files: set) -> tuple[list, list]:
    """(the records of processes that are not the container's own programs, the offending
    ones: a host file that opens for writing or is only busy; the host's root or a
    directory of its procfs, but in the joined init while it sets up). Phases: 0 the
    execs, 1 the joined container's create, 2 its init waiting for start."""
    host_root = os.stat("/")
    host_proc = os.stat("/proc").st_dev
    ours, bad, phase = [], [], 0
    for record in records:
        if record == ["MARK"]:
            phase += 1
            continue
        pid, comm, link, dev, ino, kind, werr, sealed, ro = record
        if comm in ("true", "watcher", "sleep"):
            continue
        ours.append((pid, comm, link, phase == 2))
        key = (int(dev), int(ino))
        writable = kind == "f" and ro == "0" and sealed == "0" and int(werr) in (0, ETXTBSY)
        gateway = key == (host_root.st_dev, host_root.st_ino) or (key[0] == host_proc and kind == "d")
        own_proc = key[0] == host_proc and writable  # (runc's init holds its own /proc files as it sets up)
        if (key in host_files and writable) or ((gateway or own_proc) and phase != 1):
            bad.append((pid, comm, link, werr, phase))
    return ours, bad


@pytest.mark.parametrize("runtime", ["sandbox", "sandbox+server", "runc"])
def test_a_ptrace_capable_container_sees_no_writable_host_file(runtime, make_bundle, tmp_path, monkeypatch):
    cli = [*CLI, "--root", str(tmp_path / "s")] if runtime == "sandbox" else ["runc", "--root", str(tmp_path / "r")]
    server = None
    if runtime == "sandbox+server":  # the execs by the launcher's C front end (sandbox/executor/frontend.c)
        import engines

        if not Path(engines.SANDBOX).is_file():
            pytest.skip("the launcher is not built")
        server = engines.WarmServer(tmp_path / "warm").__enter__()
        monkeypatch.setenv("SANDBOX_SERVER", str(server.path))
        cli = [engines.SANDBOX, "--root", str(tmp_path / "s")]
    try:
        records, host, _ = _probe(cli, make_bundle, tmp_path, runtime[0])
    finally:
        if server is not None:
            served = server.log.read_text()
            server.__exit__()
    if server is not None:
        # every exec the front end's (the -cCAP spelling too: the server's child reads any
        # command line), and the create into another's pid namespace (its init the launcher's child)
        assert served.count(" exec ") >= 6 and served.count(": create: ") == 1 and ": declined: " not in served, served
    if server is not None:
        launcher = os.stat(engines.SANDBOX)
        host.add((launcher.st_dev, launcher.st_ino))  # (its host file must never be the container's to write)
    ours, bad = _verdict(records, host)
    if server is not None:  # the front end seen before its exec (it runs as the launcher: "sandbox")
        assert any(comm == "sandbox" for _, comm, _, _ in ours), ours
    assert ours, "the watcher saw none of the runtime's processes: the probe proves nothing"
    assert any(marked for *_, marked in ours), "the watcher never saw the created init wait for start"
    assert host, "no host files to compare with"
    assert not bad, bad


def test_a_created_init_of_the_launchers_shows_no_host_file(make_bundle, tmp_path, monkeypatch):
    """Served create (sandbox/executor/create_plan.py): the container's pid 1 is the launcher, a C
    program, waiting for start. A process exec'd into the container with CAP_SYS_PTRACE
    opens its exe (a read-only view of the launcher), cwd, root (the container's, never a
    host directory), fds (exec.fifo: a FIFO of the state's, not writable as a file) and maps:
    none is a writable host file or a way to the host's root."""
    import engines

    if not Path(engines.SANDBOX).is_file():
        pytest.skip("the launcher is not built")
    w = tmp_path / "w"
    w.mkdir()
    subprocess.run(["gcc", "-static", "-O2", "-o", str(w / "watcher"), str(SOURCE)], check=True)
    bundle = _bundle(make_bundle, tmp_path, "a", ["true"], ["CAP_SYS_PTRACE"])
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "timeout": 60}
    with engines.WarmServer(tmp_path / "warm") as server:
        monkeypatch.setenv("SANDBOX_SERVER", str(server.path))
        cli = [engines.SANDBOX, "--root", str(tmp_path / "s")]
        assert subprocess.run([*cli, "create", "-b", str(bundle), "c"], **quiet).returncode == 0
        try:
            init = json.loads(subprocess.run([*cli, "state", "c"], capture_output=True, text=True).stdout)["pid"]
            assert Path(f"/proc/{init}/comm").read_text().strip() == "sandbox"  # the launcher, waiting
            # its command line (world-readable) and environment are the engine's: blanked
            assert Path(f"/proc/{init}/cmdline").read_bytes().rstrip(b"\0") == b"sandbox-init"
            assert not Path(f"/proc/{init}/environ").read_bytes().strip(b"\0")
            # ... whatever argv[0] the engine gave (the whole argument area holds the name)
            assert subprocess.run(["sandbox", "--root", str(tmp_path / "s"), "create", "-b", str(bundle), "c2"],
                                  executable=engines.SANDBOX, **quiet).returncode == 0
            init2 = json.loads(subprocess.run([*cli, "state", "c2"], capture_output=True, text=True).stdout)["pid"]
            assert Path(f"/proc/{init2}/cmdline").read_bytes().rstrip(b"\0") == b"sandbox-init"
            subprocess.run([*cli, "delete", "--force", "c2"], **quiet)
            r = subprocess.run([*cli, "exec", "-d", "c", "/w/watcher", "/w/out", "/w/stop", "/w/mark"], **quiet)
            assert r.returncode == 0
            deadline = time.monotonic() + 20
            while not (w / "out").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)
            host = _host_files(init)
        finally:
            (w / "stop").touch()
            time.sleep(0.1)
            subprocess.run([*cli, "delete", "--force", "c"], **quiet)
        served = server.log.read_text()
    assert "sandbox serve: create: " in served and "declined" not in served, served
    launcher = os.stat(engines.SANDBOX)
    host.add((launcher.st_dev, launcher.st_ino))
    records = [line.split() for line in (w / "out").read_text().splitlines()]
    ours, bad = _verdict([["MARK"], ["MARK"], *records], host)  # (phase 2: as it waits for start)
    assert any(comm == "sandbox" for _, comm, _, _ in ours), ours
    assert not bad, bad
    # its cwd and root: the container's root (never a host directory, whose ".." climbs the host's tree)
    rootfs = os.stat(json.loads((bundle / "config.json").read_text())["root"]["path"])
    places = {r[2]: (int(r[3]), int(r[4])) for r in records if r[1:2] == ["sandbox"] and r[2] in ("cwd", "root")}
    assert places == {"cwd": (rootfs.st_dev, rootfs.st_ino), "root": (rootfs.st_dev, rootfs.st_ino)}, places
