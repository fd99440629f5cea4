"""The Kubernetes node installer (deploy/kubernetes/), as docs/kubernetes.md deploys it, on a
node made for the test: a Debian 12 root with systemd and containerd (mmdebstrap), booted with
systemd-nspawn with no network (scripts/debroot.py). The image is built with podman from the
package, on a base imported from that root; kubectl's part is played from the manifests
themselves: the DaemonSet's pod spec run with a private podman (privileged, its host path /
the node's root, its environment, its readiness probe; its deletion a stop with the manifest's
grace period), and the GPU pod's spec sent to the node's own containerd through the CRI, as
kubelet sends it, with the RuntimeClass's handler. The node after each step: the package, its
socket running, the handler in the running containerd, a GPU pod's log; after the DaemonSet's
deletion nothing of ours, and the containerd config byte for byte what it was."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid

import fixtures
import pytest
import yaml

from tests.integration import nodes

pytestmark = [pytest.mark.slow]

DOC = nodes.REPO / "docs/kubernetes.md"
MANIFEST = nodes.REPO / "deploy/kubernetes/gpu-sandbox.yaml"
POD = nodes.REPO / "deploy/kubernetes/gpu-pod.yaml"
APP_IMAGE = fixtures.IMAGE  # what the GPU pod's image stands for: the fixture image, in the node
BY_PRODUCTS = ("var/lib/dpkg/", "var/log/dpkg.log", "var/log/pods", "var/lib/containerd/")


def expected_commands(deb: str) -> list[str]:
    return ["mmdebstrap --variant=minbase bookworm debian-12.tar",
            "podman import debian-12.tar localhost/debian:12",
            "podman build -f deploy/kubernetes/Containerfile --build-arg DEB=dist/" + deb
            + " -t localhost/gpu-sandbox-node:0.1.0 .",
            "podman save -o gpu-sandbox-node.tar localhost/gpu-sandbox-node:0.1.0",
            "ctr -n k8s.io images import gpu-sandbox-node.tar",
            "kubectl apply -f deploy/kubernetes/gpu-sandbox.yaml",
            "kubectl -n gpu-sandbox rollout status daemonset/gpu-sandbox-node",
            "kubectl apply -f deploy/kubernetes/gpu-pod.yaml",
            "kubectl logs gpu-check",
            "kubectl delete -f deploy/kubernetes/gpu-pod.yaml",
            "kubectl delete -f deploy/kubernetes/gpu-sandbox.yaml"]


def manifests() -> tuple[dict, dict, dict]:
    docs = {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text())}
    return docs["DaemonSet"], docs["RuntimeClass"], yaml.safe_load(POD.read_text())


def test_the_manifests_agree():
    """The RuntimeClass names configure's handler and schedules where the DaemonSet runs; the
    pod names the RuntimeClass; the DaemonSet's image is the one docs/kubernetes.md builds."""
    daemonset, runtime_class, pod = manifests()
    spec = daemonset["spec"]["template"]["spec"]
    assert runtime_class["handler"] == "sandbox"  # (sandbox configure's default name)
    assert runtime_class["scheduling"]["nodeSelector"] == spec["nodeSelector"]
    assert pod["spec"]["runtimeClassName"] == runtime_class["metadata"]["name"]
    assert spec["containers"][0]["image"] in DOC.read_text()
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"} and "nvidia.com/gpu.present=true" in DOC.read_text()


