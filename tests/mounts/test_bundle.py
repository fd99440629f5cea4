"""The validator, rule by rule (runc 1.1's configs/validate and specconv, and ours): each
bad spec is one BundleError naming config.json and the field; each good one passes. Pure:
no fixtures, no root."""

from __future__ import annotations

import copy
import json
import os

import pytest

from mounts.bundle import MAX_CONFIG, load_bundle, parse_process, parse_spec, read_config
from mounts.errors import BundleError

BASE = {
    "ociVersion": "1.0.2",
    "process": {"args": ["true"], "cwd": "/", "user": {"uid": 0, "gid": 0}},
    "root": {"path": "rootfs"},
    "hostname": "box",
    "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]},
}


def spec_with(**changes) -> dict:
    spec = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        node = spec
        *parents, last = dotted.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        if value is _DELETE:
            node.pop(last, None)
        else:
            node[last] = value
    return spec


_DELETE = object()
NS = [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]

# (rule, the spec's changes, what the one line must name)
BAD = [
    ("args[0] empty", {"process__args": ["", "x"]}, "process.args[0]: must not be empty"),
    ("M4 cwd empty", {"process__cwd": ""}, "process.cwd: must not be empty"),
    ("M4 cwd missing", {"process__cwd": _DELETE}, "process.cwd: must not be empty"),
    ("M5 cwd relative", {"process__cwd": "tmp"}, "process.cwd: 'tmp' is not an absolute path"),
    ("M6 args empty", {"process__args": []}, "process.args"),
    ("M11 rlimit type", {"process__rlimits": [{"type": "RLIMIT_NOPE", "hard": 1, "soft": 1}]},
     "process.rlimits[0].type"),
    ("S5 device type", {"linux__devices": [{"path": "/dev/x", "type": "z", "major": 1, "minor": 1}]},
     "linux.devices[0].type"),
    ("S10 rule access missing", {"linux__resources": {"devices": [{"allow": False}]}},
     "linux.resources.devices[0].access"),
    ("S10 rule access empty", {"linux__resources": {"devices": [{"allow": False, "access": ""}]}},
     "linux.resources.devices[0].access"),
    ("S11 rule type", {"linux__resources": {"devices": [{"allow": False, "type": "x", "access": "rwm"}]}},
     "linux.resources.devices[0].type"),
    ("S14 propagation", {"linux__rootfsPropagation": "sideways"}, "linux.rootfsPropagation"),
    ("S16 namespace type", {"linux__namespaces": NS + [{"type": "time"}]}, "linux.namespaces[5].type"),
    ("S17 namespace twice", {"linux__namespaces": NS + [{"type": "pid", "path": "/proc/1/ns/pid"}]},
     "linux.namespaces[5]: the pid namespace is named twice"),
    ("S18 new userns without maps", {"linux__namespaces": NS + [{"type": "user"}]}, "linux.uidMappings"),
    ("S19 root unmapped", {"linux__namespaces": NS + [{"type": "user"}],
                           "linux__uidMappings": [{"containerID": 1, "hostID": 1000, "size": 10}],
                           "linux__gidMappings": [{"containerID": 0, "hostID": 1000, "size": 10}]},
     "linux.uidMappings: the container's root (0) is not mapped"),
    ("S23 seccomp arch", {"linux__seccomp": {"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_VAX"]}},
     "linux.seccomp.architectures"),
    ("S24 seccomp default", {"linux__seccomp": {"defaultAction": "SCMP_ACT_MAYBE"}}, "linux.seccomp.defaultAction"),
    ("S25 seccomp action", {"linux__seccomp": {"defaultAction": "SCMP_ACT_ALLOW",
                                               "syscalls": [{"names": ["read"], "action": "NOPE"}]}},
     "linux.seccomp.syscalls[0].action"),
    ("S26 seccomp op", {"linux__seccomp": {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
        {"names": ["read"], "action": "SCMP_ACT_ERRNO", "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_ABOUT"}]}]}},
     "linux.seccomp.syscalls[0].args[0].op"),
    ("P2 notify default", {"linux__seccomp": {"defaultAction": "SCMP_ACT_NOTIFY", "listenerPath": "/x"}},
     "SCMP_ACT_NOTIFY cannot be the default action"),
    ("P5 notify listener", {"linux__seccomp": {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
        {"names": ["read"], "action": "SCMP_ACT_NOTIFY"}]}}, "needs linux.seccomp.listenerPath"),
    ("V6 hostname without uts", {"linux__namespaces": [{"type": "mount"}]}, "hostname: cannot be set without a UTS"),
    ("V9b maps without userns", {"linux__uidMappings": [{"containerID": 0, "hostID": 1000, "size": 1}]},
     "linux.uidMappings: mappings without a user namespace"),
    ("V10a ipc sysctl, host ipc", {"linux__namespaces": [{"type": "mount"}], "hostname": _DELETE,
                                   "linux__sysctl": {"kernel.shmmax": "1"}}, "linux.sysctl: 'kernel.shmmax'"),
    ("V10b net sysctl, host net", {"linux__namespaces": [{"type": "mount"}, {"type": "network",
                                                                             "path": "/proc/self/ns/net"}],
                                   "hostname": _DELETE, "linux__sysctl": {"net.ipv4.ip_forward": "1"}},
     "linux.sysctl: 'net.ipv4.ip_forward'"),
    ("V10c kernel.hostname", {"linux__sysctl": {"kernel.hostname": "x"}}, "conflicts with the hostname field"),
    ("V10d other sysctl", {"linux__sysctl": {"vm.swappiness": "1"}}, "linux.sysctl: 'vm.swappiness'"),
    ("sysctl outside /proc/sys", {"linux__sysctl": {"net/../../1/root": "1"}}, "linux.sysctl"),
    ("V11 intelRdt", {"linux__intelRdt": {"closID": "x"}}, "linux.intelRdt"),
    ("version", {"ociVersion": "2.0.0"}, "ociVersion"),
    ("uid range", {"process__user__uid": 1 << 32}, "process.user.uid: 4294967296 is out of range"),
    ("oomScoreAdj", {"process__oomScoreAdj": 1001}, "process.oomScoreAdj"),
    ("ioPriority", {"process__ioPriority": {"class": "IOPRIO_CLASS_RT", "priority": 8}}, "process.ioPriority.priority"),
    ("capability", {"process__capabilities": {"bounding": ["CAP_FLY"]}}, "process.capabilities.bounding"),
    ("fileMode", {"linux__devices": [{"path": "/dev/x", "type": "c", "major": 1, "minor": 3, "fileMode": 1 << 20}]},
     "linux.devices[0].fileMode"),
    ("personality", {"linux__personality": {"domain": "SUNOS"}}, "linux.personality.domain"),
    # (issue #29's bad inputs: each said with no field, or accepted)
    ("hostname over HOST_NAME_MAX", {"hostname": "h" * 65}, "hostname: 65 bytes is over the kernel's limit of 64"),
    ("additionalGids over NGROUPS_MAX", {"process__user__additionalGids": list(range(1, 70001))},
     "process.user.additionalGids: 70000 groups is over the kernel's limit of 65536"),
    ("rlimit soft above hard", {"process__rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 2**63}]},
     "process.rlimits[0]: RLIMIT_NOFILE soft 9223372036854775808 is above hard 1024"),
    ("memory.limit under the runtime's own", {"linux__resources": {"memory": {"limit": 4096}}},
     "linux.resources.memory.limit: 4096 is below the 6291456 bytes"),
    ("hook path relative", {"hooks": {"prestart": [{"path": "bin/true"}]}},
     "hooks.prestart[0].path: 'bin/true' is not an absolute path"),
    ("createRuntime hook path relative", {"hooks": {"createRuntime": [{"path": "/bin/true"}, {"path": "true"}]}},
     "hooks.createRuntime[1].path: 'true' is not an absolute path"),
    ("hook env without =", {"hooks": {"poststop": [{"path": "/bin/true", "env": ["A=1", "B"]}]}},
     "hooks.poststop[0].env[1]: 'B' is not NAME=VALUE"),
    ("env without =", {"process__env": ["PATH=/bin", "FOO"]}, "process.env[1]: 'FOO' is not NAME=VALUE"),
    ("env empty name", {"process__env": ["=x"]}, "process.env[0]: '=x' is not NAME=VALUE"),
    ("device path not a name", {"linux__devices": [{"path": "/dev/..", "type": "c", "major": 1, "minor": 3}]},
     "linux.devices[0].path: '/dev/..' does not end in a file name"),
    ("device path a directory's", {"linux__devices": [{"path": "/dev/x/", "type": "c", "major": 1, "minor": 3}]},
     "linux.devices[0].path: '/dev/x/' does not end in a file name"),
]


