"""agent.fs.regular.write_all_pieces: every piece lands, in order, past IOV_MAX and through a real short
count (a signal ending a blocked writev part way into a piece)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from agent.fs.regular import write_all_pieces


def test_pieces_reach_a_pipe_whole_and_in_order_through_short_writes() -> None:
    # 3000 pieces are more than one writev takes (IOV_MAX 1024), and the empty ones are passed over.
    pieces = [bytes([i % 251]) * (i * 37 % 5000) for i in range(3000)]
    read_end, write_end = os.pipe()
    received = bytearray()

    def drain() -> None:
        while chunk := os.read(read_end, 1 << 16):
            received.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        write_all_pieces(write_end, pieces)
    finally:
        os.close(write_end)
        reader.join(timeout=30)
        os.close(read_end)
    assert not reader.is_alive()
    assert bytes(received) == b"".join(pieces)


def test_a_writev_a_signal_cuts_short_inside_a_piece_resumes_there(monkeypatch: pytest.MonkeyPatch) -> None:
    # A real short count: a blocking writev into a pipe nobody reads yet fills its 64 KiB and waits; a
    # signal then ends the call with what it wrote (pipe(7), signal(7): a partial transfer is returned,
    # not restarted), part way into the second 50 000-byte piece. The handler starts the reader, and the
    # rest must follow from exactly there. The real os.writev runs; a spy only records what it returned.
    pieces = [os.urandom(50_000) for _ in range(4)]
    read_end, write_end = os.pipe()
    received = bytearray()
    returned: list[tuple[int, int]] = []
    real_writev = os.writev

    def spy(fd: int, buffers: list[memoryview]) -> int:
        done = real_writev(fd, buffers)
        returned.append((done, sum(len(b) for b in buffers)))
        return done

    def drain() -> None:
        while chunk := os.read(read_end, 1 << 16):
            received.extend(chunk)

    reader = threading.Thread(target=drain)
    monkeypatch.setattr(os, "writev", spy)
    previous = signal.signal(signal.SIGALRM, lambda _signum, _frame: reader.start())
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        write_all_pieces(write_end, pieces)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        os.close(write_end)
        if reader.is_alive() or reader.ident is not None:
            reader.join(timeout=30)
        os.close(read_end)
    assert not reader.is_alive()
    first_done, first_asked = returned[0]
    assert 50_000 < first_done < first_asked, returned  # cut short inside the second piece
    assert bytes(received) == b"".join(pieces)
