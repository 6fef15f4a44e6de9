"""A megatron-core dist-checkpoint written and read one tensor at a time, from a model on the
meta device.

The checkpoint's structure (keys, global shapes, chunks, the layer / expert axes, the SwiGLU
split, ``_extra_state`` objects, ``common.pt`` and ``metadata.json``) is megatron-core's own: the
sharded state dict of a model built on the meta device goes through megatron-core's save
preprocessing and its torch_dist translation, and torch.distributed.checkpoint writes it. Only the
data differ from a normal save: each chunk is made when the writer reaches it (from a callable
such as :meth:`loong_llm.hf.load.HFParts.part`) and dropped once written, so a conversion never
holds more than a tensor or two. Reading goes the other way: each parameter of the meta model is
assembled from the chunks that cover it.

This is the format ``loong train`` resumes from (``trainer.init_from`` / ``trainer.resume``) and
the one ``MegatronEngine.save_checkpoint`` writes; a loading model of another dtype casts on load
(a bf16 checkpoint loads into an fp32 run as its fp32 values).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

import torch

from loong_core.errors import CheckpointError

logger = logging.getLogger(__name__)

_SKIP = ("_extra_state", "local_tokens_per_expert")


def build_meta_model(provider, parallel_config, dtype: torch.dtype):
    """The provider's model chunk of this rank on the meta device (no memory), parameters in
    ``dtype``. Needs ``parallel.initialize`` first; one rank only (tensor, pipeline and expert
    parallel sizes 1).

    Nothing is initialised: a meta tensor holds no values, and megatron-core's initialisation
    on the meta device runs torch's Python reference ops, whose first call imports dynamo (about
    0.8 s of a 4 s conversion). What megatron-core sets only while initialising is the
    parameters' TP attributes, which a single rank does not need (every part is whole).
    """
    from megatron.core import parallel_state as ps

    from loong_core.engines.megatron import parallel

    sizes = (parallel_config.tensor_model_parallel_size, parallel_config.pipeline_model_parallel_size,
             parallel_config.expert_model_parallel_size)
    if sizes != (1, 1, 1):
        raise ValueError(f"build_meta_model builds one rank's whole model, not TP/PP/EP {sizes}")
    mcfg = provider.megatron_config(parallel.transformer_kwargs(parallel_config))
    mcfg.params_dtype = dtype
    mcfg.perform_initialization = False
    with torch.device("meta"):
        chunk = provider.build_megatron_model(mcfg, ps.is_pipeline_first_stage(),
                                              ps.is_pipeline_last_stage(), None)
    real = [n for n, t in chunk.state_dict(keep_vars=True).items()
            if torch.is_tensor(t) and not t.is_meta and not n.endswith(_SKIP)]
    if real:
        logger.debug("tensors built off the meta device (small buffers): %s", real)
    return chunk


def _view(data: torch.Tensor) -> tuple:
    return tuple(data.size()), tuple(data.stride()), data.storage_offset()


def sharded_views(chunk) -> tuple[dict, dict]:
    """``(sharded state dict with factories applied, {(key, global offset): (local name, view)})``.

    ``view`` is ``(size, stride, storage offset)`` of the chunk's data inside its parameter, so
    the same view of a real tensor of the parameter's shape is that chunk's data.
    """
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    sharded = chunk.sharded_state_dict()
    views = {}
    for local, value in list(sharded.items()):
        if isinstance(value, ShardedTensorFactory):
            value = sharded[local] = value.build()
        for st in nested_values(value) if isinstance(value, (dict, list)) else [value]:
            if isinstance(st, ShardedTensor):
                if st.flattened_range is not None:
                    raise CheckpointError(f"{local}: flattened model tensors are not supported by "
                                          f"the streaming converter.")
                views[(st.key, tuple(st.global_offset))] = (local, _view(st.data))
    return sharded, views


def _make_planner(views: dict, produce: Callable[[str], torch.Tensor], dtypes: dict):
    from megatron.core.dist_checkpointing.strategies.torch import MCoreSavePlanner
    from torch.distributed.checkpoint.planner import WriteItemType

    uses: dict[str, int] = {}
    for local, _ in views.values():
        uses[local] = uses.get(local, 0) + 1

    class StreamingPlanner(MCoreSavePlanner):
        """megatron-core's save planner whose tensor data are made on demand."""

        cache: dict[str, torch.Tensor] = {}

        def resolve_data(self, write_item):
            if write_item.type == WriteItemType.BYTE_IO:
                return super().resolve_data(write_item)
            key = (write_item.index.fqn, tuple(write_item.index.offset))
            local, (size, stride, offset) = views[key]
            tensor = self.cache.get(local)
            if tensor is None:
                tensor = produce(local).to(dtypes[local]).contiguous()
                if uses[local] > 1:
                    self.cache[local] = tensor
            uses[local] -= 1
            if uses[local] == 0:
                self.cache.pop(local, None)
            # a view: the writer copies it out when it is part of a larger tensor
            return tensor.as_strided(size, stride, offset).reshape(tuple(write_item.tensor_data.chunk.sizes))

    return StreamingPlanner(dedup_replicated_tensors=False, flatten_state_dict=False)


