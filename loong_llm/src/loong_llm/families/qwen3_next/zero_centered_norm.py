"""RMSNorm with a zero-centred weight (Qwen3-Next): ``norm(x) * (1 + weight)``, weight stored as
the checkpoint stores it (zeros at initialisation), computed through ``kernels.get("rms_norm")``."""

from __future__ import annotations

import torch

from loong_core import kernels


class ZeroCenteredRMSNorm(torch.nn.Module):
    """Takes megatron-core's norm constructor arguments (a drop-in for the spec's RMSNorm)."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-6, persist_layer_norm: bool = False,
                 zero_centered_gamma: bool = True, normalization: str = "RMSNorm"):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = bool(config.sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.get("rms_norm")(x, 1.0 + self.weight.float(), self.eps)
