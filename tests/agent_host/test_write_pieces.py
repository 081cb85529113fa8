"""agent.fs.regular.write_all_pieces: every piece lands, in order, through short writes and past IOV_MAX."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from agent.fs.regular import write_all_pieces


def test_pieces_reach_a_pipe_whole_and_in_order_through_short_writes() -> None:
    # A pipe holds 64 KiB: writev returns short counts, often in the middle of a piece; 3000 pieces are
    # more than one writev takes (IOV_MAX 1024), and the empty ones are passed over.
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


def test_short_counts_resume_inside_a_piece(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A blocking pipe or a local disk writes everything it can; a short count (a signal, a full device
    # reached part way) is made here by letting each real writev take at most 1000 bytes.
    real_writev = os.writev

    def short_writev(fd: int, buffers: list[memoryview]) -> int:
        taken, left = [], 1000
        for b in buffers:
            if left == 0:
                break
            taken.append(b[:left])
            left -= len(taken[-1])
        return real_writev(fd, taken)

    monkeypatch.setattr(os, "writev", short_writev)
    pieces = [os.urandom(n) for n in (1, 999, 0, 2500, 7, 4096, 1000)]
    target = tmp_path / "staged"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        write_all_pieces(fd, pieces)
    finally:
        os.close(fd)
    assert target.read_bytes() == b"".join(pieces)
