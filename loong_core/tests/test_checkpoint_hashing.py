"""Checksums taken while a file is written: the same CRC-32 as reading it back, refused after a
seek, and used by the completion record only while the file still has the size written."""

from __future__ import annotations

import os
import zlib

from loong_core.checkpoint import integrity


def test_hashing_stream_gives_the_crc_of_what_reached_the_file(tmp_path):
    chunks = [os.urandom(n) for n in (7, 3 << 20, 1, 2 << 20)]  # small and overlapped writes
    with open(tmp_path / "f", "wb") as handle:
        stream = integrity.HashingStream(handle)
        for chunk in chunks:
            stream.write(chunk)
    assert stream.entry == {"size": sum(map(len, chunks)),
                            "crc32": integrity.crc32_of(tmp_path / "f")}
    assert stream.entry["crc32"] == f"{zlib.crc32(b''.join(chunks)):08x}"


def test_hashing_stream_after_a_seek_has_no_result(tmp_path):
    with open(tmp_path / "f", "wb") as handle:
        stream = integrity.HashingStream(handle)
        stream.write(b"abcd")
        stream.seek(0)
        stream.write(b"x")
    assert stream.entry is None


def test_a_written_entry_is_used_only_while_the_file_has_its_size(tmp_path):
    (tmp_path / "a").write_bytes(b"12345")
    (tmp_path / "b").write_bytes(b"123")
    known = {"a": {"size": 5, "crc32": "0000abcd"}, "b": {"size": 5, "crc32": "0000abcd"}}
    got = integrity.checksums(tmp_path, ["a", "b"], known)
    assert got["a"] == {"size": 5, "crc32": "0000abcd"}  # taken as written, not read again
    assert got["b"] == {"size": 3, "crc32": integrity.crc32_of(tmp_path / "b")}
