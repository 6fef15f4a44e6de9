"""The non-weight files of an exported HF directory: tokenizer, tokenizer config, generation
config, so that ``transformers`` loads model *and* tokenizer from the folder alone."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth")
#: Special tokens loong's trained tokenizers use, by role (first one present wins).
_ROLES = {"eos_token": ("<|endoftext|>", "<|im_end|>", "</s>", "<eos>"),
          "pad_token": ("<|pad|>", "<pad>"), "bos_token": ("<s>", "<bos>")}


def run_tokenizer_dir(checkpoint: Path) -> Path | None:
    """``RUN/data/tokenizer`` of the run that wrote ``checkpoint`` (``RUN/checkpoints/iter_N``),
    where training copied its data's tokenizer; None when there is none."""
    folder = Path(checkpoint).parent.parent / "data" / "tokenizer"
    return folder if (folder / "tokenizer.json").is_file() else None


def file_mode() -> int:
    """Mode of a new regular file under the current umask (``0o666 & ~umask``)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_support_files(dst: Path, sources: list[Path | None], max_positions: int | None) -> list[str]:
    """Copy tokenizer / generation files from the first sources that have them, then add the
    ``tokenizer_config.json`` and ``generation_config.json`` that are still missing.

    Args:
        dst: The exported HF directory (weights and config.json already written).
        sources: Folders to copy non-weight files from, in order (HF source files, the run's
            tokenizer); None entries are skipped. A file already in ``dst`` is kept.
        max_positions: The model's ``max_position_embeddings`` (``model_max_length``).

    Returns:
        Names of the files written.
    """
    written = []
    for source in (s for s in sources if s is not None and Path(s).is_dir()):
        for path in Path(source).iterdir():
            target = dst / path.name
            if (path.is_file() and not path.name.endswith(_WEIGHTS) and not target.exists()
                    and path.name not in ("config.json", "model.safetensors.index.json")):
                shutil.copyfile(path, target)
                written.append(path.name)
    tokenizer = dst / "tokenizer.json"
    if not tokenizer.is_file():
        logger.warning("%s has no tokenizer.json (neither the source nor the run had one): "
                       "transformers will load the model but not a tokenizer", dst)
        return written
    vocab = _added_tokens(tokenizer)
    roles = {role: next((t for t in names if t in vocab), None) for role, names in _ROLES.items()}
    if not (dst / "tokenizer_config.json").exists():
        config = {"tokenizer_class": "PreTrainedTokenizerFast",
                  **{role: token for role, token in roles.items() if token}}
        if max_positions:
            config["model_max_length"] = max_positions
        (dst / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        written.append("tokenizer_config.json")
    if not (dst / "generation_config.json").exists():
        ids = {f"{role[:-6]}_token_id": vocab[token] for role, token in roles.items() if token}
        (dst / "generation_config.json").write_text(json.dumps(ids, indent=2) + "\n")
        written.append("generation_config.json")
    return written


def _added_tokens(tokenizer_json: Path) -> dict[str, int]:
    """Special (added) tokens of a ``tokenizers`` JSON file: ``content -> id``."""
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    return {t["content"]: t["id"] for t in data.get("added_tokens", [])}


def apply_umask(directory: Path) -> None:
    """Give every file of ``directory`` the mode the umask gives (safetensors writes 0600)."""
    mode = file_mode()
    for path in Path(directory).iterdir():
        if path.is_file():
            os.chmod(path, mode)
