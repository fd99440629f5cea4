"""The systemd cgroup driver (``--systemd-cgroup``), as runc 1.1's: the container's cgroup is
a transient scope unit that systemd makes over D-Bus (jeepney), under a slice, with the
container's first process in it and the limits as unit properties; what systemd has no
property for is written to the unit's cgroup files directly, as the cgroupfs driver writes
them (gofer/cgroups/).

``linux.cgroupsPath`` is ``slice:prefix:name``: the unit is ``prefix-name.scope`` in
``slice`` (``system.slice`` when empty; ``a-b.slice`` lives in ``a.slice``), or the slice
``name`` itself when it ends in ``.slice``. Device rules: DevicePolicy=strict and a
DeviceAllow entry per allowed node (systemd rewrites a v1 devices controller from these on
every reload, so they must say what ours say), and our own program or v1 rules as with
cgroupfs.
"""

from __future__ import annotations

import os
import time

from mounts.errors import SandboxError

PRIVATE = "unix:path=/run/systemd/private"  # systemd's own socket (root's; no dbus-daemon needed)
SYSTEMD = ("org.freedesktop.systemd1", "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager")
JOB_TIMEOUT = 30.0  # s for systemd to start or stop a unit (runc's)
NUDGE = 0.05  # s of silence after which Bus.ask pings systemd (see there)


def running() -> bool:
    """systemd's own test (sd_booted): it is the init here."""
    return os.path.isdir("/run/systemd/system")


def unit_of(cgroups_path: str | None, cid: str) -> tuple[str, str]:
    """(slice, unit) for ``linux.cgroupsPath`` (runc's rules; empty: system.slice,
    sandbox-ID.scope)."""
    if not cgroups_path:
        return "system.slice", f"sandbox-{cid}.scope"
    parts = cgroups_path.split(":")
    if len(parts) != 3:
        raise SandboxError(f'linux.cgroupsPath: expected "slice:prefix:name" for systemd cgroups, got '
                           f"{cgroups_path!r}", code=2)
    slice_, prefix, name = parts
    slice_ = slice_ or "system.slice"
    expand_slice(slice_)  # (checked)
    if name.endswith(".slice"):
        expand_slice(name)
        return slice_, name
    if not name or "/" in name or "/" in prefix:
        raise SandboxError(f"linux.cgroupsPath: {cgroups_path!r}: the scope's name must be a plain name", code=2)
    return slice_, f"{prefix}-{name}.scope" if prefix else f"{name}.scope"


def expand_slice(slice_: str) -> str:
    """``a-b-c.slice`` -> ``/a.slice/a-b.slice/a-b-c.slice`` (systemd's nesting by dashes)."""
    if slice_ == "-.slice":
        return "/"
    if not slice_.endswith(".slice") or "/" in slice_ or slice_ == ".slice":
        raise SandboxError(f"linux.cgroupsPath: invalid slice name {slice_!r}", code=2)
    base = slice_[: -len(".slice")]
    parts = base.split("-")
    if any(not p for p in parts):
        raise SandboxError(f"linux.cgroupsPath: invalid slice name {slice_!r}", code=2)
    return "".join("/" + "-".join(parts[: i + 1]) + ".slice" for i in range(len(parts)))


