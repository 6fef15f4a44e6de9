"""GR00T's embodiment-specific layers (``CategorySpecificLinear`` / ``CategorySpecificMLP``): one weight
matrix per embodiment, picked by each sample's id (:mod:`loong_embodied.policies.common.embodiment`
groups the batch and runs the products)."""

from __future__ import annotations

import math

import torch
from torch import nn

from loong_embodied.policies.common.embodiment import EmbodimentGroups


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

    def forward(self, x: torch.Tensor, groups: EmbodimentGroups) -> torch.Tensor:
        """``x [B, ..., in]`` through each sample's embodiment's layer -> ``[B, ..., out]``."""
        return groups.unsort(self.sorted_forward(groups.sort(x), groups))

    def sorted_forward(self, x: torch.Tensor, groups: EmbodimentGroups) -> torch.Tensor:
        """:meth:`forward` of a batch already in ``groups.sort``'s order (the result in it too)."""
        return groups.linear(x, self.weight, self.bias)


class EmbodimentMLP(nn.Module):
    """:class:`EmbodimentLinear` layers of ``dims`` with ``activation`` between them."""

    def __init__(self, num_embodiments: int, dims: list[int], activation: type[nn.Module] = nn.SiLU):
        super().__init__()
        self.layers = nn.ModuleList(EmbodimentLinear(num_embodiments, dims[i], dims[i + 1])
                                    for i in range(len(dims) - 1))
        self.activation = activation()

    def forward(self, x: torch.Tensor, groups: EmbodimentGroups) -> torch.Tensor:
        """``x [B, ..., dims[0]]`` -> ``[B, ..., dims[-1]]``; a mixed batch is sorted by embodiment once."""
        x = groups.sort(x)
        for i, layer in enumerate(self.layers):
            x = layer.sorted_forward(x, groups)
            if i < len(self.layers) - 1:
                x = self.activation(x)
        return groups.unsort(x)
