"""GR00T's embodiment-specific layers: one weight matrix per embodiment, picked by each sample's id.

GR00T trains one action head for many robots: its state encoder, action encoder and action
decoder hold a linear layer per embodiment (``CategorySpecificLinear``), and each sample goes
through its robot's. LeRobot gathers a ``[B, in, out]`` weight per sample and runs a batched
matmul (and scatters the gradients back), even when every sample is the same robot. Here a
batch is grouped once per forward (:class:`EmbodimentGroups`): a batch of one embodiment runs one
plain matmul, a mixed batch one matmul per embodiment present.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from loong_core.errors import ConfigError


class EmbodimentGroups:
    """The samples of a batch grouped by embodiment id.

    Args:
        ids: Embodiment id of each sample ``[B]`` (integers).
        num_embodiments: How many embodiments the layers hold (ids must be below it).

    Attributes:
        members: ``(embodiment, sample indices)`` per embodiment present; the indices are None when
            the whole batch is one embodiment.

    Raises:
        ConfigError: An id is outside ``[0, num_embodiments)``.
    """

    def __init__(self, ids: torch.Tensor, num_embodiments: int):
        present = [int(e) for e in torch.unique(ids).tolist()]   # one host sync per forward
        bad = [e for e in present if not 0 <= e < num_embodiments]
        if bad:
            raise ConfigError(f"embodiment id(s) {bad} in the batch, but model.num_embodiments={num_embodiments}: "
                              f"raise model.num_embodiments or fix the dataset's embodiment_id")
        if len(present) == 1:
            self.members: list[tuple[int, torch.Tensor | None]] = [(present[0], None)]
        else:
            self.members = [(e, torch.nonzero(ids == e).flatten()) for e in present]


class EmbodimentLinear(nn.Module):
    """A linear layer per embodiment: ``weight [E, out, in]``, ``bias [E, out]`` (each initialised as
    ``nn.Linear`` initialises its own)."""

    def __init__(self, num_embodiments: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embodiments, out_features, in_features))
        self.bias = nn.Parameter(torch.empty(num_embodiments, out_features))
        bound = 1.0 / math.sqrt(in_features)
        for e in range(num_embodiments):
            nn.init.kaiming_uniform_(self.weight[e], a=math.sqrt(5))
        nn.init.uniform_(self.bias, -bound, bound)

    @property
    def out_features(self) -> int:
        return self.weight.shape[1]

    def forward(self, x: torch.Tensor, groups: EmbodimentGroups) -> torch.Tensor:
        """``x [B, ..., in]`` through each sample's embodiment's layer -> ``[B, ..., out]``."""
        if len(groups.members) == 1:
            e = groups.members[0][0]
            return F.linear(x, self.weight[e], self.bias[e])
        parts = [(index, F.linear(x[index], self.weight[e], self.bias[e])) for e, index in groups.members]
        out = parts[0][1].new_empty(*x.shape[:-1], self.out_features)  # the products' dtype (bf16 under autocast)
        for index, part in parts:
            out[index] = part
        return out


class EmbodimentMLP(nn.Module):
    """:class:`EmbodimentLinear` layers of ``dims`` with ``activation`` between them."""

    def __init__(self, num_embodiments: int, dims: list[int], activation: type[nn.Module] = nn.SiLU):
        super().__init__()
        self.layers = nn.ModuleList(EmbodimentLinear(num_embodiments, dims[i], dims[i + 1])
                                    for i in range(len(dims) - 1))
        self.activation = activation()

    def forward(self, x: torch.Tensor, groups: EmbodimentGroups) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, groups)
            if i < len(self.layers) - 1:
                x = self.activation(x)
        return x
