"""The synchronous part of ``sandbox run``'s conversation with the gofer: parse the bundle,
send Start, discover the driver and stream each action of the plan the moment it is known,
then read the gofer's replies until it execs (see gofer/protocol.py)."""

from __future__ import annotations

import socket
import sys
import time

from gofer import protocol
from gofer.spans import Spans
from mounts.errors import BundleError
from mounts.spec import load_bundle


def stream_plan(args, sock: socket.socket, spans: Spans) -> None:
    with spans.span("bundle parse"):
        bundle = load_bundle(args.bundle)
        if bundle.spec.process is None:
            raise BundleError(f"{bundle.path}/config.json: process is missing: nothing to run")
        from mounts.request import gpu_request

        request = gpu_request(bundle.spec, args.gpus, args.capabilities)
    for name in bundle.spec.unenforced():
        print(f"sandbox run: warning: {name} is set in config.json but not enforced", file=sys.stderr)
    protocol.send(sock, protocol.Start(bundle.spec, bundle.rootfs, bundle.path, spans.enabled,
                                       overlay_root=request is not None, scratch_size=args.scratch_size))
    if request is not None:
        from mounts.driver import discover
        from mounts.plan import iter_plan, layout_of

        with spans.span("discovery"):
            inventory = discover(args.driver_root, args.dev_root)
            layout = layout_of(bundle.rootfs)
        t = time.monotonic_ns()
        n = 0
        for action in iter_plan(request, inventory, layout):
            protocol.send(sock, action)
            n += 1
        spans.add("closure + stream", t, actions=n)
    protocol.send(sock, protocol.End())


def read_replies(sock: socket.socket) -> list:
    """Every frame the gofer sends until EOF: it exec'd the container (the socket is
    close-on-exec) or exited. Blocking; signals are forwarded by the caller's handlers."""
    replies = []
    while True:
        try:
            msg = protocol.recv_reply(sock)
        except (ConnectionResetError, protocol.ProtocolError):
            return replies
        if msg is None:
            return replies
        replies.append(msg)
