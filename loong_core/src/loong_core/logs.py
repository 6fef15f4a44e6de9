"""Keep the console readable: third-party INFO logs and install-advice warnings are hidden."""

from __future__ import annotations

import logging
import os
import warnings

#: Modules whose warnings are shown at most once per run (by rank 0 only).
THIRD_PARTY = r"(megatron|torch|transformers|diffusers|tokenizers|tensorboard)(\.|$)"


def quiet_third_party() -> None:
    """Raise megatron-core / torch.distributed loggers to WARNING, show each third-party warning
    at most once per run (on rank 0; other ranks would repeat it), and drop notices a user cannot
    act on: TransformerEngine or Apex absent (expected on CPU), torch's deprecation of the
    ``load_state_dict`` that megatron-core calls on every checkpoint load. ``loong -v`` shows
    everything."""
    for name in ("megatron", "megatron.core", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if os.environ.get("RANK", "0") not in ("", "0"):
        warnings.filterwarnings("ignore", module=THIRD_PARTY)
    else:
        warnings.filterwarnings("once", category=UserWarning, module=THIRD_PARTY)
    warnings.filterwarnings("ignore", message=".*`load_state_dict` is deprecated.*")
    warnings.filterwarnings("ignore", message=".*Transformer Engine.*")
    warnings.filterwarnings("ignore", message=".*TransformerEngine.*")
    warnings.filterwarnings("ignore", message=".*Apex.*")
    warnings.filterwarnings("ignore", message=".*cuda_graph_scope.*")
