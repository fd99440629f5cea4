"""mounts/spec.py, the OCI runtime spec as Structs, without root or fixtures: the spec's
camelCase names, defaults as runc takes them, the process env as execve's consumers read
it, NVIDIA's hooks told apart from the bundle's, CDI requests seen, and what msgspec refuses
on decode (the validator's checks on top are tests/mounts/test_bundle.py's)."""

from __future__ import annotations

import json

import msgspec
import pytest

from mounts import spec as S


def decode(doc: dict) -> S.Spec:
    return msgspec.json.decode(json.dumps(doc).encode(), type=S.Spec)


MINIMAL = {"ociVersion": "1.0.2", "root": {"path": "rootfs"}}


def test_a_minimal_spec_has_runcs_defaults():
    spec = decode(MINIMAL)
    assert spec.process is None and spec.hooks is None and spec.mounts == [] and spec.annotations == {}
    assert spec.root == S.Root("rootfs", readonly=False)
    assert spec.linux.namespaces == [] and spec.linux.seccomp is None and spec.linux.sysctl == {}


def test_camel_case_fields_are_read_into_snake_case():
    spec = decode({**MINIMAL, "process": {"args": ["sh"], "cwd": "/", "noNewPrivileges": True,
                                          "user": {"uid": 1, "gid": 2, "additionalGids": [3], "umask": 18},
                                          "apparmorProfile": "p", "oomScoreAdj": 5},
                   "linux": {"maskedPaths": ["/proc/kcore"], "readonlyPaths": ["/proc/sys"],
                             "cgroupsPath": "/x", "rootfsPropagation": "rslave",
                             "uidMappings": [{"containerID": 0, "hostID": 1000, "size": 1}]},
                   "hooks": {"createRuntime": [{"path": "/bin/true"}], "startContainer": [{"path": "/bin/x"}]}})
    p = spec.process
    assert p is not None and p.no_new_privileges and p.apparmor_profile == "p" and p.oom_score_adj == 5
    assert p.user == S.User(1, 2, 18, [3])
    assert spec.linux.masked_paths == ["/proc/kcore"] and spec.linux.readonly_paths == ["/proc/sys"]
    assert spec.linux.cgroups_path == "/x" and spec.linux.rootfs_propagation == "rslave"
    assert spec.hooks is not None and [h.path for h in spec.hooks.create_runtime] == ["/bin/true"]
    assert [h.path for h in spec.hooks.start_container] == ["/bin/x"]


@pytest.mark.parametrize("doc,where", [
    ({"root": {"path": "r"}}, "ociVersion"),  # required
    ({"ociVersion": "1.0.2"}, "root"),
    ({**MINIMAL, "process": {"args": []}}, "args"),  # at least one
    ({**MINIMAL, "process": {"args": "sh"}}, "args"),  # a list, not a string
    ({**MINIMAL, "process": {"args": ["sh"], "user": {"uid": "0"}}}, "uid"),
    ({**MINIMAL, "mounts": [{"source": "/x"}]}, "destination"),
])
def test_decode_refuses_what_is_not_a_spec_and_says_where(doc, where):
    with pytest.raises(msgspec.ValidationError) as e:
        decode(doc)
    assert where in str(e.value)


def test_getenv_is_the_last_value_as_execve_consumers_read_it():
    p = S.Process(["sh"], env=["A=1", "NVIDIA_VISIBLE_DEVICES=0", "B=", "NVIDIA_VISIBLE_DEVICES=all"])
    assert p.getenv("NVIDIA_VISIBLE_DEVICES") == "all" and p.getenv("B") == "" and p.getenv("C") is None
    assert S.Process(["sh"], env=["AB=1"]).getenv("A") is None  # a prefix is not the name


@pytest.mark.parametrize("hook,nvidia", [
    (S.Hook("/usr/bin/nvidia-container-runtime-hook", ["nvidia-container-runtime-hook", "prestart"]), True),
    (S.Hook("/usr/bin/nvidia-container-toolkit", ["x", "prestart"]), True),
    (S.Hook("/usr/bin/nvidia-cdi-hook", ["nvidia-cdi-hook", "update-ldcache"]), True),
    (S.Hook("/usr/bin/nvidia-ctk", ["nvidia-ctk", "hook", "create-symlinks"]), True),
    (S.Hook("/usr/bin/nvidia-ctk", ["nvidia-ctk", "cdi", "generate"]), False),  # not a hook of it
    (S.Hook("/usr/libexec/docker/libnetwork-setkey", ["libnetwork-setkey", "x"]), False),
])
def test_nvidias_hooks_are_dropped_and_the_bundles_kept(hook, nvidia):
    hooks = S.Hooks(prestart=[hook], poststop=[S.Hook("/bin/true")])
    assert S.is_nvidia_hook(hook) is nvidia and hooks.has_nvidia() is nvidia
    assert hooks.ours().prestart == ([] if nvidia else [hook]) and hooks.ours().poststop == hooks.poststop


@pytest.mark.parametrize("env,annotations,asks", [
    (["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0"], {}, True),
    (["NVIDIA_VISIBLE_DEVICES=0,1"], {}, False),
    (["NVIDIA_VISIBLE_DEVICES=all"], {"cdi.k8s.io/x": "example.com/dev=a"}, True),
    ([], {"io.kubernetes.cri.x": "y"}, False),
])
def test_a_cdi_request_is_seen_in_the_env_or_the_annotations(env, annotations, asks):
    spec = decode({**MINIMAL, "process": {"args": ["sh"], "env": env}, "annotations": annotations})
    assert spec.asks_for_cdi() is asks


def test_names_cdi_is_a_qualified_name():
    assert S.names_cdi("nvidia.com/gpu=0") and S.names_cdi("a.b/c=d,0")
    assert not S.names_cdi("GPU-1234") and not S.names_cdi("0,1") and not S.names_cdi("a=b")


def test_capability_numbers_and_limits_are_the_kernels():
    assert S.CAP_NUMBERS["CAP_CHOWN"] == 0 and S.CAP_NUMBERS["CAP_SYS_ADMIN"] == 21
    assert S.CAP_NUMBERS["CAP_CHECKPOINT_RESTORE"] == 40 and len(S.CAP_NUMBERS) == 41
    assert S.RLIM_MAX == 2**64 - 1 and "RLIMIT_NOFILE" in S.RLIMITS


@pytest.mark.parametrize("key,file", [
    ("net.ipv4.ip_forward", "net/ipv4/ip_forward"),
    ("net/ipv4/ip_forward", "net/ipv4/ip_forward"),
    # sysctl(8): in the dotted form a "/" is a dot of the name's own (an interface eth0.100)
    ("net.ipv4.conf.eth0/100.forwarding", "net/ipv4/conf/eth0.100/forwarding"),
    ("net/ipv4/conf/eth0.100/forwarding", "net/ipv4/conf/eth0.100/forwarding"),
    ("kernel.shmmax", "kernel/shmmax"),
])
def test_a_sysctl_key_names_its_file_as_sysctl_8_reads_it(key, file):
    assert S.sysctl_file(key) == file
    assert S.sysctl_name(key) == S.sysctl_name(S.sysctl_name(key)) == S.sysctl_name(file)
