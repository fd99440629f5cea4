"""`sandbox configure docker|podman|containerd`: our runtime added to the engine's own config
(or made its default), everything else kept, a backup, idempotent; the engine reads it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import fixtures
import pytest
from engines import IMAGE, Docker, Podman

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

SANDBOX = os.path.join(os.path.dirname(sys.executable), "sandbox")


def configure(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sandbox.cli", "configure", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("engine,original", [
    ("docker", '{"debug": true, "runtimes": {"other": {"path": "/x"}}}\n'),
    ("podman", '# ours\n[engine]\ncgroup_manager = "cgroupfs"  # kept\n'),
    ("containerd", 'version = 2\n# a comment\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
                   '  runtime_type = "io.containerd.runc.v2"\n'),
])
def test_configure_keeps_the_rest_backs_up_and_is_idempotent(engine, original, tmp_path):
    path = tmp_path / "conf"
    path.write_text(original)
    r = configure(engine, "--config", str(path), "--default")
    assert r.returncode == 0 and "restart" in r.stdout or "nothing to restart" in r.stdout, r.stderr
    assert (tmp_path / "conf.bak").read_text() == original
    new = path.read_text()
    assert SANDBOX in new
    if engine == "docker":
        conf = json.loads(new)
        assert conf["debug"] is True and conf["runtimes"]["other"] == {"path": "/x"}
        assert conf["runtimes"]["sandbox"] == {"path": SANDBOX} and conf["default-runtime"] == "sandbox"
    else:
        assert all(line in new for line in original.splitlines()), new  # comments and order kept
    mtime = path.stat().st_mtime_ns
    again = configure(engine, "--config", str(path), "--default")
    assert again.returncode == 0 and "nothing changed" in again.stdout and path.stat().st_mtime_ns == mtime


def test_containerd_reads_the_handler(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
                    "  SystemdCgroup = true\n")
    assert configure("containerd", "--config", str(path)).returncode == 0
    dump = subprocess.run(["containerd", "--config", str(path), "config", "dump"], capture_output=True, text=True)
    assert dump.returncode == 0, dump.stderr
    section = dump.stdout.split('[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.sandbox]')[1]
    assert 'runtime_type = "io.containerd.runc.v2"' in section.split("[plugins")[0]
    options = section.split('[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.sandbox.options]')[1]
    assert f'BinaryName = "{SANDBOX}"' in options and "SystemdCgroup = true" in options.split("[plugins")[0]


# Debian's containerd's own config.toml (the package's), which names no runtime
DEBIAN_CONTAINERD = ('version = 2\n\n[plugins]\n  [plugins."io.containerd.grpc.v1.cri"]\n'
                     '    [plugins."io.containerd.grpc.v1.cri".cni]\n      bin_dir = "/usr/lib/cni"\n'
                     '      conf_dir = "/etc/cni/net.d"\n  [plugins."io.containerd.internal.v1.opt"]\n'
                     '    path = "/var/lib/containerd/opt"\n')


def test_containerd_keeps_its_own_runc_handler_where_the_config_names_none(tmp_path):
    """A runtimes table replaces containerd's default one: with our handler alone, runc's is
    gone and the CRI plugin does not load (default_runtime_name runc has no runtime). So runc's
    is written too, and containerd has both; --remove takes both out again."""
    path = tmp_path / "config.toml"
    path.write_text(DEBIAN_CONTAINERD)
    assert configure("containerd", "--config", str(path)).returncode == 0
    dump = subprocess.run(["containerd", "--config", str(path), "config", "dump"], capture_output=True, text=True)
    assert dump.returncode == 0, dump.stderr
    for handler in ("runc", "sandbox"):
        section = dump.stdout.split(f'[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.{handler}]\n')[1]
        assert 'runtime_type = "io.containerd.runc.v2"' in section.split("[plugins")[0], dump.stdout
    r = configure("containerd", "--config", str(path), "--remove")
    assert r.returncode == 0 and f"no longer has 'sandbox' ({SANDBOX})" in r.stdout, r
    assert path.read_text() == DEBIAN_CONTAINERD


@pytest.mark.parametrize("engine,original", [
    ("docker", '{"debug": true, "runtimes": {"other": {"path": "/x"}}}\n'),
    ("docker", '{"log-level": "warn"}\n'),
    ("podman", '# ours\n[engine]\ncgroup_manager = "cgroupfs"  # kept\n'),
    ("podman", ""),
    ("containerd", DEBIAN_CONTAINERD),
    ("containerd", 'version = 2\n# a comment\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
                   '  runtime_type = "io.containerd.runc.v2"\n'),
])
@pytest.mark.parametrize("default", [False, True])
def test_remove_takes_out_what_configure_added(engine, original, default, tmp_path):
    """configure, then configure --remove: the file as it was (docker's: the same JSON; a
    containerd default set back to runc, containerd's own), FILE.bak (the file from before
    configure) left as it is, a second --remove changes nothing, and a runtime that names
    another executable is never taken out."""
    path = tmp_path / "conf"
    path.write_text(original)
    assert configure(engine, "--config", str(path), *(["--default"] if default else [])).returncode == 0
    assert configure(engine, "--config", str(path), "--remove", "--path", "/other/sandbox").stdout.endswith(
        "nothing changed\n")
    r = configure(engine, "--config", str(path), "--remove")
    assert r.returncode == 0 and "no longer has 'sandbox'" in r.stdout, r
    if engine == "docker":
        assert json.loads(path.read_text()) == json.loads(original)
    elif engine == "containerd" and default:  # (containerd's own default, runc, written out)
        import tomllib

        got = tomllib.loads(path.read_text())
        containerd = got["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
        assert containerd.pop("default_runtime_name") == "runc", got
        if not containerd:
            del got["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
        assert got == tomllib.loads(original)
    else:
        assert path.read_text() == original
    assert (tmp_path / "conf.bak").read_text() == original
    again = configure(engine, "--config", str(path), "--remove")
    assert again.returncode == 0 and again.stdout.endswith("nothing changed\n"), again


def test_containerd_refuses_a_version_1_config(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[plugins.cri]\n  sandbox_image = "x"\n')
    r = configure("containerd", "--config", str(path))
    assert r.returncode == 1 and "only version 2" in r.stderr and path.read_text().startswith("[plugins.cri]")


def test_podman_runs_a_gpu_container_with_sandbox_as_its_default(tmp_path_factory, driver_root):
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed")
    tmp_path = tmp_path_factory.mktemp("cfg")  # (podman's runroot: 50 characters at most)
    conf = tmp_path / "containers.conf"
    conf.write_text('[engine]\nevents_logger = "file"\n')
    assert configure("podman", "--config", str(conf), "--default").returncode == 0
    eng = Podman(tmp_path / "p", driver_root)
    eng.start(fixtures.image_archive())
    try:
        common = eng.prefix("runc")[: eng.prefix("runc").index("--runtime")]  # podman and its dirs alone
        info = subprocess.run([*common, "info", "--format", "{{.Host.OCIRuntime.Path}}"], capture_output=True,
                              text=True, env={**os.environ, "CONTAINERS_CONF": str(conf)})
        assert info.stdout.strip() == SANDBOX, info.stderr
        # The entry's program behind a script that sets the tests' SANDBOX_SERVER and _IDLE:
        # podman passes its runtime none of its environment on its own calls (start, delete),
        # and ours would start a server at the node's socket (docs/server.md).
        ours = eng.prefix()[eng.prefix().index("--runtime") + 1]
        conf.write_text(conf.read_text().replace(f'["{SANDBOX}"]', f'["{ours}"]'))
        assert ours != SANDBOX and ours in conf.read_text()
        argv = [*common, "--runtime-flag", f"driver-root={driver_root}", "--runtime-flag",
                f"root={tmp_path / 'state'}", "run", "--rm", *eng.run_args(True), IMAGE, "ls", "/dev/nvidia0"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "CONTAINERS_CONF": str(conf)})
        assert r.returncode == 0 and r.stdout.strip() == "/dev/nvidia0", r.stderr
    finally:
        eng.stop()


def test_docker_runs_a_gpu_container_with_sandbox_as_its_default(tmp_path_factory, driver_root):
    """daemon.json with the engine's own settings and no runtimes; configure --default adds
    ours; dockerd reads it and runs a GPU container with it (the driver root from our config
    file, which dockerd's environment names)."""
    if shutil.which("dockerd") is None:
        pytest.skip("dockerd is not installed")
    tmp_path = tmp_path_factory.mktemp("dcfg")
    ours = tmp_path / "sandbox.toml"
    ours.write_text(f'driver-root = "{driver_root}"\n')

    def edit(path):
        config = json.loads(path.read_text())
        del config["runtimes"]
        path.write_text(json.dumps(config))
        r = configure("docker", "--config", str(path), "--default")
        assert r.returncode == 0 and "restart" in r.stdout, r.stderr

    eng = Docker(tmp_path / "d", driver_root)
    try:
        eng.start(fixtures.image_archive(), edit=edit, env={**os.environ, "SANDBOX_CONFIG": str(ours)})
        assert eng.cli("info", "--format", "{{.DefaultRuntime}}").stdout.strip() == "sandbox"
        r = eng.cli("run", "--rm", "--network", "none", "-e", "NVIDIA_VISIBLE_DEVICES=all", IMAGE, "ls", "/dev/nvidia0")
        assert r.returncode == 0 and r.stdout.strip() == "/dev/nvidia0", r.stderr
    finally:
        if getattr(eng, "proc", None) is not None:
            eng.stop()


def test_containerd_runs_a_gpu_pod_with_the_handler_configure_wrote(tmp_path_factory, driver_root, monkeypatch):
    """containerd's CRI config (scripts/cri.py's) with its sandbox handler taken out; configure
    puts one back; containerd reads it and runs a GPU pod through it (the driver root from our
    config file, which containerd's environment names)."""
    import cri as cri_mod
    import tomlkit

    if shutil.which("containerd") is None:
        pytest.skip("containerd is not installed")
    base = tmp_path_factory.mktemp("ccfg")
    ours = base / "sandbox.toml"
    ours.write_text(f'driver-root = "{driver_root}"\n')
    monkeypatch.setenv("SANDBOX_CONFIG", str(ours))  # containerd's, and so its shims' and ours

    def edit(path):
        doc = tomlkit.parse(path.read_text())
        del doc["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["sandbox"]
        path.write_text(tomlkit.dumps(doc))
        assert SANDBOX not in path.read_text()
        r = configure("containerd", "--config", str(path))
        assert r.returncode == 0 and "restart" in r.stdout, r.stderr
        doc = tomlkit.parse(path.read_text())  # the runtime's state under the test's dir, not /run/containerd
        doc["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["sandbox"]["options"]["Root"] = \
            str(base / "sandbox-root")
        path.write_text(tomlkit.dumps(doc))

    c = cri_mod.CRI(base / "c", driver_root, trace=False)
    c.edit_config = edit
    try:
        c.start()
        pod = c.run_pod("configured", "sandbox")
        cid = c.run_container(pod, "gpu", ["ls", "/dev/nvidia0"], env={"NVIDIA_VISIBLE_DEVICES": "all"})
        st = c.wait_exited(cid, timeout=30)
        log = c.container_log(pod, "gpu")
        assert (st.exit_code, log.split()) == (0, ["/dev/nvidia0"]), (st, log)
        assert not c.teardown_pod(pod)
    finally:
        problems = c.stop()
    assert not problems, problems