def podman_run_args(daemonset: dict, node: nodes.debroot.Node, env: dict[str, str]) -> tuple[list[str], dict]:
    """``podman run`` flags for the DaemonSet's pod on ``node`` (kubelet's part): privileged,
    each hostPath volume the node's directory (with the node's file systems below it, as a
    hostPath mount of / with HostToContainer propagation shows them), the env (``env`` over
    the manifest's)."""
    spec = daemonset["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["securityContext"]["privileged"] is True
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    flags = ["--privileged"]
    for mount in container["volumeMounts"]:
        host = volumes[mount["name"]]
        assert mount.get("mountPropagation") == "HostToContainer"
        for below, there in sorted(node.mounts().items()):
            if below == host or below.startswith(host.rstrip("/") + "/"):
                dest = os.path.join(mount["mountPath"], os.path.relpath(below, host))
                flags += ["-v", f"{there}:{os.path.normpath(dest)}:rslave"]
    values = {e["name"]: e["value"] for e in container["env"]} | env
    for key, value in values.items():
        flags += ["-e", f"{key}={value}"]
    return flags, container


def test_the_commands_of_docs_kubernetes_md_on_a_node_made_for_the_test(tmp_path_factory, driver_root):
    import engines

    why = nodes.missing() or (None if shutil.which("podman") else "podman is not installed (scripts/setup installs it)")
    if why:
        pytest.skip(why)
    pytest.importorskip("grpc", reason="grpcio is in the test extra (pyproject.toml)")
    import cri as cri_mod

    tarball, _ = nodes.root_tarball(), nodes.nspawn()
    deb = nodes.build_package(tmp_path_factory.getbasetemp())
    commands = nodes.doc_commands(DOC)
    assert commands == expected_commands(deb.name), "docs/kubernetes.md's commands are not the ones this test runs"
    api, grpc_api = cri_mod.load_api()
    daemonset, runtime_class, pod_manifest = manifests()
    base = tmp_path_factory.mktemp("kube")
    mounts = nodes.mount_table()
    # the build's directory, as the checkout's root is: the package in dist/, the Containerfile
    ctx = base / "ctx"
    (ctx / "dist").mkdir(parents=True)
    shutil.copy(deb, ctx / "dist" / deb.name)
    shutil.copytree(nodes.REPO / "deploy/kubernetes", ctx / "deploy/kubernetes")
    root = nodes.debroot.extract(tarball, base / "root")
    os.link(cri_mod.pause_image(), root / "root/pause.tar")
    os.link(fixtures.image_archive(), root / "root/gpubox.tar")
    node = nodes.debroot.Node(root, read_only_binds={str(driver_root): "/run/nvidia/driver"})
    eng = engines.Podman(base / "p", driver_root)
    eng.host_paths = engines._cgroup_parents("libpod_parent")
    node.boot()
    try:
        def podman(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
            return eng.cli(*args, runtime="runc", timeout=timeout, cwd=ctx)

        def on_node(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
            return node.run("sh", "-c", "cd /root && " + " ".join(argv), timeout=timeout)

        def containerd() -> tuple[str, dict]:
            """The node's containerd: its pid, and the config the running one has (the CRI's Status)."""
            import grpc

            pid = node.run("systemctl", "show", "-p", "MainPID", "--value", "containerd").stdout.strip()
            with grpc.insecure_channel(f"unix://{node.run_dir}/containerd/containerd.sock") as channel:
                runtime = grpc_api.RuntimeServiceStub(channel)
                deadline = time.monotonic() + 30
                while True:
                    try:
                        info = runtime.Status(api.StatusRequest(verbose=True), timeout=10).info
                        return pid, json.loads(info["config"])
                    except grpc.RpcError:
                        assert time.monotonic() < deadline, node.run("journalctl", "-u", "containerd", "-n", "20",
                                                                     "--no-pager").stdout
                        time.sleep(0.2)

        # what the node has before: containerd (Debian's config; this VM grants no CAP_SYS_RESOURCE,
        # which the pause container's oom_score_adj -998 takes, as scripts/cri.py's), the pause and
        # app images
        assert node.run("ls", "/sys/class/net").stdout.split() == ["lo"]
        conf = root / "etc/containerd/config.toml"
        header = '[plugins."io.containerd.grpc.v1.cri"]\n'
        assert header in conf.read_text()
        conf.write_text(conf.read_text().replace(header, header + "    restrict_oom_score_adj = true\n"))
        assert node.run("systemctl", "restart", "containerd").returncode == 0
        original = conf.read_bytes()
        pid0, config0 = containerd()
        assert "sandbox" not in config0["containerd"]["runtimes"]
        for tar in ("pause.tar", "gpubox.tar"):
            assert on_node("ctr -n k8s.io images import", tar).returncode == 0
        tag = on_node("ctr -n k8s.io images tag", cri_mod.PAUSE_IMAGE, config0["sandboxImage"])
        assert tag.returncode == 0, tag.stderr  # (the pod's pause: never pulled)
        before = nodes.picture(root)

        # the image: the base from mmdebstrap's root (this machine's archive, the node's packages)
        assert commands.pop(0).startswith("mmdebstrap")
        r = podman(*commands.pop(0).replace("debian-12.tar", str(tarball)).split()[1:])  # podman import
        assert r.returncode == 0, r.stderr
        r = podman(*commands.pop(0).split()[1:])  # podman build
        assert r.returncode == 0, r.stderr[-3000:]
        r = podman(*commands.pop(0).split()[1:])  # podman save
        assert r.returncode == 0, r.stderr
        os.rename(ctx / "gpu-sandbox-node.tar", root / "root/gpu-sandbox-node.tar")
        r = on_node(commands.pop(0), timeout=300)  # ctr -n k8s.io images import (on the node)
        assert r.returncode == 0, r.stderr
        (container,) = daemonset["spec"]["template"]["spec"]["containers"]
        assert container["image"] in on_node("ctr -n k8s.io images ls -q").stdout.split()
        (root / "root/gpu-sandbox-node.tar").unlink()

        # kubectl apply -f gpu-sandbox.yaml: the DaemonSet's pod on the node (the driver as the GPU
        # operator's would be: DRIVER_ROOT)
        assert commands.pop(0) == "kubectl apply -f deploy/kubernetes/gpu-sandbox.yaml"
        flags, container = podman_run_args(daemonset, node, {"DRIVER_ROOT": "/run/nvidia/driver"})
        # (a pod's pid namespace is a child of its node's: the node's systemd sees the pod's
        # processes, and takes them as peers on its private socket, which needs the peer's
        # pid; a container of this host's podman is not in the node's, so it joins that one)
        flags += ["--pid", f"ns:/proc/{node.leader}/ns/pid"]
        r = podman("run", "-d", "--name", "node-install", "--network", "none", "--ulimit", "nofile=1024:1024",
                   "--ulimit", "nproc=1024:1024", *flags, container["image"])
        assert r.returncode == 0, r.stderr
        # kubectl rollout status: the readiness probe
        assert commands.pop(0).startswith("kubectl -n gpu-sandbox rollout status")
        deadline = time.monotonic() + 120
        while podman("exec", "node-install", *container["readinessProbe"]["exec"]["command"]).returncode != 0:
            running = podman("inspect", "-f", "{{.State.Running}}", "node-install").stdout.strip()
            assert running == "true" and time.monotonic() < deadline, podman("logs", "node-install").stdout
            time.sleep(0.5)
        log = podman("logs", "node-install").stdout
        assert "gpu-sandbox-node: installed gpu-sandbox 0.1.0 on the node" in log, log
        status = node.run("dpkg-query", "-W", "-f=${db:Status-Status} ${Version}", "gpu-sandbox").stdout
        assert status == "installed 0.1.0", status
        assert node.run("systemctl", "is-active", "gpu-sandbox.socket").stdout.strip() == "active", log
        assert (root / "etc/containerd/config.toml.bak").read_bytes() == original
        pid1, config1 = containerd()
        assert pid1 != pid0, "containerd was not restarted"
        assert config1["containerd"]["runtimes"]["sandbox"]["options"]["BinaryName"] == \
            "/usr/lib/gpu-sandbox/bin/sandbox", config1["containerd"]["runtimes"]
        assert 'driver-root = "/run/nvidia/driver"' in (root / "etc/gpu-sandbox/config.toml").read_text()

        # kubectl apply -f gpu-pod.yaml: kubelet's CRI calls for the pod, its RuntimeClass's handler
        assert commands.pop(0) == "kubectl apply -f deploy/kubernetes/gpu-pod.yaml"
        import grpc

        with grpc.insecure_channel(f"unix://{node.run_dir}/containerd/containerd.sock") as channel:
            runtime = grpc_api.RuntimeServiceStub(channel)
            (spec,) = pod_manifest["spec"]["containers"]
            uid = str(uuid.uuid4())
            name = pod_manifest["metadata"]["name"]
            logs = f"/var/log/pods/default_{name}_{uid}"
            pod_config = api.PodSandboxConfig(
                metadata=api.PodSandboxMetadata(name=name, uid=uid, namespace="default", attempt=0),
                log_directory=logs,
                linux=api.LinuxPodSandboxConfig(security_context=api.LinuxSandboxSecurityContext(
                    namespace_options=api.NamespaceOption(network=api.NODE))))
            handler = runtime_class["handler"]
            pod_id = runtime.RunPodSandbox(api.RunPodSandboxRequest(config=pod_config, runtime_handler=handler),
                                           timeout=120).pod_sandbox_id
            cid = runtime.CreateContainer(api.CreateContainerRequest(
                pod_sandbox_id=pod_id, sandbox_config=pod_config, config=api.ContainerConfig(
                    metadata=api.ContainerMetadata(name=spec["name"], attempt=0),
                    image=api.ImageSpec(image=APP_IMAGE), command=spec["command"],
                    envs=[api.KeyValue(key=e["name"], value=e["value"]) for e in spec["env"]],
                    log_path=f"{spec['name']}/0.log")), timeout=120).container_id
            runtime.StartContainer(api.StartContainerRequest(container_id=cid), timeout=120)
            deadline = time.monotonic() + 60
            while (st := runtime.ContainerStatus(api.ContainerStatusRequest(container_id=cid),
                                                 timeout=30).status).state != api.CONTAINER_EXITED:
                assert time.monotonic() < deadline, st
                time.sleep(0.2)
            # kubectl logs gpu-check: nvidia-smi -L, the node's driver's, mounted (no kernel module here)
            assert commands.pop(0) == "kubectl logs gpu-check"
            text = (root / logs.lstrip("/") / spec["name"] / "0.log").read_text()
            assert st.exit_code == 9 and "couldn't communicate with the NVIDIA driver" in text, (st, text)
            # kubectl delete -f gpu-pod.yaml
            assert commands.pop(0) == "kubectl delete -f deploy/kubernetes/gpu-pod.yaml"
            runtime.StopPodSandbox(api.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=120)
            runtime.RemovePodSandbox(api.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=120)

        # kubectl delete -f gpu-sandbox.yaml: SIGTERM, the manifest's grace period
        assert commands.pop(0) == "kubectl delete -f deploy/kubernetes/gpu-sandbox.yaml"
        grace = daemonset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        r = podman("stop", "-t", str(grace), "node-install", timeout=grace + 30)
        assert r.returncode == 0, r.stderr
        log = podman("logs", "node-install").stdout
        assert podman("inspect", "-f", "{{.State.ExitCode}}", "node-install").stdout.strip() == "0", log
        assert "gpu-sandbox-node: purged gpu-sandbox from the node" in log, log
        assert commands == []
        assert node.run("dpkg-query", "-W", "-f=${db:Status-Status}", "gpu-sandbox").stdout in ("", "not-installed")
        assert (root / "etc/containerd/config.toml").read_bytes() == original
        pid2, config2 = containerd()
        assert pid2 != pid1 and "sandbox" not in config2["containerd"]["runtimes"]
        assert node.run("systemctl", "is-active", "gpu-sandbox.socket").stdout.strip() == "inactive"
        assert not (node.run_dir / "gpu-sandbox").exists()
        after = nodes.picture(root)
        left = {k: (before.get(k), after.get(k)) for k in set(before) | set(after) if before.get(k) != after.get(k)}
        assert {k for k in left if not k.startswith(BY_PRODUCTS)} == set(), left
        # (the installer's image stays in the node's containerd, as kubelet leaves an image until
        # its garbage collection)
        assert [k for k in left if "gpu-sandbox" in k and not k.startswith("var/lib/containerd/")] == [], left
    finally:
        podman("rm", "-f", "-t", "0", "node-install")
        problems = node.stop()  # (first: what the installer started in the node is in its container's cgroup)
        eng.stop()
    assert problems + nodes.left_behind(base, mounts) == []
    shutil.rmtree(base)  # (the node's root and the rest: ~400 MB a run)
