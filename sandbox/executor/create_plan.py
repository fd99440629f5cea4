"""`sandbox create` and `sandbox run` with the warm server: the server's child runs the
verb's Python (the command line, the state, the bundle, the cgroup with the launcher in it,
the plan) and forks the gofer, warm; the container's init is made by the launcher, as its
child, and the gofer builds its root from inside its namespaces and hands it its process
(gofer/remote_init.py, sandbox/executor/frontend.c). No Python starts on the container's path. A run
is a create that the server's child then starts (through exec.fifo, as `run -d`); in the
foreground, the launcher reaps the container and reports its end (``wait``), and the child
removes it as Python's run does.

The prestart and createRuntime hooks run here while the builder waits, as in Python; the
createContainer hooks run from the builder, in the container's namespaces before pivot_root;
the startContainer hooks are part of pid 1's plan (it runs them after start, before its exec).
Nothing is declined: the pids limit is written once the processes that make the container
are gone (sandbox/launch.py). An init created into a pid namespace not its own (a
pod's shared one, the host's) is the launcher's child there; with a user namespace, its
grandchild (frontend.c's userns_init)."""

from __future__ import annotations

import os
import socket

from gofer.cgroups.common import cgroup_dirs
from mounts.errors import SandboxError
from sandbox.executor.exec_plan import Decline


class CreateFrontend:
    """The launcher at the other end of ``conn``: its pid (it joins the cgroup) and the fd
    the gofer reaches it by."""

    def __init__(self, conn: socket.socket, pid: int):
        conn.settimeout(None)  # (the request's deadline is over; the gofer talks to it next)
        self.conn, self.pid = conn, pid
        self.read = None  # launch.read_bundle's, once check has read the bundle
        self.cgroups = cgroup_dirs(pid)  # where it goes back should the create fail
        self.planned = False  # taken up: never declined from here on

    def check(self, args) -> None:
        """Raise Decline where the launcher's init cannot serve this bundle; else take the
        verb up. A bundle that cannot be read is not declined: the verb says so, as it would
        in Python."""
        from sandbox.launch import options, read_bundle

        opts = options(args, foreground=args.verb == "run" and not args.detach)
        try:
            read = read_bundle(opts)
        except SandboxError:
            self._take_up()
            return
        self.read = read  # (launch takes it from here: the bundle is read once)
        self._take_up()

    def _take_up(self) -> None:
        """{"running"}, before the verb has any effect (the id claimed, a cgroup made): from
        here on the launcher never runs it again in Python, and reports our death (issue
        #29: a worker killed after the claim had the launcher's Python create say "already
        exists"). Refused (a launcher that gave up waiting: its shutdown makes our send fail),
        nothing happens and the launcher runs the verb itself."""
        try:
            self.conn.sendall(b'{"running": true}')
        except OSError as e:
            raise Decline(f"the launcher stopped waiting: {e.strerror}") from None
        self.planned = True

    def launcher(self):
        from sandbox.launch import Launcher

        return Launcher(self.pid, self.conn.fileno(), self.cgroups)

    def wait(self, state) -> int:
        """A foreground run's container started: the launcher, its pid 1's parent, waits for
        it and sends "status N", its wait status, returned here. A launcher gone first takes
        the container with it (SIGKILL: no one else would reap or remove it). We
        wait as a process of our own, no longer the server's child (a container may run for
        days): should we die, the launcher removes the container itself at its end."""
        import signal

        from mounts.errors import SandboxError
        from sandbox.processes import kill_all

        if os.fork():  # the wait is no request of the server's: out of its children (MAX_CHILDREN)
            os._exit(0)
        os.setsid()  # and out of its process group (a ^C to a server in a terminal)
        from gofer.frontend_plan import wait_status
        from sandbox.jsonlite import dumps

        try:
            self.conn.sendall(dumps({"started": True, "id": state.id}).encode())
            data = self.conn.recv(64)
        except OSError:
            data = b""
        status = wait_status(data)
        if status is not None:
            return status
        try:
            kill_all(state)  # (pid 1 reaped by whoever it passed on to)
        except SandboxError:
            pass  # (the removal of its cgroups then says what is left)
        return signal.SIGKILL  # (its wait status)
