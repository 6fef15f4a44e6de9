"""Testing kit: damage or booby-trap a checkpoint the way an unlucky operator or an attacker would,
and give a run the storage of an unlucky cluster (:func:`small_filesystem`, :func:`read_only_folder`).

Each ``plant_*`` function rewrites one file of a checkpoint so that unpickling it runs a payload
(it creates ``marker``) and then returns the original object: a loader that unpickles freely
would go on normally and the run would finish, so only the marker tells that code ran. The
completion record's checksums are rewritten too (:func:`rerecord_checksums`), as an attacker who
can edit the directory would, so that only safe loading stands between the payload and the run.

Only for tests: these functions unpickle the files they rewrite.
"""

from __future__ import annotations

import dataclasses
import io
import json
import operator
import os
import pickle
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from loong_core.checkpoint import integrity
from loong_core.checkpoint.store import COMPLETE_FILE


class _Run:
    """Unpickles as ``exec(code)``."""

    def __init__(self, code: str):
        self.code = code

    def __reduce__(self):
        return exec, (self.code,)


class _Trojan:
    """Unpickles as ``(exec(code), original)[1]``: the payload runs, the original comes back."""

    def __init__(self, original, marker: Path):
        self.original, self.marker = original, Path(marker)

    def __reduce__(self):
        code = f"open({str(self.marker)!r}, 'w').write('payload ran')"
        return operator.getitem, ((_Run(code), self.original), 1)


def rerecord_checksums(checkpoint: Path) -> None:
    """Rewrite the record's checksums for the files as they are now."""
    record_file = Path(checkpoint) / COMPLETE_FILE
    record = json.loads(record_file.read_text())
    names = integrity.checkpoint_files(Path(checkpoint), skip=(COMPLETE_FILE,))
    record["files"] = integrity.checksums(Path(checkpoint), names)
    record_file.write_text(json.dumps(record, indent=1))


def plant_in_torch_file(file: Path, marker: Path) -> None:
    """Turn a ``torch.save`` file (RNG state, ``common.pt``, ``loong_state.pt``) into a trojan."""
    file = Path(file)
    original = torch.load(file, weights_only=False)
    torch.save(_Trojan(original, marker), file)
    rerecord_checksums(_checkpoint_of(file))


def plant_in_metadata(checkpoint: Path, marker: Path) -> None:
    """Turn the DCP ``.metadata`` file into a trojan."""
    path = Path(checkpoint) / ".metadata"
    original = pickle.loads(path.read_bytes())
    path.write_bytes(pickle.dumps(_Trojan(original, marker)))
    rerecord_checksums(checkpoint)


def _metadata(checkpoint: Path):
    return pickle.loads((Path(checkpoint) / ".metadata").read_bytes())


def _entries(checkpoint: Path, want_bytes: bool, contains: str):
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    metadata = _metadata(checkpoint)
    for index, info in metadata.storage_data.items():
        is_bytes = isinstance(metadata.state_dict_metadata[index.fqn], BytesStorageMetadata)
        if is_bytes == want_bytes and contains in index.fqn:
            yield metadata, index, info


def plant_in_shard_object(checkpoint: Path, marker: Path, contains: str = "",
                          tensor: bool = False) -> str:
    """Make one non-tensor entry of a ``.distcp`` shard (``_extra_state``, optimizer settings),
    or with ``tensor`` one tensor chunk, a trojan: the new bytes are appended to its shard and
    ``.metadata`` points at them.

    Returns:
        The entry's key.
    """
    checkpoint = Path(checkpoint)
    metadata, index, info = next(_entries(checkpoint, not tensor, contains))
    shard = checkpoint / info.relative_path
    with open(shard, "rb") as handle:
        handle.seek(info.offset)
        original = torch.load(io.BytesIO(handle.read(info.length)), weights_only=False)
    blob = io.BytesIO()
    torch.save(_Trojan(original, marker), blob)
    offset = shard.stat().st_size
    with open(shard, "ab") as handle:
        handle.write(blob.getvalue())
    metadata.storage_data[index] = dataclasses.replace(info, offset=offset, length=len(blob.getvalue()))
    (checkpoint / ".metadata").write_bytes(pickle.dumps(metadata))
    rerecord_checksums(checkpoint)
    return index.fqn


def scale_tensor(checkpoint: Path, factor: float, contains: str = "") -> tuple[str, str]:
    """Multiply one stored tensor by ``factor`` in place (same file size; checksums not updated).

    Returns:
        ``(shard file name, tensor key)``.
    """
    checkpoint = Path(checkpoint)
    for _, index, info in _entries(checkpoint, False, contains):
        shard = checkpoint / info.relative_path
        with open(shard, "r+b") as handle:
            handle.seek(info.offset)
            tensor = torch.load(io.BytesIO(handle.read(info.length)), weights_only=True)
            if not tensor.is_floating_point() or not tensor.abs().sum():
                continue
            blob = io.BytesIO()
            torch.save(tensor * factor, blob)
            if len(blob.getvalue()) != info.length:
                continue
            handle.seek(info.offset)
            handle.write(blob.getvalue())
        return info.relative_path, index.fqn
    raise ValueError(f"no floating-point tensor matching {contains!r} in {checkpoint}")


def truncate(file: Path, keep: float = 0.5) -> None:
    """Cut ``file`` to ``keep`` of its length (an interrupted copy)."""
    file = Path(file)
    data = file.read_bytes()
    file.write_bytes(data[: int(len(data) * keep)])


def _checkpoint_of(file: Path) -> Path:
    for parent in [file.parent, *file.parents]:
        if (parent / COMPLETE_FILE).is_file():
            return parent
    raise ValueError(f"{file} is not inside a checkpoint")


def _mount_tmpfs(folder: Path, options: str) -> str | None:
    """Mount a tmpfs on ``folder``; the reason when that is not possible (not root, no
    ``CAP_SYS_ADMIN``, no ``mount``)."""
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if done.returncode == 0 else (done.stderr.strip() or f"mount exited {done.returncode}")


def _unmount(folder: Path) -> None:
    subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30)


@contextmanager
def small_filesystem(folder: Path, size_bytes: int) -> Iterator[Path]:
    """A real filesystem of ``size_bytes`` mounted on ``folder`` (a tmpfs, created empty): writes
    past its size fail with ``ENOSPC`` as on a full disk. Skips the test (pytest) where mounting
    is not permitted (it needs root or ``CAP_SYS_ADMIN``).

    Yields:
        ``folder``.
    """
    import pytest

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    why = _mount_tmpfs(folder, f"size={int(size_bytes)}")
    if why:
        pytest.skip(f"a small filesystem needs 'mount -t tmpfs' (root or CAP_SYS_ADMIN): {why}")
    try:
        yield folder
    finally:
        _unmount(folder)


@contextmanager
def read_only_folder(folder: Path) -> Iterator[Path]:
    """``folder`` made read-only for this process: ``chmod 0555`` for a normal user; for root, who
    ignores permission bits, a read-only tmpfs mounted on it (the test is skipped where root may
    not mount). Its previous content is hidden by the mount in the root case.

    Yields:
        ``folder``.
    """
    import pytest

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        mode = folder.stat().st_mode
        folder.chmod(0o555)
        try:
            yield folder
        finally:
            folder.chmod(mode)
        return
    why = _mount_tmpfs(folder, "ro,size=64k")
    if why:
        pytest.skip("root ignores permission bits, and a read-only mount (root's way to make a folder "
                    f"read-only) is not permitted here: {why}")
    try:
        yield folder
    finally:
        _unmount(folder)