@pytest.mark.parametrize("rule,changes,named", BAD, ids=[b[0] for b in BAD])
def test_each_rule_refuses_in_one_line(rule, changes, named):
    with pytest.raises(BundleError) as e:
        parse_spec(json.dumps(spec_with(**changes)).encode(), "/b/config.json")
    message = str(e.value)
    assert message.startswith("/b/config.json: ") and named in message and "\n" not in message, message
    assert e.value.exit_code == 2


# what the parser itself refuses (ranges, NUL characters, nesting): (changes, words the line names)
PARSE = [
    ({"process__user__uid": 2**64}, ["process.user.uid", "out of range"]),
    ({"process__user__gid": -1}, ["process.user.gid"]),
    ({"process__args": []}, ["$.process.args"]),
    ({"process__rlimits": [{"type": "RLIMIT_NOFILE", "soft": 2**64, "hard": 2**64}]}, ["process.rlimits[0].soft"]),
    ({"process__rlimits": [{"type": "RLIMIT_BOGUS", "soft": 1, "hard": 1}]}, ["RLIMIT_BOGUS"]),
    ({"process__env": ["A=b\0c"]}, ["$.process.env[0]", "NUL"]),
    ({"process__cwd": "/tmp\0x"}, ["$.process.cwd", "NUL"]),
    ({"hostname": "a\0b"}, ["$.hostname", "NUL"]),
    ({"mounts": [{"destination": "/mnt", "type": "bind", "source": "/tmp\0", "options": ["bind"]}]},
     ["$.mounts[0].source", "NUL"]),
    ({"linux__devices": [{"path": "/dev/x", "type": "c", "major": 2**40, "minor": 1}]}, ["linux.devices[0].major"]),
]


