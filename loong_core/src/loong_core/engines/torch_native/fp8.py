"""FP8 training on the torch engine: torchao's float8 ``Linear`` for the layers the rule picks.

``parallel.fp8_format`` turns it on. Which ``nn.Linear`` layers run their three GEMMs (output,
input gradient, weight gradient) in FP8 is decided per layer by :func:`plan` ("adaptive" FP8):

1. both dimensions must be multiples of 16 (what FP8 matmuls accept);
2. with ``parallel.first_last_layers_bf16`` the first ``num_layers_at_start_in_bf16`` and last
   ``num_layers_at_end_in_bf16`` of the model's blocks (``ModelProvider.torch_blocks``) stay out;
3. ``in_features`` and ``out_features`` must reach ``parallel.fp8_min_gemm_dim``.

Every other layer keeps the run's compute dtype. :func:`convert` swaps the chosen layers for
``torchao.float8.Float8Linear`` (same parameters, same ``state_dict`` keys, so checkpoints do not
change). Where the device has no FP8 matmuls (``DeviceBackend.fast_fp8``: CPU, GPUs before
compute capability 8.9) torchao's emulation mode runs the same casts and scales with the matmul
in fp32, which is how CPU tests exercise FP8.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass, field

import torch

from loong_core.errors import MissingDependencyError

logger = logging.getLogger(__name__)

FIRST_LAST = "first/last layers"
SMALL = "below fp8_min_gemm_dim"
SHAPE = "dims not multiples of 16"


@dataclass
class Fp8Plan:
    """The per-layer choice of :func:`plan`.

    Attributes:
        fp8: Qualified names of the Linear layers that run in FP8.
        kept: Why each other Linear stays in the compute dtype: reason -> names.
    """

    fp8: list[str] = field(default_factory=list)
    kept: dict[str, list[str]] = field(default_factory=dict)

    def describe(self) -> str:
        """Banner text: counts and name patterns of the FP8 and the kept layers."""
        kept = sum(len(names) for names in self.kept.values())
        lines = [f"fp8 layers: {len(self.fp8)} Linear in fp8 {summarize(self.fp8)}",
                 f"fp8 layers: {kept} Linear kept in the compute dtype"
                 + "".join(f"; {len(names)} {reason} {summarize(names)}"
                           for reason, names in self.kept.items() if names)]
        return "\n".join(lines)


def _ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    parts, run = [], [numbers[0]]
    for n in numbers[1:]:
        if n == run[-1] + 1:
            run.append(n)
        else:
            parts.append(run)
            run = [n]
    parts.append(run)
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in parts)


def summarize(names: list[str]) -> str:
    """Compact name patterns: ``blocks.0.attn.qkv, blocks.1.attn.qkv`` -> ``[blocks.{0-1}.attn.qkv]``.

    Names are grouped by their text with the first layer index replaced; each group shows the
    indices it covers.
    """
    if not names:
        return "[]"
    groups: dict[str, list[int]] = {}
    for name in names:
        match = re.search(r"(^|\.)(\d+)(\.|$)", name)
        if match is None:
            groups.setdefault(name, [])
            continue
        key = name[:match.start(2)] + "{}" + name[match.end(2):]
        groups.setdefault(key, []).append(int(match.group(2)))
    shown = [key.replace("{}", str(idx[0]) if len(idx) == 1 else "{" + _ranges(sorted(set(idx))) + "}")
             if idx else key for key, idx in groups.items()]
    return "[" + ", ".join(shown) + "]"


def plan(model: torch.nn.Module, blocks: list[torch.nn.Module], parallel) -> Fp8Plan:
    """Choose, per ``nn.Linear`` of ``model``, FP8 or the compute dtype (rules in the module doc).

    Args:
        model: The built model (before any wrapping).
        blocks: Its repeated blocks, in order (``ModelProvider.torch_blocks``).
        parallel: The :class:`~loong_core.config.schema.ParallelConfig`.
    """
    edge: set[int] = set()
    if parallel.first_last_layers_bf16:
        n = len(blocks)
        if n == 0:
            logger.warning("parallel.first_last_layers_bf16=true but the model declares no blocks")
        start, end = parallel.num_layers_at_start_in_bf16, parallel.num_layers_at_end_in_bf16
        for i, block in enumerate(blocks):
            if i < start or i >= n - end:
                edge.update(id(m) for m in block.modules())
    result = Fp8Plan(kept={SHAPE: [], FIRST_LAST: [], SMALL: []})
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        dims = (module.in_features, module.out_features)
        if any(d % 16 for d in dims):
            result.kept[SHAPE].append(name)
        elif id(module) in edge:
            result.kept[FIRST_LAST].append(name)
        elif min(dims) < parallel.fp8_min_gemm_dim:
            result.kept[SMALL].append(name)
        else:
            result.fp8.append(name)
    return result


def float8_config(parallel, emulate: bool):
    """torchao's ``Float8LinearConfig`` for ``parallel.fp8_recipe`` / ``fp8_format``.

    ``tensorwise`` is torchao's recipe of that name, whose gradients are e5m2 (``hybrid``); with
    ``e4m3`` its gradients are cast to e4m3 too. ``rowwise`` is e4m3 throughout (the config check
    refuses ``hybrid`` with it).
    """
    # Without FP8 matmuls torchao's CUDA extensions (mxfp8, CUTLASS) are of no use; their load
    # failures on import would only be noise in the log.
    torchao_logger = logging.getLogger("torchao")
    level = torchao_logger.level
    if emulate:
        torchao_logger.setLevel(logging.ERROR)
    try:
        from torchao.float8 import CastConfig, Float8LinearConfig
    except ImportError:
        raise MissingDependencyError("torchao", "loong-core[fp8]",
                                     "FP8 training on the torch engine (parallel.fp8_format)") from None
    finally:
        torchao_logger.setLevel(level)
    config = Float8LinearConfig.from_recipe_name(parallel.fp8_recipe)
    if parallel.fp8_recipe == "tensorwise" and parallel.fp8_format == "e4m3":
        grad = CastConfig(scaling_granularity=config.cast_config_grad_output.scaling_granularity,
                          target_dtype=torch.float8_e4m3fn)
        config = dataclasses.replace(config, cast_config_grad_output=grad,
                                     cast_config_grad_output_for_grad_weight=grad)
    return dataclasses.replace(config, emulate=emulate)


def convert(model: torch.nn.Module, layers: Fp8Plan, parallel, device) -> None:
    """Swap the layers ``layers.fp8`` names for torchao's ``Float8Linear`` in place (before the
    model is wrapped); emulated where ``device.fast_fp8`` is false."""
    config = float8_config(parallel, emulate=not device.fast_fp8)
    from torchao.float8 import convert_to_float8_training

    chosen = set(layers.fp8)
    convert_to_float8_training(model, module_filter_fn=lambda _module, fqn: fqn in chosen, config=config)


def describe_run(parallel, device) -> str:
    """Banner text of the recipe: format, scaling, and whether the matmuls are emulated."""
    where = ("hardware fp8 matmuls" if device.fast_fp8
             else f"emulated: {device.name} has no fp8 matmuls, fp32 matmuls of fp8-rounded operands")
    grads = "e5m2" if parallel.fp8_format == "hybrid" else "e4m3"
    adaptive = (f"first {parallel.num_layers_at_start_in_bf16} / last {parallel.num_layers_at_end_in_bf16} "
                "blocks kept" if parallel.first_last_layers_bf16 else "all blocks")
    return (f"fp8: torchao float8, fp8_recipe={parallel.fp8_recipe} fp8_format={parallel.fp8_format} "
            f"(activations/weights e4m3, gradients {grads}), {adaptive}, fp8_min_gemm_dim="
            f"{parallel.fp8_min_gemm_dim} ({where})")