class Bus:
    """A connection to systemd: its private socket (as root's systemctl), else the system bus."""

    def __init__(self) -> None:
        from jeepney import DBusAddress
        from jeepney.io.blocking import open_dbus_connection

        self.manager = DBusAddress(SYSTEMD[1], bus_name=SYSTEMD[0], interface=SYSTEMD[2])
        try:
            self.conn = _direct(PRIVATE)
        except OSError:
            from jeepney.bus_messages import message_bus

            try:
                self.conn = open_dbus_connection("SYSTEM")
                self.conn.send_and_get_reply(message_bus.Hello(), timeout=5)
            except OSError as e:
                raise SandboxError(f"--systemd-cgroup: cannot reach systemd over D-Bus ({PRIVATE[10:]}, the "
                                   f"system bus): {e.strerror or e}") from None

    def call(self, method: str, signature: str | None, *body, what: str = "", timeout: float = JOB_TIMEOUT):
        from jeepney import new_method_call
        from jeepney.wrappers import DBusErrorResponse, unwrap_msg

        try:
            reply = self.ask(new_method_call(self.manager, method, signature, body), timeout)
            return unwrap_msg(reply)
        except DBusErrorResponse as e:
            raise SystemdError(e.name, f"systemd {method} {what}: {e.name}: {' '.join(map(str, e.data))}") from None
        except TimeoutError:
            raise SandboxError(f"systemd {method} {what}: no answer in {timeout:.0f} s") from None

    def unit_property(self, unit: str, interface: str, name: str):
        from jeepney import DBusAddress, Properties
        from jeepney.wrappers import DBusErrorResponse, unwrap_msg

        (path,) = self.call("GetUnit", "s", unit, what=unit, timeout=5)
        obj = DBusAddress(path, bus_name=SYSTEMD[0], interface=interface)
        try:
            (value,) = unwrap_msg(self.ask(Properties(obj).get(name), 5))
        except DBusErrorResponse as e:
            raise SystemdError(e.name, f"systemd: {unit} {name}: {e.name}") from None
        except TimeoutError:
            raise SandboxError(f"systemd: {unit} {name}: no answer in 5 s") from None
        return value[1]

    def ask(self, message, timeout: float):
        """send_and_get_reply, nudging systemd while it is silent. systemd 252 (sd-bus as a
        server) leaves a message it read in the same chunk as the connection's BEGIN unhandled
        until something else wakes it (seen under strace here: GetUnit read, no reply, the
        reply only once the client hung up), so every NUDGE of silence a Peer.Ping is sent:
        its arrival has systemd handle what it holds."""
        from jeepney import DBusAddress, new_method_call
        from jeepney.low_level import HeaderFields

        peer = DBusAddress("/", bus_name=SYSTEMD[0], interface="org.freedesktop.DBus.Peer")
        deadline = time.monotonic() + timeout
        serial = next(self.conn.outgoing_serial)
        self.conn.send_message(message, serial=serial)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            try:
                reply = self.conn.receive(timeout=min(left, NUDGE))
            except TimeoutError:
                self.conn.send_message(new_method_call(peer, "Ping"), serial=next(self.conn.outgoing_serial))
                continue
            if reply.header.fields.get(HeaderFields.reply_serial, -1) == serial:
                return reply

    def close(self) -> None:
        self.conn.close()


def _direct(address: str):
    """A peer-to-peer connection to systemd itself: authenticated as on a bus, but without
    the bus's Hello (there is no bus daemon to answer it). jeepney's blocking connection
    says Hello as it is made; this one is the same, but for that."""
    from jeepney.bus import get_bus
    from jeepney.io.blocking import DBusConnection, DBusConnectionBase, prep_socket
    from jeepney.io.common import MessageFilters

    class Direct(DBusConnection):
        def __init__(self, sock):
            DBusConnectionBase.__init__(self, sock, False)
            self._filters = MessageFilters()

    return Direct(prep_socket(get_bus(address), False, timeout=1.0))


class SystemdError(SandboxError):
    def __init__(self, name: str, message: str):
        super().__init__(message, op="systemd")
        self.name = name


UNIT_EXISTS = "org.freedesktop.systemd1.UnitExists"


def start_unit(bus: Bus, unit: str, slice_: str, pid: int, properties: list[tuple[str, tuple[str, object]]]) -> None:
    """StartTransientUnit. A unit of that name that is there already is never ours to join or
    to stop: one left behind failed (no process in it) is reset and the start tried once
    more, as runc 1.2 does; any other is refused, and left as it is. (runc 1.1 joined it with
    a warning and its delete then stopped it, killing its owner's processes; runc 1.2 refuses
    it: opencontainers/runc#3780, #3782. Joined, its processes would get our device rules
    and limits, and systemd would rewrite ours from its owner's properties on any reload.)"""
    kind = _kind(unit)
    props = [("Description", ("s", f"sandbox container {unit}")), ("Slice", ("s", slice_)),
             ("DefaultDependencies", ("b", False)), ("Delegate", ("b", True)),
             ("MemoryAccounting", ("b", True)), ("CPUAccounting", ("b", True)),
             ("TasksAccounting", ("b", True)), ("IOAccounting", ("b", True)), *properties]
    if kind == "Scope":
        props.append(("PIDs", ("au", [pid])))
    for retry in (True, False):
        try:
            bus.call("StartTransientUnit", "ssa(sv)a(sa(sv))", unit, "replace", props, [], what=unit)
            return
        except SystemdError as e:
            if e.name != UNIT_EXISTS:
                raise
        try:
            state = bus.unit_property(unit, "org.freedesktop.systemd1.Unit", "ActiveState")
        except SystemdError:
            state = "gone"  # (since: try again)
        if retry and state in ("failed", "gone"):
            if state == "failed":
                try:
                    bus.call("ResetFailedUnit", "s", unit, what=unit, timeout=5)
                except SystemdError:
                    pass
            continue
        raise SandboxError(f"linux.cgroupsPath: the systemd unit {unit} already exists ({state}): it is not this "
                           "container's, and is left as it is (a container gets a unit of its own)", op="systemd")


