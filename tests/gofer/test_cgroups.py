"""linux.resources as cgroup files, v1 and v2 (runc's conversions), and what is refused."""

from __future__ import annotations

import json

import msgspec
import pytest

from gofer.cgroups import device_rules, v1_files, v2_files
from gofer.cgroups.common import merge_memory
from gofer.cgroups.v1 import memory_v1
from gofer.devfilter import Rule, allow_first, program
from gofer.systemd import resource_properties
from mounts.bundle import Invalid, check_resources
from mounts.errors import BundleError, SandboxError
from mounts.spec import Resources


def resources(**r):
    """linux.resources checked as `sandbox update` checks them (check_resources: the small
    limits of these tables are under the floor a create's config.json must clear)."""
    res = msgspec.json.decode(json.dumps(r).encode(), type=Resources)
    try:
        check_resources(res)
    except Invalid as e:
        raise BundleError(f"config.json: {e}") from None
    return res


def v2(**r) -> dict[str, object]:
    return {name: value for name, value, _ in v2_files(resources(**r), lambda f: f == "memory.swap.max")}


MiB = 1 << 20


@pytest.mark.parametrize("r,files", [
    ({"memory": {"limit": 67108864}}, {"memory.max": 67108864}),
    ({"memory": {"limit": 100, "swap": 300, "reservation": 50}}, {"memory.max": 100, "memory.swap.max": 200,
                                                                  "memory.low": 50}),
    ({"memory": {"limit": 100, "swap": -1}}, {"memory.max": 100, "memory.swap.max": "max"}),
    ({"memory": {"limit": 100, "swap": 100}}, {"memory.max": 100, "memory.swap.max": 0}),
    ({"memory": {"limit": -1}}, {"memory.max": "max", "memory.swap.max": "max"}),
    ({"memory": {"limit": -1, "swap": 300}}, {"memory.max": "max", "memory.swap.max": 300}),
    ({"cpu": {"shares": 1024}}, {"cpu.weight": 39}),
    ({"cpu": {"shares": 2}}, {"cpu.weight": 1}),
    ({"cpu": {"shares": 262144}}, {"cpu.weight": 10000}),
    ({"cpu": {"quota": 50000, "period": 100000}}, {"cpu.max": "50000 100000"}),
    ({"cpu": {"quota": -1}}, {"cpu.max": "max 100000"}),
    ({"cpu": {"cpus": "0-1", "mems": "0"}}, {"cpuset.cpus": "0-1", "cpuset.mems": "0"}),
    ({"pids": {"limit": 64}}, {"pids.max": 64}),
    ({"pids": {"limit": -1}}, {"pids.max": "max"}),
    ({"blockIO": {"weight": 500}}, {"io.weight": 4950}),
    ({"blockIO": {"throttleReadBpsDevice": [{"major": 8, "minor": 0, "rate": 1048576}]}},
     {"io.max": "8:0 rbps=1048576"}),
    ({"hugepageLimits": [{"pageSize": "2MB", "limit": 4194304}]}, {"hugetlb.2MB.max": 4194304}),
    ({"rdma": {"mlx5_1": {"hcaHandles": 3, "hcaObjects": 10000}}}, {"rdma.max": "mlx5_1 hca_handle=3 hca_object=10000"}),
    ({"unified": {"memory.high": "1G", "io.max": "8:0 wiops=10"}}, {"memory.high": "1G", "io.max": "8:0 wiops=10"}),
])
def test_v2_files(r, files):
    assert v2(**r) == files


@pytest.mark.parametrize("r,message", [
    ({"memory": {"swap": 100}}, "needs a memory limit"),
    ({"memory": {"limit": 200, "swap": 100}}, "below the memory limit"),
    ({"memory": {"swappiness": 10}}, "swappiness"),
    ({"memory": {"disableOOMKiller": True}}, "disableOOMKiller"),
    ({"cpu": {"realtimeRuntime": 100}}, "realtime"),
    ({"network": {"classID": 1}}, "net_cls"),
    ({"unified": {"cgroup.procs": "1"}}, "cgroup.procs"),
])
def test_v2_refuses_in_one_line(r, message):
    with pytest.raises(SandboxError, match=message):
        v2(**r)


def test_zero_is_unset():
    """Engines send zeros for what nobody asked (Docker's blockIO weight 0): runc's rule."""
    zeros = {"memory": {"limit": 0, "reservation": 0, "swap": 0, "swappiness": -1}, "pids": {"limit": 0},
             "cpu": {"shares": 0, "quota": 0, "period": 0}, "blockIO": {"weight": 0, "leafWeight": 0}}
    assert v1_files(resources(**zeros)) == [] and v2(**zeros) == {}


