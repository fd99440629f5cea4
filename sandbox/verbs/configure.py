"""``sandbox configure docker|podman|containerd [--config FILE] [--default]``: add our runtime
to an engine's own config file (or make it the default), as ``nvidia-ctk runtime configure``
does: everything else in the file is kept, the old file is kept as FILE.bak, a second run
changes nothing, and we say what to restart.

- docker: daemon.json ``runtimes.NAME.path`` (and ``default-runtime``);
- podman: containers.conf ``[engine.runtimes] NAME = [PATH]`` (and ``[engine] runtime``);
- containerd (version 2): the CRI plugin's runtime handler NAME, the runc shim with
  ``BinaryName`` = PATH (``SystemdCgroup`` as runc's handler has it), for a Kubernetes
  RuntimeClass (and ``default_runtime_name``). The driver root comes from our config file.

``--remove`` is the inverse: it takes out every runtime whose executable is this
installation's (``--name``: that one only), a default that named one of them (containerd's
back to ``runc``), and the tables that held nothing else; the rest of the file is kept as it
is and FILE.bak, the file from before configure, is left alone. The package's prerm runs it
on the engines' own config files that name its executable, the Kubernetes node installer on
the node's containerd config.
"""

from __future__ import annotations

import json
import os

from mounts.errors import SandboxError

CONFIGS = {"docker": "/etc/docker/daemon.json", "podman": "/etc/containers/containers.conf",
           "containerd": "/etc/containerd/config.toml"}
RESTART = {"docker": "restart dockerd (systemctl restart docker)",
           "podman": "podman reads it at its next command: nothing to restart",
           "containerd": "restart containerd (systemctl restart containerd), then name the handler in a RuntimeClass"}
CRI = "io.containerd.grpc.v1.cri"
SHIM = "io.containerd.runc.v2"
RUNC_MARK = "containerd's own, written by sandbox configure"  # (what --remove takes out again)


def main(args) -> int:
    engine, path = args.engine, args.config_file or CONFIGS[args.engine]
    from sandbox.executor.build import installed

    exe = os.path.abspath(args.path or installed())
    try:
        with open(path) as f:
            old = f.read()
            mode = os.fstat(f.fileno()).st_mode & 0o7777  # (kept: a daemon.json may be root's alone)
    except FileNotFoundError:
        old, mode = None, 0o644
    except OSError as e:
        raise SandboxError(f"{path}: {e.strerror}") from None
    if args.remove:
        return _remove(engine, path, old, exe, args.name, mode)
    name = args.name or "sandbox"
    new = {"docker": _docker, "podman": _podman, "containerd": _containerd}[engine](old or "", path, name, exe,
                                                                                 args.default)
    if new == old:
        print(f"{path}: {engine} already has the {name!r} runtime ({exe}): nothing changed")
        return 0
    if old is not None:
        with open(path + ".bak", "w") as f:
            f.write(old)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    from mounts.atomic import write_atomically

    write_atomically(path, new.encode(), f"sandbox configure {engine}", mode)
    what = "the default runtime" if args.default else "a runtime"
    print(f"{path}: {engine} has {name!r} ({exe}) as {what}" + (f"; the old file is {path}.bak" if old else "")
          + f": {RESTART[engine]}")
    return 0


def _remove(engine: str, path: str, old: str | None, exe: str, name: str | None, mode: int) -> int:
    """``configure --remove``: the file without our runtimes, or nothing changed."""
    if old is None:
        print(f"{path}: no such file: nothing to remove")
        return 0
    new, removed = {"docker": _docker_remove, "podman": _podman_remove,
                    "containerd": _containerd_remove}[engine](old, path, exe, name)
    if not removed:
        print(f"{path}: {engine} has no runtime{f' {name!r}' if name else ''} naming {exe}: nothing changed")
        return 0
    from mounts.atomic import write_atomically

    write_atomically(path, new.encode(), f"sandbox configure {engine} --remove", mode)
    print(f"{path}: {engine} no longer has {', '.join(map(repr, removed))} ({exe}): {RESTART[engine].split(',')[0]}")
    return 0


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
    return _unless_same(text, doc.as_string())


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
    if len(runtimes) == 0:
        # A config that names no runtime has containerd's own runc handler; one that names any
        # has those alone (the table replaces containerd's default): with ours alone, the CRI
        # plugin refuses to load ("no corresponding runtime configured ... runc", Debian's
        # config.toml), so runc's handler is written as containerd's default has it.
        import tomlkit

        runc = tomlkit.table()
        runc["runtime_type"] = SHIM
        runc.comment(RUNC_MARK)
        runtimes["runc"] = runc
    runc_opts = runtimes.get("runc", {}).get("options", {})
    shim = SHIM
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
    return _unless_same(text, doc.as_string())