def _hashing_writer(directory: Path):
    """A DCP ``FileSystemWriter`` whose ``.distcp`` files are CRC-32'd as they are written
    (``writer.hashed``: relative path -> ``{"size", "crc32"}``, for the completion record)."""
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import FileSystem

    from loong_core.checkpoint.integrity import HashingStream

    hashed: dict[str, dict] = {}

    class HashingFileSystem(FileSystem):
        @contextlib.contextmanager
        def create_stream(self, path, mode):
            with super().create_stream(path, mode) as stream:
                if mode != "wb" or not str(path).endswith(".distcp"):
                    yield stream
                    return
                hashing = HashingStream(stream)
                yield hashing
            if hashing.entry is not None:
                hashed[Path(path).relative_to(directory).as_posix()] = hashing.entry

    # No fsync per file: the completion record's CRC-32 of every file (checked before any load)
    # catches a file a crash left incomplete, and a conversion is simply run again.
    writer = FileSystemWriter(str(directory), single_file_per_rank=True, thread_count=1,
                              sync_files=False)
    writer.fs = HashingFileSystem()
    writer.hashed = hashed
    return writer


@contextlib.contextmanager
def _no_record_crc():
    """``torch.save`` without the CRC-32 of each zip record (a third of its time on a large
    tensor): the completion record's CRC-32 of the whole file, computed as it is written,
    covers the same bytes, and ``torch.load`` does not check the record's."""
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(before)


def save_streaming(chunk, produce: Callable[[str], torch.Tensor], directory: str | Path,
                   common_state: dict) -> dict[str, dict]:
    """Write ``{"model": chunk's sharded state dict, "loong": common_state}`` to ``directory`` as
    a torch_dist checkpoint, taking each parameter's data from ``produce(local name)``.

    Args:
        chunk: The model chunk (on the meta device).
        produce: Local state-dict name -> the full tensor of that parameter (any dtype: cast to
            the parameter's).
        directory: Target directory (created).
        common_state: Plain data stored as the ``loong`` entry (iteration, ...).

    Returns:
        ``{relative path: {"size", "crc32"}}`` of the data files, hashed while written (for
        :func:`loong_core.checkpoint.store.save_collective`).
    """
    import torch.distributed.checkpoint as dcp
    from megatron.core.dist_checkpointing.core import CheckpointingConfig, save_config
    from megatron.core.dist_checkpointing.serialization import get_default_save_common_strategy
    from megatron.core.dist_checkpointing.state_dict_utils import save_preprocess
    from megatron.core.dist_checkpointing.strategies.torch import (
        _replace_state_dict_keys_with_sharded_keys,
        mcore_to_pyt_state_dict,
    )

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model, views = sharded_views(chunk)
    params = chunk.state_dict(keep_vars=True)
    dtypes = {local: params[local].dtype for local, _ in views.values()}
    sharded_part, common = save_preprocess({"model": model, "loong": common_state}, True)
    get_default_save_common_strategy().save_common(common, directory)
    sharded_part, _, _ = _replace_state_dict_keys_with_sharded_keys(sharded_part, False)
    pyt_state = mcore_to_pyt_state_dict(sharded_part, False)
    writer = _hashing_writer(directory)
    with _no_record_crc():
        dcp.save(pyt_state, storage_writer=writer, planner=_make_planner(views, produce, dtypes))
    save_config(CheckpointingConfig("torch_dist", 1), str(directory))
    return writer.hashed


