"""Where each tensor of a one-rank (TP1 / PP1) model lives in a torch_dist checkpoint.

A layout maps every local state-dict name of the model (``decoder.layers.3.mlp.linear_fc1.weight``)
to its shape and the pieces it is made of: ``(checkpoint key, global offset, view)``, where the
view is ``(size, stride, storage offset)`` of the piece inside the parameter. It is what
megatron-core's sharded state dict of the model says (:func:`layout_of` reads it from a model on
the meta device), and it is all a reader needs to assemble each parameter from the checkpoint's
chunks, whatever layout the checkpoint was saved at.

``loong convert hf-to-loong`` stores the layout of the model it wrote in the checkpoint
(``loong_layout.json``, listed in the completion record with its checksum like every file), so
``loong convert loong-to-hf`` of such a checkpoint needs neither megatron-core nor a model: it
reads the layout and the checkpoint's own metadata. A checkpoint without the file (one written
by ``loong train``) is read through a meta model built with megatron-core, as before.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from loong_core.errors import CheckpointError

logger = logging.getLogger(__name__)

LAYOUT_FILE = "loong_layout.json"
VERSION = 1
SKIP = ("_extra_state", "local_tokens_per_expert")  # state-dict entries that are not weights


def layout_of(chunk) -> dict:
    """The layout of ``chunk`` (one rank holding the whole model, on the meta device):
    ``{"version", "tensors": {local name: {"shape", "pieces": [[key, offset, size, stride,
    storage offset], ...]}}}`` in state-dict order."""
    import torch

    from loong_llm.hf.stream_checkpoint import sharded_views

    _, views = sharded_views(chunk)
    pieces: dict[str, list] = {}
    for (key, offset), (local, (size, stride, storage_offset)) in views.items():
        pieces.setdefault(local, []).append([key, list(offset), list(size), list(stride),
                                             storage_offset])
    tensors = {}
    for name, tensor in chunk.state_dict(keep_vars=True).items():
        if not torch.is_tensor(tensor) or name.endswith(SKIP):
            continue
        if name not in pieces:
            raise CheckpointError(f"the model's state dict has tensor {name!r}, which its sharded "
                                  f"state dict does not save.")
        tensors[name] = {"shape": list(tensor.shape), "pieces": pieces[name]}
    return {"version": VERSION, "tensors": tensors}


def write_layout(directory: str | Path, layout: dict) -> None:
    """Store ``layout`` in the checkpoint being written at ``directory``."""
    Path(directory, LAYOUT_FILE).write_text(json.dumps(layout, separators=(",", ":")))


def read_layout(directory: str | Path) -> dict | None:
    """The stored layout of a checkpoint, or None when it has none (or one of another version).

    Raises:
        CheckpointError: The file is there but is not a layout.
    """
    path = Path(directory, LAYOUT_FILE)
    if not path.is_file():
        return None
    try:
        layout = json.loads(path.read_text())
        if layout.get("version") != VERSION:
            logger.info("%s has layout version %s (this loong reads %d): reading through a model",
                        path, layout.get("version"), VERSION)
            return None
        for name, entry in layout["tensors"].items():
            if not isinstance(name, str) or not entry["pieces"]:
                raise ValueError(name)
            for key, offset, size, stride, storage_offset in entry["pieces"]:
                if not (isinstance(key, str) and isinstance(storage_offset, int)
                        and len(size) == len(stride) <= len(offset)):
                    raise ValueError(key)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{path} is not a tensor layout ({type(exc).__name__}: {exc}); the "
                              f"checkpoint is damaged: write it again.") from None
    return layout
