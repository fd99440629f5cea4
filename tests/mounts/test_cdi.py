"""CDI specs: parsing (JSON and YAML, unknown fields and versions refused), the directories'
rules (priority, conflicts, one bad file costs only its own devices), requests, merging,
the version a spec needs, and our YAML writer read back by PyYAML."""

from __future__ import annotations

import json
import os

import msgspec
import pytest
import yaml

from mounts import cdi
from mounts.errors import BundleError

SPEC = {"cdiVersion": "0.5.0", "kind": "example.com/device",
        "devices": [{"name": "foo", "containerEdits": {"env": ["A=1"], "deviceNodes": [{"path": "/dev/foo"}]}},
                    {"name": "bar", "containerEdits": {"env": ["B=2"]}}],
        "containerEdits": {"mounts": [{"hostPath": "/h", "containerPath": "/c", "options": ["ro"]}]}}


def write(d, name, obj):
    d.mkdir(exist_ok=True)
    (d / name).write_text(json.dumps(obj) if name.endswith(".json") else yaml.safe_dump(obj))


@pytest.mark.parametrize("change,field", [
    ({"cdiVersion": "9.9.9"}, "cdiVersion '9.9.9'"),
    ({"kind": "nodomain"}, "kind 'nodomain'"),
    ({"devices": [{"name": "bad name", "containerEdits": {}}]}, "devices[0].name"),
    ({"devices": [{"name": "x", "containerEdits": {"colour": "blue"}}]}, "unknown field `colour`"),
    ({"containerEdits": {"hooks": [{"hookName": "whenever", "path": "/x"}]}}, "hooks[0].hookName"),
    ({"containerEdits": {"deviceNodes": [{"path": "dev/rel"}]}}, "deviceNodes[0].path"),
    ({"containerEdits": {"env": ["NOEQUALS"]}}, "env[0]"),
])
def test_bad_specs_name_the_file_and_field(change, field):
    with pytest.raises(BundleError, match=f"^/x/spec.json: .*{field.replace('[', '.').replace(']', '.')}"):
        cdi.parse(json.dumps({**SPEC, **change}).encode(), "/x/spec.json")


def test_yaml_and_json_read_the_same():
    assert cdi.parse(yaml.safe_dump(SPEC).encode(), "s.yaml") == cdi.parse(json.dumps(SPEC).encode(), "s.json")


def test_directories_priority_conflicts_and_bad_files(tmp_path):
    first, second = tmp_path / "etc", tmp_path / "run"
    write(first, "a.json", SPEC)
    write(second, "a.yaml", {**SPEC, "devices": [{"name": "foo", "containerEdits": {"env": ["A=later"]}}]})
    write(second, "b.json", {**SPEC, "kind": "other.com/x", "devices": [{"name": "1", "containerEdits": {}}]})
    write(second, "c.json", {**SPEC, "kind": "other.com/x", "devices": [{"name": "1", "containerEdits": {}}]})
    (second / "broken.json").write_text("{nope")
    os.mkfifo(second / "fifo.json")  # must not hang the load
    reg = cdi.load([str(first), str(second)])
    assert reg.qualified_names() == ["example.com/device=bar", "example.com/device=foo"]
    assert reg.devices["example.com/device=foo"].device.container_edits.env == ["A=later"]  # the later dir
    assert "other.com/x=1" in reg.errors and "defined by both" in reg.errors["other.com/x=1"]
    assert str(second / "broken.json") in reg.errors and "not a regular file" in reg.errors[str(second / "fifo.json")]
    with pytest.raises(BundleError, match="other.com/x=1.*not found.*defined by both"):
        cdi.resolve(["other.com/x=1"], reg)


def test_specs_others_may_write_are_not_read(tmp_path):
    d = tmp_path / "cdi"
    write(d, "a.json", SPEC)
    os.chmod(d / "a.json", 0o666)
    reg = cdi.load([str(d)])
    assert not reg.devices and "writable by others" in reg.errors[str(d / "a.json")]
    os.chmod(d / "a.json", 0o644)
    os.chmod(d, 0o777)
    reg = cdi.load([str(d)])
    assert not reg.devices and "writable by others" in reg.errors[str(d)]
    os.chmod(d, 0o755)
    assert "example.com/device=foo" in cdi.load([str(d)]).devices


def test_requests_and_merged_edits(tmp_path):
    write(tmp_path, "a.json", SPEC)
    names, rest = cdi.requests_of({"cdi.k8s.io/one": "example.com/device=foo", "cdi.k8s.io/two":
                                   "example.com/device=bar,example.com/device=foo", "other": "x"},
                                  "0,nvidia.com/gpu=1")
    assert names == ["example.com/device=foo", "example.com/device=bar", "nvidia.com/gpu=1"] and rest == "0"
    names = names[:2]
    with pytest.raises(BundleError, match="only nvidia.com devices"):
        cdi.requests_of({}, "example.com/device=foo")
    edits = cdi.merged(cdi.resolve(names, cdi.load([str(tmp_path)])))
    assert edits.env == ["A=1", "B=2"] and [m.container_path for m in edits.mounts] == ["/c"]  # spec's once
    with pytest.raises(BundleError, match="not a qualified device name"):
        cdi.resolve(["justaname"], cdi.load([str(tmp_path)]))