class CheckpointTensors:
    """Regions of the tensors of a torch_dist checkpoint, read chunk by chunk (no model).

    Args:
        directory: The checkpoint directory (its ``.metadata`` is read with loong's restricted
            unpickler; every chunk with ``torch.load(weights_only=True)``).
    """

    def __init__(self, directory: str | Path):
        from loong_core.checkpoint.restricted import read_metadata_file

        self.dir = Path(directory)
        self.metadata = read_metadata_file(self.dir / ".metadata")

    def dtype(self, key: str) -> torch.dtype:
        """Stored dtype of tensor ``key``."""
        return self._meta(key).properties.dtype

    def _meta(self, key: str):
        try:
            return self.metadata.state_dict_metadata[key]
        except KeyError:
            raise CheckpointError(f"{self.dir} has no tensor {key!r} (a checkpoint of another "
                                  f"model?).") from None

    def _chunk(self, key: str, chunk) -> torch.Tensor:
        from torch.distributed.checkpoint.metadata import MetadataIndex

        from loong_core.checkpoint.mapped import FileRange, map_torch_tensor
        from loong_core.checkpoint.restricted import load_torch_file

        info = self.metadata.storage_data[MetadataIndex(key, torch.Size(chunk.offsets))]
        if getattr(info, "transform_descriptors", None):
            raise CheckpointError(f"{self.dir}/{info.relative_path}: chunk of {key!r} is stored "
                                  f"with transforms {info.transform_descriptors}, not supported.")
        with open(self.dir / info.relative_path, "rb") as handle:
            mapped = map_torch_tensor(handle, info.offset, info.length, info.relative_path)
            if mapped is not None:
                return mapped
            # torch.load reads the chunk's record straight into its tensor (one copy)
            return load_torch_file(FileRange(handle, info.offset, info.length), info.relative_path)

    def read(self, key: str, offsets: tuple, shape: tuple) -> torch.Tensor:
        """The region of ``key`` at ``offsets`` of ``shape`` (the stored chunk itself, no copy,
        when the region is one whole chunk)."""
        for chunk in self._meta(key).chunks:
            if tuple(chunk.offsets) == tuple(offsets) and tuple(chunk.sizes) == tuple(shape):
                return self._chunk(key, chunk)
        out = torch.empty(shape, dtype=self.dtype(key))
        self.read_into(key, offsets, out)
        return out

    def read_into(self, key: str, offsets: tuple, out: torch.Tensor) -> None:
        """Fill ``out`` with the region of ``key`` that starts at ``offsets`` (``out``'s shape)."""
        meta = self._meta(key)
        covered = 0
        for chunk in meta.chunks:
            lo = [max(a, b) for a, b in zip(offsets, chunk.offsets)]
            hi = [min(a + n, b + m) for a, n, b, m in zip(offsets, out.shape, chunk.offsets, chunk.sizes)]
            if any(h <= low for low, h in zip(lo, hi)):
                continue
            data = self._chunk(key, chunk)
            src, dst = data, out
            for dim, (low, h) in enumerate(zip(lo, hi)):
                src = src.narrow(dim, low - chunk.offsets[dim], h - low)
                dst = dst.narrow(dim, low - offsets[dim], h - low)
            dst.copy_(src)
            count = 1
            for low, h in zip(lo, hi):
                count *= h - low
            covered += count
        if covered != out.numel():
            raise CheckpointError(f"{self.dir}: the chunks of {key!r} cover {covered} of the "
                                  f"{out.numel()} values of the region at {tuple(offsets)}.")

    def close(self) -> None:
        """Nothing stays open between reads (kept for symmetry with the readers)."""


class StreamedState:
    """The full state dict of a TP1 / PP1 model, each tensor read from a checkpoint when asked
    for (a read-only mapping: local name -> tensor in the stored dtype).

    Args:
        layout: The model's :mod:`~loong_llm.hf.layout` (from a meta model with
            :func:`~loong_llm.hf.layout.layout_of`, or the one stored in the checkpoint).
        directory: A torch_dist checkpoint of that model (any layout it was saved at).
    """

    def __init__(self, layout: dict, directory: str | Path):
        self.reader = CheckpointTensors(directory)
        self.pieces = {name: [(key, tuple(offset), (tuple(size), tuple(stride), storage_offset))
                              for key, offset, size, stride, storage_offset in entry["pieces"]]
                       for name, entry in layout["tensors"].items()}
        self.shapes = {name: torch.Size(entry["shape"]) for name, entry in layout["tensors"].items()}

    def __iter__(self):
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)

    def meta(self, name: str) -> torch.Tensor:
        """A meta tensor of ``name``'s shape and stored dtype."""
        key = self.pieces[name][0][0]
        return torch.empty(self.shapes[name], dtype=self.reader.dtype(key), device="meta")

    def __getitem__(self, name: str) -> torch.Tensor:
        pieces = self.pieces[name]
        shape = tuple(self.shapes[name])
        if len(pieces) == 1 and pieces[0][2][0] == shape and pieces[0][2][2] == 0:
            key, offset, _ = pieces[0]  # the whole parameter: no assembly
            return self.reader.read(key, offset, (1,) * (len(offset) - len(shape)) + shape).reshape(shape)
        out = torch.empty(shape, dtype=self.reader.dtype(pieces[0][0]))
        filled = 0
        for key, offset, (size, stride, storage_offset) in pieces:
            view = out.as_strided(size, stride, storage_offset)
            region = self.reader.read(key, offset, self._region_shape(key, offset, view))
            view.copy_(region.reshape(view.shape))
            del region
            filled += view.numel()
        if filled != out.numel():
            raise CheckpointError(f"{name}: its checkpoint pieces cover {filled} of {out.numel()} values.")
        return out

    def _region_shape(self, key: str, offset: tuple, view: torch.Tensor) -> tuple:
        """The view's shape with the prepended (layer / expert) axes of ``key`` as size-1 dims."""
        extra = len(offset) - view.dim()
        return (1,) * extra + tuple(view.shape)

    def close(self) -> None:
        """Close the checkpoint files."""
        self.reader.close()