def wait_active(bus: Bus, unit: str) -> tuple[str, str]:
    """Wait until the unit we started is active: (its cgroup, as systemd's ControlGroup
    property names it, relative to the hierarchies' roots; its InvocationID, in hex: what
    tells this start of the unit from any later unit of the same name)."""
    kind = _kind(unit)
    deadline = time.monotonic() + JOB_TIMEOUT
    while True:
        state = bus.unit_property(unit, "org.freedesktop.systemd1.Unit", "ActiveState")
        if state == "active":
            break
        if state == "failed" or time.monotonic() > deadline:
            raise SandboxError(f"systemd: {unit} is {state}, not active")
        time.sleep(0.001)
    group = bus.unit_property(unit, f"org.freedesktop.systemd1.{kind}", "ControlGroup")
    return group, bytes(bus.unit_property(unit, "org.freedesktop.systemd1.Unit", "InvocationID")).hex()


def set_properties(unit: str, properties: list[tuple[str, tuple[str, object]]], frozen: list[str] | None = None) -> None:
    """SetUnitProperties at runtime (update, the GPU nodes' DeviceAllow). ``frozen``: the
    running container's cgroup directories, whose v1 freezer holds it meanwhile: systemd
    re-applies the unit's devices to a v1 devices controller on any property change, denying
    everything first, and the container's opens of /dev/null failed (EPERM) in between
    (runc's systemd driver freezes so too)."""
    if not properties:
        return
    freezer = next((d for d in frozen or () if os.path.exists(os.path.join(d, "freezer.state"))), "")
    thaw = bool(freezer) and _freeze(freezer)
    try:
        bus = Bus()
        try:
            bus.call("SetUnitProperties", "sba(sv)", unit, True, properties, what=unit)
        finally:
            bus.close()
    finally:
        if thaw:
            _thaw(freezer)


def update(unit: str, properties: list[tuple[str, tuple[str, object]]], write, frozen: list[str]) -> None:
    """``sandbox update`` under the systemd driver, as runc's: the unit's properties, then the
    cgroup's files (``write``: gofer.cgroups.update, which puts its files back should one
    fail). The properties are read first and set back should the files fail, so a failed
    update changes nothing (SetUnitProperties itself checks every property before it applies
    any). On v1 systemd writes MemoryLimit to memory.limit_in_bytes unordered: refused
    (logged) where it would pass memory+swap, then written in order with the files."""
    old = _properties(unit, properties)
    set_properties(unit, properties, frozen)
    try:
        write()
    except BaseException as e:
        try:
            set_properties(unit, old, frozen)
        except SandboxError as again:
            raise SandboxError(f"{e}; {unit}'s properties not put back: {again}") from None
        raise


def _properties(unit: str, properties: list[tuple[str, tuple[str, object]]]) -> list[tuple[str, tuple[str, object]]]:
    """The values ``properties`` have on ``unit`` now, as (name, (signature, value))."""
    if not properties:
        return []
    interface = "org.freedesktop.systemd1." + _kind(unit)
    bus = Bus()
    try:
        return [(name, (sig, bus.unit_property(unit, interface, name))) for name, (sig, _) in properties]
    finally:
        bus.close()


def _thaw(directory: str) -> None:
    from gofer.cgroups.common import write_file

    try:
        write_file(directory, "freezer.state", "THAWED")
    except SandboxError:
        pass  # (the container's cgroup gone meanwhile: nothing left to thaw)


FREEZE_WAIT = 1.0  # s for a container to freeze; past it the update goes on unfrozen (thawed first)


def _freeze(directory: str) -> bool:
    """Freeze the v1 cgroup at ``directory``: whether we did (False: frozen already by
    someone else, or it would not freeze in time, and is thawed again)."""
    from gofer.cgroups.common import read, write_file

    path = os.path.join(directory, "freezer.state")
    if read(path) == "FROZEN":
        return False
    write_file(directory, "freezer.state", "FROZEN")
    deadline = time.monotonic() + FREEZE_WAIT
    while time.monotonic() < deadline:
        if read(path) == "FROZEN":
            return True
        time.sleep(0.001)
    _thaw(directory)
    return False


