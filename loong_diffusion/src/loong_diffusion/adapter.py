"""Diffusers directory <-> loong checkpoint, bit-exact both ways, for models of ``DiffusersProvider``.

``hf_to_loong`` writes a weights-only DCP checkpoint (usable as ``trainer.init_from``) with the
diffusers config beside it; ``loong_to_hf`` writes ``config.json`` + safetensors from such a
checkpoint or from any checkpoint of a training run.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

from loong_core.checkpoint import store

DIFFUSERS_CONFIG = "diffusers_config.json"


def source_dtype(hf_dir: str | Path) -> str | None:
    """Name of the torch dtype most of the floating-point bytes of a diffusers directory's
    safetensors use (``bfloat16`` for published checkpoints), or None without safetensors."""
    from safetensors import safe_open

    names = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8}
    counts: dict[str, int] = {}
    for path in sorted(Path(hf_dir).rglob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                piece = f.get_slice(key)
                kind = piece.get_dtype()
                if kind in names:
                    numel = 1
                    for dim in piece.get_shape():
                        numel *= dim
                    counts[kind] = counts.get(kind, 0) + numel * sizes[kind]
    return names[max(counts, key=counts.get)] if counts else None


def _quiet():
    """DCP warns that it runs in a single process when no process group exists: intended here."""
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")


class DiffusersAdapter:
    """Conversion for one diffusers model class (set ``model_class`` in a subclass)."""

    model_class: str = ""

    def _cls(self):
        from loong_diffusion.diffusers_dit import import_class

        return import_class(self.model_class)

    def hf_to_loong(self, hf_dir: str | Path, checkpoint_dir: str | Path) -> Path:
        """Write the diffusers model in ``hf_dir`` as a loong checkpoint directory (atomically), in
        the dtype of its safetensors (a bf16 model stays bf16)."""
        import torch

        from loong_core.engines.torch_native.checkpointing import save_model_only
        from loong_diffusion.diffusers_dit import load_diffusers_dir

        model = load_diffusers_dir(self._cls(), str(hf_dir))
        dtype = source_dtype(hf_dir)
        if dtype:  # the checkpoint keeps the source's dtype; a run loads it into its own (upcast)
            model = model.to(getattr(torch, dtype))
        final = Path(checkpoint_dir)
        partial = final.with_name(final.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        with warnings.catch_warnings():
            _quiet()
            save_model_only(model, str(partial))
        (partial / DIFFUSERS_CONFIG).write_text(json.dumps(dict(model.config), indent=1, default=list))
        record = {"iteration": 0, "converted_from": str(hf_dir), "hf_dtype": dtype}
        store.write_record(partial, record)  # with every file's size and checksum
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        return final

    def loong_to_hf(self, checkpoint_dir: str | Path, hf_dir: str | Path, dtype: str | None = None) -> Path:
        """Write a loong checkpoint's weights as a diffusers directory (``save_pretrained``).

        Args:
            checkpoint_dir: A checkpoint of :meth:`hf_to_loong` or of a training run.
            hf_dir: Output directory.
            dtype: Torch dtype name of the written weights; None: the dtype of the diffusers
                checkpoint it was converted from (recorded at import), else as stored.
        """
        import torch

        from loong_core.engines.torch_native.checkpointing import load_model_only

        checkpoint_dir = Path(checkpoint_dir)
        record = store.verify_checkpoint(checkpoint_dir)  # every file's size and checksum
        dtype = dtype or record.get("hf_dtype")
        converted = checkpoint_dir / DIFFUSERS_CONFIG
        if converted.is_file():
            model = self._cls().from_config(json.loads(converted.read_text()))
            with warnings.catch_warnings():
                _quiet()
                load_model_only(model, str(checkpoint_dir))
        else:
            from loong_diffusion.checkpoint_io import load_trained

            _, _, model = load_trained(checkpoint_dir)
        if dtype:
            model = model.to(getattr(torch, dtype))
        model.save_pretrained(str(hf_dir))
        return Path(hf_dir)
