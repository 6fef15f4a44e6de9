"""Prompt tokens without a downloaded tokenizer: UTF-8 bytes of the instruction and binned state.

Token ids: ``0`` padding, ``1`` beginning of the prompt, ``2 .. 257`` the bytes of the
instruction, then ``state_bins`` ids for the discretised robot state (Pi0.5 writes the state into
the prompt as discrete tokens instead of feeding it to the action expert).
"""

from __future__ import annotations

import torch

PAD_ID, BOS_ID, BYTE_OFFSET = 0, 1, 2
TEXT_VOCAB = BYTE_OFFSET + 256


def vocab_size(state_bins: int = 0) -> int:
    """Embedding rows needed for the text ids and ``state_bins`` state ids."""
    return TEXT_VOCAB + state_bins


def encode_instructions(texts: list[str], max_tokens: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids ``[B, max_tokens]`` (BOS then bytes, truncated) and their validity mask."""
    ids = torch.full((len(texts), max_tokens), PAD_ID, dtype=torch.long)
    for row, text in enumerate(texts):
        tokens = [BOS_ID, *(BYTE_OFFSET + b for b in str(text).encode("utf-8"))][:max_tokens]
        ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    return ids.to(device), (ids != PAD_ID).to(device)


def discretize_state(state: torch.Tensor, bins: int, low: float = -1.0, high: float = 1.0) -> torch.Tensor:
    """State ids ``[B, D]``: each (normalised) value clipped to ``[low, high]`` and cut into ``bins`` bins."""
    scaled = (state.float().clamp(low, high) - low) / (high - low)
    return TEXT_VOCAB + (scaled * bins).long().clamp(0, bins - 1)