def stop(unit: str, invocation: str | None) -> None:
    """StopUnit and forget a failed state, of the unit we started: ``invocation``, its
    InvocationID (None: the unit this very process started). A unit already gone (a scope
    goes by itself when its last process does) is fine; one of the same name started since
    is someone else's, and is left alone."""
    bus = Bus()
    try:
        try:
            state = bus.unit_property(unit, "org.freedesktop.systemd1.Unit", "ActiveState")
            if invocation is not None and bytes(bus.unit_property(
                    unit, "org.freedesktop.systemd1.Unit", "InvocationID")).hex() != invocation:
                return
        except SystemdError:
            return  # no such unit: gone already
        if state not in ("inactive", "failed"):
            try:
                bus.call("StopUnit", "ss", unit, "replace", what=unit, timeout=5)
            except SystemdError as e:
                if e.name == "org.freedesktop.systemd1.NoSuchUnit":
                    return
                raise
            deadline = time.monotonic() + JOB_TIMEOUT
            while time.monotonic() < deadline:
                try:
                    state = bus.unit_property(unit, "org.freedesktop.systemd1.Unit", "ActiveState")
                except SystemdError:
                    return  # gone
                if state in ("inactive", "failed"):
                    break
                time.sleep(0.002)
        try:
            bus.call("ResetFailedUnit", "s", unit, what=unit, timeout=5)
        except SystemdError:
            pass
    finally:
        bus.close()