@pytest.mark.parametrize("changes,words", PARSE)
def test_the_parser_refuses_in_one_line(changes, words):
    with pytest.raises(BundleError) as e:
        parse_spec(json.dumps(spec_with(**changes)).encode(), "/b/config.json")
    message = str(e.value)
    assert message.startswith("/b/config.json") and "\n" not in message and e.value.exit_code == 2, message
    assert all(w in message for w in words), message


def test_nesting_too_deep_is_one_line():
    deep = 100_000
    text = json.dumps(BASE).replace('"hostname"', '"x": ' + "[" * deep + "]" * deep + ', "hostname"', 1)
    with pytest.raises(BundleError, match=r"^/b/config.json: .*nested too deeply[^\n]*$"):
        parse_spec(text.encode(), "/b/config.json")


GOOD = [
    ("the base", {}),
    ("S6 fileMode with the type's bits, dropped as runc drops them",
     {"linux__devices": [{"path": "/dev/x", "type": "c", "major": 1, "minor": 3, "fileMode": 0o20666}]}),
    ("S21 empty seccomp: no filter", {"linux__seccomp": {}}),
    ("V10 slash-separated sysctl", {"linux__sysctl": {"net/ipv4/ip_forward": "1"}}),
    ("V10a ipc sysctl in a joined ipc namespace",
     {"linux__namespaces": NS[:2] + [{"type": "ipc", "path": "/proc/1/ns/ipc"}] + NS[3:],
      "linux__sysctl": {"kernel.shmmax": "1"}}),
    ("V10c kernel.domainname", {"linux__sysctl": {"kernel.domainname": "x"}}),
    ("a joined user namespace without maps", {"linux__namespaces": NS + [{"type": "user", "path": "/x"}]}),
    ("a hostname of HOST_NAME_MAX bytes", {"hostname": "h" * 64}),
    ("a device path with .. resolved inside the root, as runc's securejoin does",
     {"linux__devices": [{"path": "/etc/../../x", "type": "c", "major": 1, "minor": 3}]}),
    ("V10 a dotted interface's sysctl (sysctl(8): '/' for its dot)",
     {"linux__sysctl": {"net.ipv4.conf.eth0/100.forwarding": "1", "net/ipv4/conf/eth0.100/rp_filter": "1"}}),
    ("memory.limit at the floor, and unlimited", {"linux__resources": {"memory": {"limit": 6 << 20, "swap": -1}}}),
    ("memory.limit -1: unlimited", {"linux__resources": {"memory": {"limit": -1}}}),
    ("env with an empty value, and = in it", {"process__env": ["A=", "B=c=d"]}),
]


@pytest.mark.parametrize("rule,changes", GOOD, ids=[g[0] for g in GOOD])
def test_what_runc_runs_passes(rule, changes):
    spec = parse_spec(json.dumps(spec_with(**changes)).encode())
    if "seccomp" in rule:
        assert spec.linux.seccomp is None


def test_an_exec_process_file_is_checked_as_configs_process(tmp_path):
    base = parse_spec(json.dumps(BASE).encode())
    with pytest.raises(BundleError, match="--process p: process.cwd: 'x' is not an absolute path"):
        parse_process(json.dumps({"args": ["sh"], "cwd": "x"}).encode(), base, "--process p")
    assert parse_process(json.dumps({"args": ["sh"], "cwd": "/"}).encode(), base, "p").args == ["sh"]
    with pytest.raises(BundleError, match=r"^--process p: process.env\[0\]: 'X' is not NAME=VALUE$"):
        parse_process(json.dumps({"args": ["sh"], "cwd": "/", "env": ["X"]}).encode(), base, "--process p")


def test_config_files_are_regular_and_bounded(tmp_path):
    with pytest.raises(BundleError, match="/dev/zero: not a regular file"):
        read_config("/dev/zero", "")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(BundleError, match="not a regular file"):  # and no hang
        read_config(str(fifo), "")
    big = tmp_path / "config.json"
    with open(big, "wb") as f:
        f.truncate(MAX_CONFIG + 1)
    with pytest.raises(BundleError, match=f"{big}: {MAX_CONFIG + 1} bytes is over the {MAX_CONFIG} byte limit"):
        read_config(str(big), "")
    with pytest.raises(BundleError, match="no such directory"):
        load_bundle(str(tmp_path / "missing"))
