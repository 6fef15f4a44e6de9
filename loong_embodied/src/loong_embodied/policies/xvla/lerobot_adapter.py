"""LeRobot 0.4.4's ``xvla`` policy state dict -> loong's ``xvla`` head.

A name table (one row per layer, ``{i}`` a block index) and the transforms:

- ``linear``: weight and bias copied (LayerNorms too).
- ``qkv``: X-VLA's fused ``qkv`` projection (rows: queries, keys, values) split into loong's
  ``q_proj``, ``k_proj``, ``v_proj``.
- ``domain``: X-VLA's per-domain layers keep, per domain, a flat weight row (``fc``, an
  embedding of ``in * out`` read as ``[in, out]``) and a bias row (``bias``); loong holds
  ``weight [domains, in, out]`` and ``bias [domains, out]``.
- ``projection``: the VLM / auxiliary view projection, ``linear`` or ``domain`` as LeRobot's
  ``use_hetero_proj`` built it.
- ``positions``: ``pos_emb [1, rows, width]`` -> ``[rows, width]``.
- ``prompts``: ``soft_prompt_hub`` ``[domains, len * width]`` -> ``[domains, len, width]``.

Both predict the actions from ``x_t = (1 - t) actions + t noise`` with ``t = 1`` the noise, so no
sign changes. Only the transformer is mapped: X-VLA's Florence-2 (``model.vlm.*``) is not loong's
SigLIP + decoder backbone (see ``docs/modalities/embodied.md``, "Checked against LeRobot").
"""

from __future__ import annotations

import re

import torch

from loong_core.errors import CheckpointError

_PREFIX = "model.transformer."
_BACKBONE = "model.vlm."
_BLOCK = "head.transformer.blocks.{i}"

#: ``(loong module, LeRobot module under model.transformer, transform)``.
TABLE: list[tuple[str, str, str]] = [
    (f"{_BLOCK}.attn_norm", "blocks.{i}.norm1", "linear"),
    (f"{_BLOCK}.attn", "blocks.{i}.attn.qkv", "qkv"),
    (f"{_BLOCK}.attn.o_proj", "blocks.{i}.attn.proj", "linear"),
    (f"{_BLOCK}.mlp_norm", "blocks.{i}.norm2", "linear"),
    (f"{_BLOCK}.mlp.0", "blocks.{i}.mlp.fc1", "linear"),
    (f"{_BLOCK}.mlp.2", "blocks.{i}.mlp.fc2", "linear"),
    ("head.action_encoder", "action_encoder", "domain"),
    ("head.features_proj", "vlm_proj", "projection"),
    ("head.aux_proj", "aux_visual_proj", "projection"),
    ("head.positions", "pos_emb", "positions"),
    ("head.soft_prompts", "soft_prompt_hub", "prompts"),
    ("head.norm", "norm", "linear"),
    ("head.action_decoder", "action_decoder", "domain"),
]


def _blocks(state: dict[str, torch.Tensor], template: str) -> list[str]:
    """The block indices of ``template`` present in ``state`` (``[""]`` without ``{i}``)."""
    if "{i}" not in template:
        return [""]
    pattern = re.compile("^" + re.escape(template).replace(r"\{i\}", r"(\d+)") + r"\.")
    return [str(i) for i in sorted({int(m.group(1)) for m in map(pattern.match, state) if m})]


def _copy(state: dict, theirs: str, ours: str, out: dict, used: set) -> None:
    for suffix in ("weight", "bias"):
        if f"{theirs}.{suffix}" in state:
            out[f"{ours}.{suffix}"] = state[f"{theirs}.{suffix}"]
            used.add(f"{theirs}.{suffix}")


def _domain(state: dict, theirs: str, ours: str, out: dict, used: set) -> None:
    flat, bias = state[f"{theirs}.fc.weight"], state[f"{theirs}.bias.weight"]
    domains, width_out = bias.shape
    out[f"{ours}.weight"] = flat.reshape(domains, flat.shape[1] // width_out, width_out)
    out[f"{ours}.bias"] = bias
    used |= {f"{theirs}.fc.weight", f"{theirs}.bias.weight"}


def _place(state: dict, ours: str, theirs: str, kind: str, out: dict, used: set) -> None:
    """Writes loong tensor(s) of module ``ours`` from LeRobot module ``theirs`` by ``kind``."""
    if kind == "linear" or (kind == "projection" and f"{theirs}.weight" in state):
        _copy(state, theirs, ours, out, used)
    elif kind in ("domain", "projection"):
        _domain(state, theirs, ours, out, used)
    elif kind == "qkv":
        for suffix in ("weight", "bias"):
            for name, part in zip(("q_proj", "k_proj", "v_proj"), state[f"{theirs}.{suffix}"].chunk(3, dim=0)):
                out[f"{ours}.{name}.{suffix}"] = part.contiguous()
            used.add(f"{theirs}.{suffix}")
    elif kind == "positions":
        out[ours] = state[theirs][0]
        used.add(theirs)
    elif kind == "prompts" and f"{theirs}.weight" in state:
        prompts = state[f"{theirs}.weight"]
        width = state["norm.weight"].shape[0]
        out[ours] = prompts.reshape(prompts.shape[0], prompts.shape[1] // width, width)
        used.add(f"{theirs}.weight")


def head_from_lerobot(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Loong ``xvla`` state-dict entries of the head from a LeRobot ``XVLAPolicy`` state dict.

    Args:
        state: ``XVLAPolicy.state_dict()`` (keys ``model.transformer.*``; ``model.vlm.*``, the
            Florence-2 backbone, is left out), or the ``SoftPromptedTransformer``'s own state dict.

    Returns:
        Loong parameter name -> tensor, for ``XVLAPolicy.load_state_dict(..., strict=False)`` (the
        backbone is not in it). A LeRobot model without soft prompts (``len_soft_prompts=0``)
        gives no ``head.soft_prompts``: set ``soft_prompt_len=0`` on loong's side.

    Raises:
        CheckpointError: a LeRobot transformer tensor the table does not place.
    """
    if any(key.startswith(_PREFIX) for key in state):
        state = {k.removeprefix(_PREFIX): v for k, v in state.items() if not k.startswith(_BACKBONE)}
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for ours_template, theirs_template, kind in TABLE:
        for index in _blocks(state, theirs_template):
            _place(state, ours_template.replace("{i}", index), theirs_template.replace("{i}", index), kind, out, used)
    unplaced = sorted(set(state) - used)
    if unplaced:
        raise CheckpointError(f"LeRobot X-VLA tensors with no place in loong's xvla head: {unplaced[:8]}"
                              f"{' ...' if len(unplaced) > 8 else ''}")
    return out