def resource_properties(r, v2: bool) -> list[tuple[str, tuple[str, object]]]:
    """The limits systemd has properties for, converted as runc's systemd driver converts
    them; everything is written to the cgroup's files afterwards too."""
    out: list[tuple[str, tuple[str, object]]] = []
    if r is None:
        return out
    mem, cpu, pids = r.memory, r.cpu, r.pids
    if mem is not None and mem.limit:
        out.append(("MemoryMax" if v2 else "MemoryLimit", ("t", mem.limit if mem.limit > 0 else 2**64 - 1)))
    if mem is not None and v2:  # v1 has no property for memory+swap: its file alone (ordered there)
        from gofer.cgroups import swap_v2

        swap = swap_v2(mem.swap or 0, mem.limit or 0)
        if swap is not None:  # (0 too, unlike runc's: systemd re-applies its properties on a reload)
            out.append(("MemorySwapMax", ("t", 2**64 - 1 if swap == "max" else swap)))
    if cpu is not None:
        if cpu.shares:
            if v2:  # runc's conversion of shares to cgroup v2's weight
                out.append(("CPUWeight", ("t", 1 + ((cpu.shares - 2) * 9999) // 262142)))
            else:
                out.append(("CPUShares", ("t", cpu.shares)))
        if cpu.quota and cpu.quota > 0:
            period = cpu.period or 100000
            # per second, rounded up to whole 10 ms as systemd takes it (runc's rounding)
            per_sec = cpu.quota * 1000000 // period
            per_sec = (per_sec + 9999) // 10000 * 10000
            out.append(("CPUQuotaPerSecUSec", ("t", per_sec)))
            if cpu.period and v2:
                out.append(("CPUQuotaPeriodUSec", ("t", cpu.period)))
    if pids is not None and pids.limit:
        out.append(("TasksMax", ("t", pids.limit if pids.limit > 0 else 2**64 - 1)))
    return out


def device_properties(rules) -> list[tuple[str, tuple[str, object]]]:
    """DevicePolicy and DeviceAllow for our ordered rules (gofer/cgroups/common.py rules: the last
    match decides): an allow-all makes the policy auto; otherwise strict, with an entry per
    allowed node or major that no later deny takes back (a wildcard major is "char-*": every
    major /proc/devices lists). A major without a name there is left to our rules alone:
    denied, should systemd ever rewrite them."""
    if rules and rules[-1].allow and rules[-1].type == "a" and rules[-1].major is None:
        return [("DevicePolicy", ("s", "auto"))]
    names = _majors()
    allow: list[tuple[str, str]] = []
    for i, rule in enumerate(rules):
        if not rule.allow or rule.type == "a":
            continue
        later = rules[i + 1:]
        if any(not r.allow and r.type in ("a", rule.type) and r.major in (None, rule.major)
               and r.minor in (None, rule.minor) for r in later):
            continue
        kind = "char" if rule.type == "c" else "block"
        if rule.major is None:  # systemd matches the names in /proc/devices: every major listed
            allow.append((f"{kind}-*", rule.access))
        elif rule.minor is not None:
            allow.append((f"/dev/{kind}/{rule.major}:{rule.minor}", rule.access))
        elif (kind, rule.major) in names:
            allow.append((f"{kind}-{names[(kind, rule.major)]}", rule.access))
    return [("DevicePolicy", ("s", "strict")), ("DeviceAllow", ("a(ss)", allow))]


def _majors() -> dict[tuple[str, int], str]:
    """/proc/devices: (char|block, major) -> the driver's name."""
    out: dict[tuple[str, int], str] = {}
    kind = None
    try:
        with open("/proc/devices") as f:
            for line in f:
                if line.startswith("Character"):
                    kind = "char"
                elif line.startswith("Block"):
                    kind = "block"
                elif kind and line.strip():
                    number, name = line.split()
                    out.setdefault((kind, int(number)), name)
    except OSError:
        pass
    return out


class SystemdCgroup:
    """The container's cgroup as a transient unit: the same face as gofer/cgroups/ v1.py's and v2.py's
    CgroupV1 and CgroupV2 (create, apply, add, allow, seal, remove, dirs, created), the unit
    started at add(), once the first process is known."""

    def __init__(self, cgroups_path: str | None, cid: str):
        from gofer import cgroups

        self.slice, self.unit = unit_of(cgroups_path, cid)
        self.v2 = cgroups.unified()
        self.dirs: dict[str, str] = {}
        self.created: list[str] = []  # what we made ourselves: controllers systemd does not manage
        self.resources = self.devices = None
        self.fs: cgroups.CgroupV1 | cgroups.CgroupV2 | None = None
        self.gpu_nodes: list[tuple[int, int]] = []
        self.started = False  # the unit is ours: we started it (a unit that was there is never ours)
        self.invocation = ""  # its InvocationID (hex), once it is active: what delete checks before it stops it

    def missing(self) -> list[str]:
        return []

    def members(self) -> list[int]:
        return []  # a unit that exists already is refused at add() (start_unit)

    def create(self) -> None:
        pass  # at add(): systemd makes the cgroup with the process in it

    def apply(self, resources, devices) -> None:
        self.resources, self.devices = resources, devices

    def add(self, pid: int) -> None:
        from gofer import cgroups

        rules = cgroups.device_rules(self.resources, self.devices)
        try:
            bus = Bus()
            try:
                start_unit(bus, self.unit, self.slice, pid,
                           resource_properties(self.resources, self.v2) + device_properties(rules))
                self.started = True
                group, self.invocation = wait_active(bus, self.unit)
            finally:
                bus.close()
            if self.v2:
                self.dirs = {"unified": os.path.join(cgroups.ROOT, group.lstrip("/"))}
                self.fs = cgroups.CgroupV2("", dirs=self.dirs)
            else:
                self.dirs = {ctrl: os.path.join(os.path.realpath(os.path.join(cgroups.ROOT, ctrl)), group.lstrip("/"))
                             for ctrl in cgroups.own_cgroups()}
                self.fs = cgroups.CgroupV1("", dirs=self.dirs)
                # the controllers systemd leaves alone (cpuset, freezer ...): made as cgroupfs
                # makes them (a cpuset from its parent's), and joined
                self.fs.create()
                self.created = self.fs.created
                self.fs.add(pid)
            self.fs.apply(self.resources, self.devices)  # the files systemd has no property for
        except BaseException:
            self.remove()
            raise

    def limits(self, resources) -> None:
        """New limits for the unit made (the unit's properties, then the files systemd has no
        property for)."""
        set_properties(self.unit, resource_properties(resources, self.v2))
        if self.fs is not None:
            self.fs.limits(resources)

    def allow(self, major: int, minor: int) -> None:
        self.gpu_nodes.append((major, minor))
        if self.fs is not None:
            self.fs.allow(major, minor)

    def seal(self) -> None:
        """The GPU nodes into the unit's DeviceAllow too (systemd's own device program or its
        rewrite of the v1 rules must allow them), the container frozen meanwhile (the gofer
        makes /dev while systemd rewrites: see set_properties), then our program (v2)."""
        if self.gpu_nodes:
            set_properties(self.unit, [("DeviceAllow", ("a(ss)", [(f"/dev/char/{a}:{b}", "rw")
                                                                  for a, b in self.gpu_nodes]))],
                           frozen=list(self.dirs.values()))
        if self.fs is not None:
            self.fs.seal()

    def remove(self) -> None:
        """What we made: the unit, if we started it, and the directories."""
        from gofer import cgroups

        if self.started:
            stop(self.unit, self.invocation or None)
        cgroups.remove_dirs(self.created)


def _kind(unit: str) -> str:
    """The D-Bus interface's last word for a unit of ours: a slice or a scope."""
    return "Slice" if unit.endswith(".slice") else "Scope"
