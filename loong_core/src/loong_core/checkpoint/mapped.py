"""Tensors of ``torch.save`` records that sit inside a larger file (the chunks of a
torch.distributed.checkpoint ``.distcp`` file), mapped from the file instead of read into new
memory.

:func:`map_torch_tensor` reads the record's structure with ``torch.load(weights_only=True)``
under ``torch.serialization.skip_data`` (no storage bytes are read; nothing but tensors and
plain data is built, as for every checkpoint file, see :mod:`loong_core.checkpoint.restricted`),
then maps the bytes of its one storage record (a private copy-on-write mapping, unmapped when the
tensor is freed) and views them with the saved shape, strides and offset. On a VM whose fresh
anonymous memory is slow to touch, this halves the time to read a checkpoint. Anything it does
not recognise (more than one storage, a size that does not add up, an older torch) gives None,
and the caller reads the record the ordinary way.
"""

from __future__ import annotations

import io
import logging
import mmap
import os

import torch

from loong_core.checkpoint.restricted import load_torch_file
from loong_core.errors import CheckpointError

logger = logging.getLogger(__name__)


class FileRange(io.RawIOBase):
    """Bytes ``[offset, offset + length)`` of an open file, as a seekable file of their own."""

    def __init__(self, handle, offset: int, length: int):
        super().__init__()
        self.handle, self.start, self.length, self.pos = handle, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = min(max(base + offset, 0), self.length)
        return self.pos

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        size = min(len(view), self.length - self.pos)
        if size <= 0:
            return 0
        got = os.preadv(self.handle.fileno(), [view[:size]], self.start + self.pos)
        if got < size and got <= 0:
            raise CheckpointError(f"{self.handle.name} is truncated.")
        self.pos += got
        return got


def map_torch_tensor(handle, offset: int, length: int, name: str) -> torch.Tensor | None:
    """The tensor ``torch.save`` wrote at ``[offset, offset + length)`` of the open file
    ``handle``, its data mapped from the file; None when the record is not one plain tensor.

    Args:
        handle: The file, open for reading in binary mode.
        offset: Start of the ``torch.save`` record in the file.
        length: Its length.
        name: What to call it in errors.

    Raises:
        CheckpointError: The record holds anything but tensors and plain data, or lies past the
            end of the file.
    """
    skip_data = getattr(torch.serialization, "skip_data", None)
    if skip_data is None:
        return None
    if os.fstat(handle.fileno()).st_size < offset + length:  # a mapping past the end faults
        raise CheckpointError(f"{name} is truncated (a record ends past the end of the file).")
    with skip_data():  # the structure only: no storage bytes are read
        shell = load_torch_file(FileRange(handle, offset, length), name)
    if not torch.is_tensor(shell) or shell.layout != torch.strided:
        return None
    nbytes = shell.untyped_storage().nbytes()
    try:
        records = torch._C.PyTorchFileReader(FileRange(handle, offset, length))
        storages = [r for r in records.get_all_records() if r.startswith("data/")]
        if storages != ["data/0"] or records.get_record_size("data/0") != nbytes:
            return None
        start = offset + records.get_record_offset("data/0")
    except (AttributeError, RuntimeError):
        return None
    if nbytes == 0 or start + nbytes > offset + length or nbytes % shell.element_size():
        return None
    base = start - start % mmap.ALLOCATIONGRANULARITY
    mapped = mmap.mmap(handle.fileno(), start + nbytes - base, offset=base, access=mmap.ACCESS_COPY)
    data = torch.frombuffer(mapped, dtype=torch.uint8, count=nbytes, offset=start - base)
    # as_strided checks that the view stays inside the storage
    return data.view(shell.dtype).as_strided(shell.shape, shell.stride(), shell.storage_offset())
