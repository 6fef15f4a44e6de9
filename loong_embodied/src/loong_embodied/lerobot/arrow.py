"""Arrow columns and schema metadata of LeRobot's parquet files (written by the writer)."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa

IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
_ARROW = {"float32": pa.float32(), "float64": pa.float64(), "int64": pa.int64(), "int32": pa.int32(),
          "bool": pa.bool_(), "uint8": pa.uint8(), "int16": pa.int16()}


def encode_png(image: np.ndarray) -> bytes:
    """``[H, W, 3]`` uint8 as PNG bytes (lossless, so a written frame reads back identical)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(image, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def numeric_column(values: np.ndarray, dtype: str, shape: list[int]) -> pa.Array:
    """``[rows, *shape]`` values as a (nested) fixed-size-list column; scalars when shape is [1]."""
    values = np.ascontiguousarray(values, dtype=np.dtype(dtype))
    if list(shape) == [1]:
        return pa.array(values.reshape(-1), type=_ARROW[dtype])
    array: pa.Array = pa.array(values.reshape(-1), type=_ARROW[dtype])
    for size in reversed(shape):
        array = pa.FixedSizeListArray.from_arrays(array, int(size))
    return array


def image_column(images: list[bytes], first_frame: int = 0) -> pa.Array:
    """Embedded images as LeRobot stores them: ``struct{bytes, path}`` with ``frame-NNNNNN.png``."""
    paths = [f"frame-{first_frame + i:06d}.png" for i in range(len(images))]
    return pa.StructArray.from_arrays([pa.array(images, pa.binary()), pa.array(paths, pa.string())],
                                      fields=list(IMAGE_TYPE))


def hf_features(features: dict) -> bytes:
    """The ``huggingface`` schema metadata (the ``datasets`` library's feature types)."""
    out = {}
    for key, feature in features.items():
        dtype, shape = feature["dtype"], list(feature["shape"])
        if dtype == "video":
            continue
        if dtype == "image":
            out[key] = {"_type": "Image"}
        elif shape == [1]:
            out[key] = {"dtype": dtype, "_type": "Value"}
        else:
            spec: dict = {"dtype": dtype, "_type": "Value"}
            for size in reversed(shape):
                spec = {"feature": spec, "length": int(size), "_type": "List"}
            out[key] = spec
    return json.dumps({"info": {"features": out}}).encode()


def tasks_table(tasks: list[str]) -> pa.Table:
    """``meta/tasks.parquet``: a pandas frame indexed by the task string, as LeRobot writes it."""
    table = pa.table({"task_index": pa.array(range(len(tasks)), pa.int64()),
                      "__index_level_0__": pa.array(tasks, pa.string())})
    pandas_meta = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
                            "metadata": {"encoding": "UTF-8"}}],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
             "metadata": None},
            {"name": None, "field_name": "__index_level_0__", "pandas_type": "unicode", "numpy_type": "object",
             "metadata": None},
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    return table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})