def _unless_same(text: str, new: str) -> str:
    """``text`` itself where ``new`` holds the same values (tomlkit may indent a table of a
    parsed document anew: no change, then, and no write)."""
    import tomllib

    return text if text.strip() and tomllib.loads(new) == tomllib.loads(text) else new


# --- --remove ------------------------------------------------------------------------------


def _ours(name: str, wanted: str | None, binary: object, exe: object) -> bool:
    return (wanted is None or name == wanted) and binary == exe


def _docker_remove(text: str, path: str, exe: str, name: str | None) -> tuple[str, list[str]]:
    try:
        conf = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as e:
        raise SandboxError(f"{path}: invalid JSON: {e}") from None
    runtimes = conf.get("runtimes") if isinstance(conf, dict) else None
    if not isinstance(runtimes, dict):
        return text, []
    removed = [k for k, v in runtimes.items() if isinstance(v, dict) and _ours(k, name, v.get("path"), exe)]
    if not removed:
        return text, []
    conf["runtimes"] = {k: v for k, v in runtimes.items() if k not in removed}
    if not conf["runtimes"]:
        del conf["runtimes"]
    if conf.get("default-runtime") in removed:
        del conf["default-runtime"]  # (dockerd's own default: runc)
    return json.dumps(conf, indent=2) + "\n", removed


def _prune(parent, keys: list[str]) -> None:
    """Drop the tables along ``keys`` (outermost first) that hold nothing any more."""
    tables = [parent]
    for key in keys:
        if key not in tables[-1]:
            return
        tables.append(tables[-1][key])
    for table, key in zip(reversed(tables[:-1]), reversed(keys), strict=True):
        if len(table[key]) == 0:
            del table[key]
        else:
            return


def _podman_remove(text: str, path: str, exe: str, name: str | None) -> tuple[str, list[str]]:
    doc = _toml(text, path)
    runtimes = doc.get("engine", {}).get("runtimes", {})
    removed = [k for k, v in runtimes.items() if _ours(k, name, list(v) if isinstance(v, list) else None, [exe])]
    if not removed:
        return text, []
    for key in removed:
        del runtimes[key]
    if doc["engine"].get("runtime") in removed:
        del doc["engine"]["runtime"]  # (podman's own choice again)
    _prune(doc, ["engine", "runtimes"])
    return _trimmed(doc.as_string()), removed


def _containerd_remove(text: str, path: str, exe: str, name: str | None) -> tuple[str, list[str]]:
    doc = _toml(text, path)
    containerd = doc.get("plugins", {}).get(CRI, {}).get("containerd", {})
    runtimes = containerd.get("runtimes", {})
    removed = [k for k, v in runtimes.items()
               if hasattr(v, "get") and _ours(k, name, v.get("options", {}).get("BinaryName"), exe)]
    if not removed:
        return text, []
    for key in removed:
        del runtimes[key]
    runc = runtimes.get("runc")
    if list(runtimes) == ["runc"] and RUNC_MARK in getattr(getattr(runc, "trivia", None), "comment", ""):
        del runtimes["runc"]  # (containerd has it again without the table)
    if containerd.get("default_runtime_name") in removed:
        containerd["default_runtime_name"] = "runc"  # (containerd's own default)
    _prune(doc, ["plugins", CRI, "containerd", "runtimes"])
    return _trimmed(doc.as_string()), removed


def _trimmed(text: str) -> str:
    """Without the blank line tomlkit keeps where a table was taken out at the end."""
    return text.rstrip("\n") + "\n" if text.strip() else ""
