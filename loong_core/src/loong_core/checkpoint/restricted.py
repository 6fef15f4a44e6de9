"""Reading checkpoint files without running code planted in them.

A checkpoint directory may come from anyone (a download, a shared drive), and Python's pickle runs
whatever a file tells it to. Every file of a loong checkpoint is therefore read through one of:

- :func:`load_torch_file` for ``torch.save`` files (RNG state, common state, the torch engine's
  schedule): ``torch.load(weights_only=True)``, which builds only tensors and plain containers,
  plus the numpy array classes that RNG state holds.
- :class:`RestrictedFileSystemReader` for ``torch.distributed.checkpoint``'s ``.metadata`` file, a
  pickle that torch reads with plain ``pickle.load``: a restricted unpickler that builds only the
  DCP metadata classes, ``torch.Size`` and dtypes.
- The load planners of :func:`dcp_load` / :func:`mcore_load`, for the non-tensor entries of the
  ``.distcp`` shards (``_extra_state``, optimizer hyper-parameters), which torch's default planner
  reads with ``torch.load(weights_only=False)``: ``weights_only=True`` instead.

Anything else raises :class:`~loong_core.errors.CheckpointError` naming the file. torch's
``CheckpointException`` (a ``BaseException``) is turned into a ``CheckpointError`` as well.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import pickle
import re
from pathlib import Path

import torch

from loong_core.errors import CheckpointError

_DCP = "torch.distributed.checkpoint"
_METADATA_CLASSES = {
    f"{_DCP}.metadata": {"Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                         "ChunkStorageMetadata", "TensorProperties", "MetadataIndex", "StorageMeta",
                         "_MEM_FORMAT_ENCODING"},
    f"{_DCP}.filesystem": {"_StorageInfo"},
    f"{_DCP}.planner": {"SavePlan", "LoadPlan", "WriteItem", "WriteItemType", "ReadItem",
                        "LoadItemType", "TensorWriteData"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "collections": {"OrderedDict"},
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},  # checkpoint_id
    "builtins": {"set", "frozenset"},
}

_TRUST_NOTE = ("loong does not unpickle such content because it can run code. loong writes only "
               "tensors and plain data into checkpoints, so the file was altered or written by "
               "another tool; use a checkpoint from a source you trust, or write it again with loong.")


class UnsafeFileError(CheckpointError):
    """A checkpoint file holds something other than the data a checkpoint legitimately holds.

    Args:
        file: The file (relative to the checkpoint directory where only that is known).
        detail: What was found.
    """

    def __init__(self, file: str | Path, detail: str):
        self.file, self.detail = str(file), detail
        super().__init__(f"{file}: {detail}. {_TRUST_NOTE}")

    def __reduce__(self):  # torch.distributed pickles errors between ranks
        return type(self), (self.file, self.detail)


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only the classes a DCP ``.metadata`` file legitimately holds."""

    def find_class(self, module: str, name: str):
        if name in _METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"it references {module}.{name}, which checkpoint metadata never holds")


def read_metadata_file(path: str | Path):
    """The ``torch.distributed.checkpoint.metadata.Metadata`` stored in ``path``.

    Raises:
        CheckpointError: The file is missing, truncated, or references anything else.
    """
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            return _MetadataUnpickler(handle).load()
    except pickle.UnpicklingError as exc:
        raise UnsafeFileError(path, str(exc)) from None
    except (OSError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{path} is missing or unreadable ({type(exc).__name__}: {exc}); the "
                              "checkpoint is incomplete or damaged.") from None


def _numpy_array_globals() -> list:
    import numpy as np

    core = importlib.import_module("numpy._core.multiarray" if hasattr(np, "_core") else "numpy.core.multiarray")
    return [core._reconstruct, np.ndarray, np.dtype, *{type(np.dtype(t)) for t in ("uint32", "float64", "int64")}]


