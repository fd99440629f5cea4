"""``sandbox configure docker|podman|containerd [--config FILE] [--default]``: add our runtime
to an engine's own config file (or make it the default), as ``nvidia-ctk runtime configure``
does: everything else in the file is kept, the old file is kept as FILE.bak, a second run
changes nothing, and we say what to restart.

- docker: daemon.json ``runtimes.NAME.path`` (and ``default-runtime``);
- podman: containers.conf ``[engine.runtimes] NAME = [PATH]`` (and ``[engine] runtime``);
- containerd (version 2): the CRI plugin's runtime handler NAME, the runc shim with
  ``BinaryName`` = PATH (``SystemdCgroup`` as runc's handler has it), for a Kubernetes
  RuntimeClass (and ``default_runtime_name``). The driver root comes from our config file.
"""

from __future__ import annotations

import json
import os
import sys

from mounts.errors import SandboxError

CONFIGS = {"docker": "/etc/docker/daemon.json", "podman": "/etc/containers/containers.conf",
           "containerd": "/etc/containerd/config.toml"}
RESTART = {"docker": "restart dockerd (systemctl restart docker)",
           "podman": "podman reads it at its next command: nothing to restart",
           "containerd": "restart containerd (systemctl restart containerd), then name the handler in a RuntimeClass"}
CRI = "io.containerd.grpc.v1.cri"


def main(args) -> int:
    engine, path = args.engine, args.config_file or CONFIGS[args.engine]
    exe = os.path.abspath(args.path or launcher())
    try:
        with open(path) as f:
            old = f.read()
    except FileNotFoundError:
        old = None
    except OSError as e:
        raise SandboxError(f"{path}: {e.strerror}") from None
    new = {"docker": _docker, "podman": _podman, "containerd": _containerd}[engine](old or "", path, args.name, exe,
                                                                                 args.default)
    if new == old:
        print(f"{path}: {engine} already has the {args.name!r} runtime ({exe}): nothing changed")
        return 0
    if old is not None:
        with open(path + ".bak", "w") as f:
            f.write(old)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    from mounts.atomic import write_atomically

    write_atomically(path, new.encode(), f"sandbox configure {engine}")
    what = "the default runtime" if args.default else "a runtime"
    print(f"{path}: {engine} has {args.name!r} ({exe}) as {what}" + (f"; the old file is {path}.bak" if old else "")
          + f": {RESTART[engine]}")
    return 0


def launcher() -> str:
    """The `sandbox` executable of this installation: beside our interpreter (a checkout's
    .venv/bin) or in the prefix's bin (scripts/install)."""
    here = os.path.dirname(sys.executable)
    for candidate in (os.path.join(here, "sandbox"), os.path.join(here, "..", "..", "bin", "sandbox")):
        if os.access(candidate, os.X_OK):
            return os.path.normpath(candidate)
    raise SandboxError("configure: cannot find the sandbox executable of this installation: give --path")


def _docker(text: str, path: str, name: str, exe: str, default: bool) -> str:
    try:
        conf = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as e:
        raise SandboxError(f"{path}: invalid JSON: {e}") from None
    if not isinstance(conf, dict) or not isinstance(conf.get("runtimes", {}), dict):
        raise SandboxError(f"{path}: not a daemon.json (an object, runtimes an object)")
    runtime = dict(conf.get("runtimes", {}).get(name) or {})
    runtime["path"] = exe
    conf = {**conf, "runtimes": {**conf.get("runtimes", {}), name: runtime}}
    if default:
        conf["default-runtime"] = name
    new = json.dumps(conf, indent=2) + "\n"
    return text if text.strip() and json.loads(text) == conf else new


def _toml(text: str, path: str):
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    try:
        return tomlkit.parse(text)
    except TOMLKitError as e:
        raise SandboxError(f"{path}: invalid TOML: {e}") from None


def _table(parent, key: str):
    import tomlkit

    if key not in parent:
        parent[key] = tomlkit.table()
    return parent[key]


def _podman(text: str, path: str, name: str, exe: str, default: bool) -> str:
    doc = _toml(text, path)
    engine = _table(doc, "engine")
    runtimes = _table(engine, "runtimes")
    if list(runtimes.get(name, [])) != [exe]:
        runtimes[name] = [exe]
    if default and engine.get("runtime") != name:
        engine["runtime"] = name
    return doc.as_string()


def _containerd(text: str, path: str, name: str, exe: str, default: bool) -> str:
    doc = _toml(text, path)
    if text.strip() and doc.get("version") != 2:
        raise SandboxError(f"{path}: a containerd config of version {doc.get('version', 1)}: only version 2 is "
                           "supported (`containerd config migrate` makes one)")
    if "version" not in doc:
        doc["version"] = 2
    cri = _table(_table(doc, "plugins"), CRI)
    containerd = _table(cri, "containerd")
    runtimes = _table(containerd, "runtimes")
    runc_opts = runtimes.get("runc", {}).get("options", {})
    shim = "io.containerd.runc.v2"
    want = {"BinaryName": exe, "SystemdCgroup": bool(runc_opts.get("SystemdCgroup", False))}
    ours = runtimes.get(name)
    have = dict(ours.get("options", {})) if ours is not None else {}
    if ours is None or ours.get("runtime_type") != shim or any(have.get(k) != v for k, v in want.items()):
        handler = _table(runtimes, name)
        handler["runtime_type"] = shim
        options = _table(handler, "options")
        for key, value in want.items():
            options[key] = value
    if default and containerd.get("default_runtime_name") != name:
        containerd["default_runtime_name"] = name
    return doc.as_string()
