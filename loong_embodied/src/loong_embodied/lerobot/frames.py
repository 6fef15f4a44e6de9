"""Frame tables: the ``data/`` parquet files as numpy columns plus lazily decoded images."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from loong_embodied.lerobot.format import LeRobotFormatError, LeRobotInfo
from loong_embodied.lerobot.meta import Episodes

logger = logging.getLogger(__name__)


def column_to_numpy(column: pa.ChunkedArray | pa.Array, shape: list[int] | tuple[int, ...]) -> np.ndarray:
    """A (nested) list column of numbers as one ``[rows, *shape]`` array (zero-copy where possible)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    rows = len(array)
    while pa.types.is_list(array.type) or pa.types.is_large_list(array.type) or \
            pa.types.is_fixed_size_list(array.type):
        array = array.flatten()
    values = array.to_numpy(zero_copy_only=False)
    if shape in ([1], (1,)) and values.size == rows:
        return values.reshape(rows)
    return values.reshape(rows, *shape)


def decode_image(data: bytes | None, path: str | None, root: Path) -> np.ndarray:
    """One image (``struct{bytes, path}`` cell) as ``[H, W, 3]`` uint8."""
    from PIL import Image

    if data is not None:
        source = io.BytesIO(data)
    elif path:
        candidate = Path(path)
        source = candidate if candidate.is_absolute() else root / candidate
        if not Path(source).is_file():
            raise LeRobotFormatError(f"image file '{path}' (relative to {root}) does not exist")
    else:
        raise LeRobotFormatError("an image cell has neither bytes nor a path")
    with Image.open(source) as image:
        return np.asarray(image.convert("RGB"))


class FrameTable:
    """All frames of a dataset, ordered by their global ``index``.

    Numeric features are numpy arrays ``[frames, *shape]``; image features stay encoded and are
    decoded per frame by :meth:`image`; video features are not in the table (see
    :mod:`loong_embodied.lerobot.video`).

    Args:
        info: The dataset's ``info.json``.
        episodes: Its episode table (which files to read).
    """

    def __init__(self, info: LeRobotInfo, episodes: Episodes):
        self.info = info
        files = []
        for chunk, file, episode in episodes.data_files:
            path = info.data_file(chunk, file, episode)
            if path not in files:
                files.append(path)
        missing = [str(p) for p in files if not p.is_file()]
        if missing:
            raise LeRobotFormatError(f"frame files listed by the episode table are missing: {missing[:3]}")
        table = pa.concat_tables([pq.read_table(p, memory_map=True) for p in files], promote_options="default")
        index = table.column("index").to_numpy()
        if np.any(np.diff(index) < 0):
            table = table.take(pa.array(np.argsort(index, kind="stable")))
            index = table.column("index").to_numpy()
        self.index = index
        self.columns: dict[str, np.ndarray] = {}
        self.images: dict[str, tuple[pa.Array, pa.Array]] = {}
        for name in table.column_names:
            feature = info.features.get(name, {})
            dtype = feature.get("dtype")
            if dtype == "image" or pa.types.is_struct(table.schema.field(name).type):
                cells = table.column(name).combine_chunks()
                self.images[name] = (cells.field("bytes"), cells.field("path"))
            elif dtype in ("string",) or pa.types.is_string(table.schema.field(name).type):
                self.columns[name] = np.asarray(table.column(name).to_pylist(), dtype=object)
            elif dtype != "video":
                self.columns[name] = column_to_numpy(table.column(name), feature.get("shape", [1]))
        logger.debug("read %d frames from %d files of %s", len(index), len(files), info.root)

    def __len__(self) -> int:
        return len(self.index)

    def row_of(self, global_index: np.ndarray | int) -> np.ndarray:
        """Row positions of global frame indices (``index`` column values)."""
        return np.searchsorted(self.index, global_index)

    def image(self, key: str, row: int) -> np.ndarray:
        """Decoded image ``[H, W, 3]`` uint8 of feature ``key`` at table row ``row``."""
        data, path = self.images[key]
        return decode_image(data[row].as_py(), path[row].as_py(), self.info.root)