def load_torch_file(source, name: str | Path | None = None):
    """``torch.load(weights_only=True)`` of a file or buffer, numpy arrays allowed.

    Args:
        source: A path or a binary buffer.
        name: What to call the source in errors (default: the path).

    Raises:
        CheckpointError: Naming the file, when it holds anything else or cannot be read.
    """
    name = name if name is not None else source
    try:
        with torch.serialization.safe_globals(_numpy_array_globals()):
            return torch.load(source, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        what = f"it references {found.group(1)}" if found else str(exc).strip().splitlines()[-1][:200]
        raise UnsafeFileError(name, f"holds objects other than tensors and plain data ({what})") from None
    except (OSError, EOFError, RuntimeError, ValueError) as exc:
        raise CheckpointError(f"{name} is missing or unreadable ({type(exc).__name__}: {exc}); the "
                              "checkpoint is incomplete or damaged.") from None


def _file_of(planner, read_item) -> str:
    storage = getattr(getattr(planner, "metadata", None), "storage_data", None) or {}
    info = storage.get(read_item.storage_index)
    return info.relative_path if info is not None else f"entry {read_item.dest_index.fqn}"


class RestrictedBytesMixin:
    """Load-planner mixin: non-tensor entries of the shards load with ``weights_only=True``."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        obj = load_torch_file(value, f"{_file_of(self, read_item)} ({read_item.dest_index.fqn})")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def _reader_class():
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class RestrictedFileSystemReader(FileSystemReader):
        """DCP reader whose ``.metadata`` goes through the restricted unpickler (read once)."""

        _metadata = None

        def read_metadata(self, *args, **kwargs):
            if self._metadata is None:
                metadata = read_metadata_file(Path(self.path) / ".metadata")
                if getattr(metadata, "storage_meta", None) is None:
                    metadata.storage_meta = StorageMeta()
                self._metadata = metadata
            self._metadata.storage_meta.load_id = self.load_id
            return self._metadata

    return RestrictedFileSystemReader


def restricted_reader(directory: str | Path):
    """A ``FileSystemReader`` of ``directory`` that reads its metadata safely."""
    return _reader_class()(str(directory))


def _first_checkpoint_error(exc: BaseException) -> BaseException | None:
    for failure in getattr(exc, "failures", {}).values():
        inner = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(inner, CheckpointError):
            return inner
    return None


@contextlib.contextmanager
def checkpoint_errors(directory: str | Path):
    """Turn what reading ``directory`` raises into one :class:`CheckpointError` naming the file.

    torch's ``CheckpointException`` derives from ``BaseException`` and wraps each rank's error;
    the first loong error inside it is re-raised with the directory in front of the file name.
    """
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except UnsafeFileError as exc:
        file = exc.file if Path(exc.file).is_absolute() else Path(directory) / exc.file
        raise UnsafeFileError(file, exc.detail) from None
    except CheckpointError:
        raise
    except CheckpointException as exc:
        inner = _first_checkpoint_error(exc)
        if isinstance(inner, UnsafeFileError):
            file = inner.file if Path(inner.file).is_absolute() else Path(directory) / inner.file
            raise UnsafeFileError(file, inner.detail) from None
        if inner is not None:
            raise CheckpointError(f"{directory}: {inner}") from None
        failures = [f[0] if isinstance(f, tuple) else f for f in exc.failures.values()]
        detail = "; ".join(f"{type(f).__name__}: {f}" for f in failures[:2]) or str(exc)
        raise CheckpointError(f"could not read checkpoint {directory} ({detail}); it is incomplete "
                              "or damaged.") from None


def dcp_load(state: dict, directory: str | Path) -> None:
    """``torch.distributed.checkpoint.load`` of ``state`` from ``directory``, restricted."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    planner = type("RestrictedLoadPlanner", (RestrictedBytesMixin, DefaultLoadPlanner), {})()
    with checkpoint_errors(directory):
        read_metadata_file(Path(directory) / ".metadata")  # DCP would hide this error in its own
        dcp.load(state, storage_reader=restricted_reader(directory), planner=planner)


@contextlib.contextmanager
def _megatron_restricted():
    """megatron-core's torch_dist strategy with the restricted reader and planner swapped in."""
    from megatron.core.dist_checkpointing.strategies import torch as strategy

    reader, planner = strategy._get_filesystem_reader, strategy.MCoreLoadPlanner
    strategy._get_filesystem_reader = lambda checkpoint_dir, cache_metadata=False: restricted_reader(checkpoint_dir)
    strategy.MCoreLoadPlanner = type("RestrictedMCoreLoadPlanner", (RestrictedBytesMixin, planner), {})
    try:
        yield
    finally:
        strategy._get_filesystem_reader, strategy.MCoreLoadPlanner = reader, planner


def _common_strategy():
    from megatron.core.dist_checkpointing.strategies.common import COMMON_STATE_FNAME, TorchCommonLoadStrategy

    class RestrictedCommonLoadStrategy(TorchCommonLoadStrategy):
        """``common.pt`` through :func:`load_torch_file`."""

        def load_common(self, checkpoint_dir):
            return load_torch_file(Path(checkpoint_dir) / COMMON_STATE_FNAME)

    return RestrictedCommonLoadStrategy()


def mcore_load(sharded_state: dict, directory: str | Path) -> dict:
    """``megatron.core.dist_checkpointing.load``, restricted; returns the loaded state."""
    from megatron.core import dist_checkpointing

    with checkpoint_errors(directory), _megatron_restricted():
        read_metadata_file(Path(directory) / ".metadata")  # DCP would hide this error in its own
        return dist_checkpointing.load(sharded_state, str(directory), common_strategy=_common_strategy())


def mcore_tensors_metadata(directory: str | Path) -> dict:
    """``dist_checkpointing.load_tensors_metadata`` (global shapes by key), restricted."""
    from megatron.core import dist_checkpointing

    with checkpoint_errors(directory), _megatron_restricted():
        return dist_checkpointing.load_tensors_metadata(str(directory))
