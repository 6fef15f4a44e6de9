"""LeRobot 0.4.4's GR00T N1.5 action head (``FlowmatchingActionHead``) -> loong's ``groot`` head.

A name table (one row per linear layer, norm or embedding, ``{i}`` a block index) and three
transforms:

- ``linear``: weight and bias copied.
- ``embodiment``: GR00T's per-embodiment layers hold ``W [embodiments, in, out]`` and
  ``b [embodiments, out]``; loong's (:class:`~loong_embodied.policies.groot.embodiment.EmbodimentLinear`)
  hold ``weight [embodiments, out, in]``: ``weight = W.transpose(1, 2)``, ``bias = b`` (or the
  rows of the chosen embodiments only, for a policy that serves fewer robots).
- ``rows``: an embedding's first rows (GR00T's action positions have ``max_seq_len`` rows, loong
  ``chunk_size``).

GR00T's time runs from noise (0) to actions (1) and its head predicts ``actions - noise``; loong's
runs the other way and predicts ``noise - actions`` (:mod:`~loong_embodied.policies.common.flow`),
so the decoder's last layer is negated. Only the head is mapped: GR00T's Eagle backbone is not
loong's SigLIP + decoder backbone, and cannot be built without the Hugging Face hub (see
``docs/modalities/embodied.md``, "Checked against LeRobot").
"""

from __future__ import annotations

import re

import torch

from loong_core.errors import CheckpointError

_DIT = "model.transformer_blocks.{i}"
_VL = "vl_self_attention.transformer_blocks.{i}"
_ATTN = {"q_proj": "to_q", "k_proj": "to_k", "v_proj": "to_v", "o_proj": "to_out.0"}

#: ``(loong module, LeRobot module, transform)``.
TABLE: list[tuple[str, str, str]] = [
    ("features_norm", "vlln", "linear"),
    *[(f"vl_attention.blocks.{{i}}.attn.{ours}", f"{_VL}.attn1.{theirs}", "linear") for ours, theirs in _ATTN.items()],
    ("vl_attention.blocks.{i}.attn_norm", f"{_VL}.norm1", "linear"),
    ("vl_attention.blocks.{i}.mlp_norm", f"{_VL}.norm3", "linear"),
    ("vl_attention.blocks.{i}.mlp.0", f"{_VL}.ff.net.0.proj", "linear"),
    ("vl_attention.blocks.{i}.mlp.2", f"{_VL}.ff.net.2", "linear"),
    ("state_encoder.layers.0", "state_encoder.layer1", "embodiment"),
    ("state_encoder.layers.1", "state_encoder.layer2", "embodiment"),
    ("action_in.layers.0", "action_encoder.W1", "embodiment"),
    ("action_mix.layers.0", "action_encoder.W2", "embodiment"),
    ("action_mix.layers.1", "action_encoder.W3", "embodiment"),
    ("action_positions", "position_embedding", "rows"),
    ("future_tokens", "future_tokens", "rows"),
    ("time_encoder.0", "model.timestep_encoder.timestep_embedder.linear_1", "linear"),
    ("time_encoder.2", "model.timestep_encoder.timestep_embedder.linear_2", "linear"),
    ("dit.blocks.{i}.attn_norm.linear", f"{_DIT}.norm1.linear", "linear"),
    *[(f"dit.blocks.{{i}}.attn.{ours}", f"{_DIT}.attn1.{theirs}", "linear") for ours, theirs in _ATTN.items()],
    ("dit.blocks.{i}.mlp.0", f"{_DIT}.ff.net.0.proj", "linear"),
    ("dit.blocks.{i}.mlp.2", f"{_DIT}.ff.net.2", "linear"),
    ("dit.out_modulation.1", "model.proj_out_1", "linear"),
    ("dit.proj_out", "model.proj_out_2", "linear"),
    ("action_decoder.layers.0", "action_decoder.layer1", "embodiment"),
    ("action_decoder.layers.1", "action_decoder.layer2", "embodiment"),
]
#: Loong modules whose output is negated (GR00T's velocity is loong's with the other sign).
NEGATED = ("action_decoder.layers.1",)


def _blocks(state: dict[str, torch.Tensor], template: str) -> list[str]:
    """The block indices of ``template`` present in ``state`` (``[""]`` without ``{i}``)."""
    if "{i}" not in template:
        return [""]
    pattern = re.compile("^" + re.escape(template).replace(r"\{i\}", r"(\d+)") + r"\.")
    found = {int(m.group(1)) for m in map(pattern.match, state) if m}
    return [str(i) for i in sorted(found)]


def head_from_lerobot(state: dict[str, torch.Tensor], chunk_size: int,
                      embodiments: list[int] | None = None) -> dict[str, torch.Tensor]:
    """Loong ``groot`` state-dict entries of the head from a LeRobot ``FlowmatchingActionHead`` state dict.

    Args:
        state: The head's state dict (keys as ``FlowmatchingActionHead.state_dict()`` names them;
            a ``_groot_model.action_head.`` prefix is stripped).
        chunk_size: Actions per chunk of the loong policy (rows of the action positions).
        embodiments: Which of GR00T's per-embodiment weights to take, in the order loong's
            embodiment ids will use (None: all of them, ids unchanged).

    Returns:
        Loong parameter name -> tensor, for ``GrootPolicy.load_state_dict(..., strict=False)``
        (the backbone is not in it).

    Raises:
        CheckpointError: a LeRobot tensor the table does not place, or a row it needs is missing.
    """
    state = {k.removeprefix("_groot_model.action_head."): v for k, v in state.items()}
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for ours_template, theirs_template, kind in TABLE:
        for index in _blocks(state, theirs_template):
            ours, theirs = ours_template.replace("{i}", index), theirs_template.replace("{i}", index)
            sign = -1.0 if ours in NEGATED else 1.0
            if kind == "embodiment":
                weight, bias = state[f"{theirs}.W"].transpose(1, 2), state[f"{theirs}.b"]
                if embodiments is not None:
                    weight, bias = weight[embodiments], bias[embodiments]
                out[f"{ours}.weight"], out[f"{ours}.bias"] = sign * weight.contiguous(), sign * bias.contiguous()
                used |= {f"{theirs}.W", f"{theirs}.b"}
            elif kind == "rows":
                rows = state[f"{theirs}.weight"]
                used.add(f"{theirs}.weight")
                if not rows.numel():          # N1.6 has no future tokens: loong then has no table either
                    continue
                if ours == "action_positions" and rows.shape[0] < chunk_size:
                    raise CheckpointError(f"LeRobot's {theirs} has {rows.shape[0]} rows; chunk_size={chunk_size}")
                out[f"{ours}.weight"] = rows[:chunk_size] if ours == "action_positions" else rows
                used.add(f"{theirs}.weight")
            else:
                for suffix in ("weight", "bias"):
                    if f"{theirs}.{suffix}" in state:
                        out[f"{ours}.{suffix}"] = sign * state[f"{theirs}.{suffix}"]
                        used.add(f"{theirs}.{suffix}")
    unplaced = sorted(set(state) - used)
    if unplaced:
        raise CheckpointError(f"LeRobot GR00T head tensors with no place in loong's groot head: {unplaced[:8]}"
                              f"{' ...' if len(unplaced) > 8 else ''}")
    return out