def test_v1_files():
    files = [(c, f, v) for c, f, v, _ in v1_files(resources(
        memory={"limit": 100, "swap": 200, "disableOOMKiller": True}, cpu={"shares": 512, "cpus": "0"},
        pids={"limit": -1}, blockIO={"weight": 100, "throttleWriteIOPSDevice": [{"major": 8, "minor": 0, "rate": 9}]},
        hugepageLimits=[{"pageSize": "1GB", "limit": 0}]))]
    assert files == [("memory", "memory.limit_in_bytes", 100), ("memory", "memory.memsw.limit_in_bytes", 200),
                     ("memory", "memory.oom_control", 1), ("cpu", "cpu.shares", 512), ("cpuset", "cpuset.cpus", "0"),
                     ("pids", "pids.max", "max"), ("blkio", "blkio.weight", 100),
                     ("blkio", "blkio.throttle.write_iops_device", "8:0 9"),
                     ("hugetlb", "hugetlb.1GB.limit_in_bytes", 0)]
    with pytest.raises(SandboxError, match="unified: needs cgroup v2"):
        v1_files(resources(unified={"memory.high": "1"}))


@pytest.mark.parametrize("r,field", [
    ({"hugepageLimits": [{"pageSize": "../../cgroup.procs", "limit": 1}]}, "hugepageLimits[0].pageSize"),
    ({"rdma": {"a b": {"hcaHandles": 1}}}, "linux.resources.rdma"),
    ({"network": {"priorities": [{"name": "eth0\n1", "priority": 1}]}}, "network.priorities"),
    ({"unified": {"../memory.max": "1"}}, "unified"),
    ({"unified": {"memory.max": "1\n2"}}, "unified"),
])
def test_names_that_would_reach_another_file_are_refused(r, field):
    with pytest.raises(BundleError, match=field.replace("[", r"\[").replace("]", r"\]")):
        resources(**r)


def test_an_all_rule_is_every_device_whatever_numbers_follow():
    """`a 1:11 rwm` denied resets everything, as v1 and runc read it (numbers ignored)."""
    rules = device_rules(resources(devices=[{"allow": True, "type": "c", "major": 1, "access": "rwm"},
                                            {"allow": False, "type": "a", "major": 1, "minor": 11, "access": "rwm"}]), [])
    assert rules[2] == Rule(False)


def test_device_rules_order():
    rules = device_rules(resources(devices=[{"allow": True, "type": "c", "major": 10, "minor": -1, "access": "r"}]),
                         [])
    assert rules[0] == Rule(False) and rules[1] == Rule(True, "c", 10, None, "r")
    assert Rule(True, "c", 136, None).line() == "c 136:* rwm"


def test_program_shapes():
    """An unconditional rule ends the program (the verifier refuses unreachable code), and
    allow_first keeps the other program whole at its end."""
    assert len(program([Rule(False), Rule(True)])) == (6 + 2) * 8
    tail = program([Rule(False)])
    joined = allow_first([Rule(True, "c", 195, 0)], tail)
    assert joined.endswith(tail) and len(joined) == len(tail) + 6 * 8 + (3 + 2) * 8  # prologue, type major minor, verdict


@pytest.mark.parametrize("memory,now,files", [
    # a new cgroup (memory and memory+swap unlimited): memory first
    ({"limit": 64 * MiB, "swap": 64 * MiB}, (-1, -1), [("limit", 64 * MiB), ("memsw", 64 * MiB)]),
    # raised above the memory limit as it stands: memory+swap first
    ({"limit": 128 * MiB, "swap": 128 * MiB}, (64 * MiB, 64 * MiB), [("memsw", 128 * MiB), ("limit", 128 * MiB)]),
    ({"limit": 128 * MiB, "swap": -1}, (64 * MiB, 64 * MiB), [("memsw", -1), ("limit", 128 * MiB)]),
    # lowered: memory first, memory+swap last
    ({"limit": 32 * MiB, "swap": 48 * MiB}, (128 * MiB, 128 * MiB), [("limit", 32 * MiB), ("memsw", 48 * MiB)]),
    ({"limit": 32 * MiB, "swap": 64 * MiB}, (64 * MiB, 128 * MiB), [("limit", 32 * MiB), ("memsw", 64 * MiB)]),
    # no swap limit: memory alone; -1 alone lifts memory+swap too, where the kernel has it
    ({"limit": 32 * MiB}, (64 * MiB, -1), [("limit", 32 * MiB)]),
    ({"limit": -1}, (64 * MiB, 64 * MiB), [("memsw", -1), ("limit", -1)]),
    ({"limit": -1}, (64 * MiB, 0), [("limit", -1)]),
    ({"limit": 96 * MiB, "swap": 0, "reservation": 0}, (64 * MiB, 0), [("limit", 96 * MiB)]),
])
def test_v1_memory_and_swap_in_the_order_the_kernel_takes_them(memory, now, files):
    """runc's setMemoryAndSwap: v1 keeps memory <= memory+swap at every write."""
    names = {"memory.limit_in_bytes": "limit", "memory.memsw.limit_in_bytes": "memsw"}
    got = [(names[f], v) for _, f, v, _ in memory_v1(resources(memory=memory).memory, *now)]
    assert got == files
    assert [(names.get(f, f), v) for _, f, v, _ in v1_files(resources(memory=memory), now)] == files


