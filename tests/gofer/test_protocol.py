import socket

import msgspec
import pytest

from gofer import protocol
from gofer.spans import Spans
from mounts import actions as A
from mounts import spec as S


def pair():
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


def test_round_trip_of_every_action():
    a, b = pair()
    msgs = [A.Device("/d/nvidiactl", "/dev/nvidiactl", A.RO_DEV, 195, 255),
            A.Library("/d/libcuda.so.1", "/usr/lib/libcuda.so.1", A.RO_LIB),
            A.Symlink("libcuda.so.1", "/usr/lib/libcuda.so"), protocol.End()]
    for m in msgs:
        protocol.send(a, m)
    assert [protocol.recv_request(b) for _ in msgs] == msgs
    a.close()
    assert protocol.recv_request(b) is None


def test_bad_frames_are_protocol_errors():
    a, b = pair()
    body = b"\x81\xa4kind\xa7unknown"  # msgpack {"kind": "unknown"}
    a.sendall(len(body).to_bytes(4, "little") + body)
    with pytest.raises(protocol.ProtocolError, match="bad frame"):
        protocol.recv_request(b)
    body = protocol.frame(A.Device("/x", "/dev/x", (), 1, 2))[4:].replace(b"\xa6source", b"\xa6sourcX")
    a.sendall(len(body).to_bytes(4, "little") + body)
    with pytest.raises(protocol.ProtocolError, match="bad frame"):
        protocol.recv_request(b)
    a.sendall((protocol.MAX_FRAME + 1).to_bytes(4, "little"))
    with pytest.raises(protocol.ProtocolError, match="over the"):
        protocol.recv_request(b)


def test_truncated_frame():
    a, b = pair()
    a.sendall(protocol.frame(protocol.End())[:-1])
    a.close()
    with pytest.raises(protocol.ProtocolError, match="mid-frame"):
        protocol.recv_request(b)


def test_spans_off_records_nothing():
    s = Spans(False)
    with s.span("x"):
        pass
    assert s.items == []


def test_a_negative_preserve_fds_is_no_start():
    """fds 3..3+N-1 pass on: a negative N would pass them all (cloexec_from(3 + N))."""
    start = protocol.Start(S.Spec("1.0.2", S.Root("/r")), "/r", "/b", preserve_fds=-4)
    a, b = pair()
    protocol.send(a, start)
    with pytest.raises(protocol.ProtocolError, match=r"bad frame: Expected `int` >= 0 - at `\$.preserve_fds`"):
        protocol.recv_request(b)
    protocol.send(a, msgspec.structs.replace(start, preserve_fds=2))
    assert protocol.recv_request(b).preserve_fds == 2