def test_the_lowest_version_the_fields_need():
    spec = cdi.parse(json.dumps(SPEC).encode(), "s.json")
    assert cdi.minimum_version(spec) == "0.3.0"
    node = cdi.DeviceNode("/dev/x", host_path="/dev/y")
    spec = msgspec.structs.replace(spec, container_edits=cdi.ContainerEdits(device_nodes=[node]))
    assert cdi.minimum_version(spec) == "0.5.0"
    spec = msgspec.structs.replace(spec, container_edits=cdi.ContainerEdits(additional_gids=[5]))
    assert cdi.minimum_version(spec) == "0.7.0"
    spec = msgspec.structs.replace(spec, annotations={"a": "b"})  # 0.6.0's field does not lower it
    assert cdi.minimum_version(spec) == "0.7.0"


@pytest.mark.parametrize("visible,annotation,expect", [
    ("all", "nvidia.com/gpu=0", "0"),  # a CUDA image's "all" does not widen the request
    ("void", "nvidia.com/gpu=1", "1"),
    ("0,nvidia.com/gpu=1", None, "1"),
    ("all", None, "all"),  # nothing asked for by name: the legacy value stands
])
def test_named_gpus_replace_the_legacy_value(visible, annotation, expect):
    from mounts.bundle import parse_spec

    config = {"ociVersion": "1.0.2", "root": {"path": "rootfs"},
              "process": {"args": ["true"], "cwd": "/", "env": [f"NVIDIA_VISIBLE_DEVICES={visible}"]},
              "annotations": {"cdi.k8s.io/x": annotation} if annotation else {}}
    spec = parse_spec(json.dumps(config).encode())
    names, _ = cdi.requests_of(spec.annotations, visible)
    out, _ = cdi.apply(spec, names, [])
    assert out.process.getenv("NVIDIA_VISIBLE_DEVICES") == expect


def test_our_cdi_hook_is_done_natively_and_no_other():
    """The hook `sandbox cdi generate` writes (behind the C client or not) is recognised and
    turned into actions; a foreign hook that happens to say "cdi hook" is run as it is."""
    from mounts import actions as A
    from mounts.cdi import spec_hook_actions
    from mounts.spec import Hook, Hooks, cdi_hook_args

    code = "import sys; sys.path[:0] = ['/opt/x']; from sandbox.cli import run; run(sys.argv[1:])"
    links = ["--link", "libcuda.so.1::/usr/lib/libcuda.so", "--cache-entry", "libcuda.so.1::/usr/lib/libcuda.so.1::0x303"]
    ours = Hook("/opt/x/bin/sandbox", ["sandbox", "cdi", "hook", *links])
    older = Hook("/opt/x/bin/sandbox-hook", ["sandbox-hook", "/usr/bin/python3", "-I", "-S", "-c", code, "cdi", "hook",
                                             *links])  # (an older installation's spec)
    foreign = Hook("/usr/bin/tool", ["tool", "cdi", "hook", "--link", "a::/b"])
    odd = Hook("/usr/bin/python3", ["python3", "-c", code, "cdi", "hook", "--link"])
    late = Hook("/opt/x/bin/sandbox", ["sandbox", "--debug", "cdi", "hook", *links])
    assert cdi_hook_args(ours) == cdi_hook_args(older) == links
    assert cdi_hook_args(foreign) is None and cdi_hook_args(odd) is None and cdi_hook_args(late) is None
    hooks = Hooks(create_runtime=[ours, foreign])
    assert hooks.ours().create_runtime == [foreign]
    actions = spec_hook_actions(hooks.cdi_args())
    assert actions[0] == A.Symlink("libcuda.so.1", "/usr/lib/libcuda.so")
    assert isinstance(actions[1], A.LdCache) and actions[1].entries[0].flags == 0x303


def test_our_hook_entries_as_the_launcher_reads_them():
    """Our `sandbox VERB` in a hook entry: the launcher with the verb first, or an older
    installation's Python with the verb right after its -c program (launcher.c's older_entry);
    a verb further on, or another verb, is not ours."""
    from mounts.spec import ENTRY_MARK, our_verb

    code = f"import sys; {ENTRY_MARK} run; run(sys.argv[1:])"
    old = ["sandbox-hook", "/py", "-I", "-S", "-c", code]
    assert our_verb("/usr/bin/sandbox", ["sandbox", "hook", "--driver-root", "/"], ("hook",)) == 2
    assert our_verb("/venv/bin/sandbox-hook", [*old, "hook", "--trace", "t"], ("hook",)) == 7
    assert our_verb("/venv/bin/sandbox-hook", [*old, "cdi", "hook", "--link", "a::b"], ("hook",)) is None
    assert our_verb("/venv/bin/sandbox-hook", [*old, "cdi", "hook", "--link", "a::b"], ("cdi", "hook")) == 8
    assert our_verb("/usr/bin/sandbox", ["sandbox", "cdi", "hook"], ("hook",)) is None
    assert our_verb("/bin/other", ["other", "hook"], ("hook",)) is None
    assert our_verb("/venv/bin/sandbox-hook", ["x", "/py", "-c", "print(1)", "hook"], ("hook",)) is None
