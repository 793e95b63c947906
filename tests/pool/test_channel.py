"""The pool and its job processes speak through :class:`outlast.boot.Channel` (a pickle per
message, its length first) on a real socket pair."""

from __future__ import annotations

import socket
import threading

import pytest

from outlast.boot import Channel
from outlast.machine import Outcome


def _pair() -> tuple[Channel, Channel]:
    a, b = socket.socketpair()
    return Channel(a.detach()), Channel(b.detach())


def test_messages_arrive_whole_and_in_order_both_ways() -> None:
    pool, job = _pair()
    try:
        pool.send(("job-1", 3, b'{"id": "job-1"}', [("job-0", 1)]))
        pool.send(None)
        assert job.recv() == ("job-1", 3, b'{"id": "job-1"}', [("job-0", 1)])
        assert job.recv() is None
        job.send(Outcome("succeed", value=[1, "two"]))
        said = pool.recv()
        assert said == Outcome("succeed", value=[1, "two"])
    finally:
        pool.close()
        job.close()


def test_a_message_larger_than_the_socket_buffer_arrives_whole() -> None:
    """8 MB: many partial writes and reads (the reader runs while the writer writes)."""
    pool, job = _pair()
    big = bytes(range(256)) * (8 * 4096)
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.append(job.recv()))
    reader.start()
    try:
        pool.send(("id", 1, big, []))
        reader.join(30)
        assert got == [("id", 1, big, [])]
    finally:
        pool.close()
        job.close()


def test_poll_waits_at_most_its_timeout_and_sees_a_message() -> None:
    pool, job = _pair()
    try:
        assert not job.poll(0)
        assert not job.poll(0.05)
        pool.send("ready")
        assert job.poll(5)
        assert job.recv() == "ready"
    finally:
        pool.close()
        job.close()


def test_the_other_end_closing_is_eof_even_in_the_middle_of_a_message() -> None:
    a, b = socket.socketpair()
    job = Channel(b.detach())
    try:
        a.sendall(b"\x00\x00\x01\x00" + b"x" * 10)  # 256 bytes announced, 10 sent
        a.close()
        assert job.poll(5)  # the close wakes a poll, as a message does
        with pytest.raises(EOFError):
            job.recv()
        with pytest.raises(EOFError):
            job.recv()
    finally:
        job.close()


def test_a_closed_channel_refuses_with_oserror_and_closes_once() -> None:
    pool, job = _pair()
    pool.close()
    pool.close()
    for verb in (lambda: pool.send(None), pool.recv, pool.fileno, pool.poll):
        with pytest.raises(OSError, match="closed"):
            verb()
    with pytest.raises(EOFError):
        job.recv()
    with pytest.raises(OSError):  # EPIPE: the pool's end is gone
        job.send("ready")
    job.close()
