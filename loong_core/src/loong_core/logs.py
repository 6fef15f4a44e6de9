"""Keep the console readable: third-party INFO logs and install-advice warnings are hidden."""

from __future__ import annotations

import logging
import warnings


def quiet_third_party() -> None:
    """Raise megatron-core / torch.distributed loggers to WARNING and drop notices that only say
    TransformerEngine or Apex is absent (expected on CPU; ``loong -v`` shows everything)."""
    for name in ("megatron", "megatron.core", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*Transformer Engine.*")
    warnings.filterwarnings("ignore", message=".*TransformerEngine.*")
    warnings.filterwarnings("ignore", message=".*Apex.*")
    warnings.filterwarnings("ignore", message=".*cuda_graph_scope.*")