def test_v1_swap_without_swap_accounting_is_one_line():
    with pytest.raises(SandboxError, match="accounts no swap"):
        memory_v1(resources(memory={"limit": 64 * MiB, "swap": 128 * MiB}).memory, 32 * MiB, 0)


@pytest.mark.parametrize("update,now,merged", [
    # both given: as they are
    ({"limit": 128 * MiB, "swap": 128 * MiB}, (64 * MiB, 64 * MiB), (128 * MiB, 128 * MiB)),
    # memory alone keeps memory+swap (runc keeps the container's config): v1's file stays,
    # v2's swap becomes what is left of it
    ({"limit": 40 * MiB}, (32 * MiB, 48 * MiB), (40 * MiB, 48 * MiB)),
    ({"limit": 40 * MiB}, (32 * MiB, -1), (40 * MiB, -1)),
    ({"limit": 40 * MiB}, (32 * MiB, 0), (40 * MiB, None)),
    # memory+swap alone keeps memory
    ({"swap": 256 * MiB}, (40 * MiB, 48 * MiB), (40 * MiB, 256 * MiB)),
    # -1 alone lifts both
    ({"limit": -1}, (40 * MiB, 48 * MiB), (-1, -1)),
    ({"reservation": 1}, (40 * MiB, 48 * MiB), (None, None)),
])
def test_an_update_merges_the_memory_limits_as_runc(update, now, merged):
    m = merge_memory(resources(memory=update).memory, *now)
    assert (m.limit, m.swap) == merged


@pytest.mark.parametrize("update,now,message", [
    ({"limit": 64 * MiB}, (40 * MiB, 48 * MiB), "above the container's memory\\+swap limit 50331648"),
    ({"limit": 96 * MiB, "swap": 80 * MiB}, (64 * MiB, 128 * MiB), "80 is below the memory limit"),
    ({"swap": 32 * MiB}, (64 * MiB, 128 * MiB), "is below the memory limit 67108864"),
])
def test_an_update_below_memory_plus_swap_is_refused_before_any_write(update, now, message):
    with pytest.raises(SandboxError, match=message):
        merge_memory(resources(memory=update).memory, *now)


def test_v2_writes_the_swap_first_and_lifts_none_it_has_not():
    """runc's order on v2; a host without swap accounting (no memory.swap.max) is asked to
    lift or disable none (runc ignores those), but a swap limit it cannot set is an error."""
    files = [f for f, _, _ in v2_files(resources(memory={"limit": 64 * MiB, "swap": 128 * MiB, "reservation": 1}),
                                       lambda f: True)]
    assert files == ["memory.swap.max", "memory.max", "memory.low"]
    for memory in ({"limit": -1}, {"limit": 64 * MiB, "swap": 64 * MiB}, {"limit": 64 * MiB, "swap": -1}):
        assert [f for f, _, _ in v2_files(resources(memory=memory), lambda f: False)] == ["memory.max"]
    assert [f for f, _, _ in v2_files(resources(memory={"limit": 1, "swap": 2}), lambda f: False)] == [
        "memory.swap.max", "memory.max"]


@pytest.mark.parametrize("memory,v2,props", [
    ({"limit": 64 * MiB, "swap": 128 * MiB}, True, {"MemoryMax": 64 * MiB, "MemorySwapMax": 64 * MiB}),
    ({"limit": 64 * MiB, "swap": 64 * MiB}, True, {"MemoryMax": 64 * MiB, "MemorySwapMax": 0}),
    ({"limit": -1}, True, {"MemoryMax": 2**64 - 1, "MemorySwapMax": 2**64 - 1}),
    ({"limit": 64 * MiB}, True, {"MemoryMax": 64 * MiB}),
    ({"limit": 64 * MiB, "swap": 128 * MiB}, False, {"MemoryLimit": 64 * MiB}),  # v1: memsw is a file only
])
def test_systemd_memory_properties(memory, v2, props):
    assert {k: v for k, (_, v) in resource_properties(resources(memory=memory), v2)} == props
