"""Driver run by the LeRobot venv's python (never by loong's): LeRobot 0.4.4's GR00T N1.5 action head.

    python groot_head.py OUT_DIR SIZES_JSON

Builds ``FlowmatchingActionHead`` from a config alone (the full ``GrootPolicy`` downloads its
checkpoint, see the docs), perturbs every parameter with a fixed seed (so zero-initialised biases
matter too), draws a batch of backbone features, state and actions, and writes to ``OUT_DIR``:

- ``head.safetensors``: the head's state dict;
- ``io.safetensors``: the batch (with each sample's embodiment id), the noise and GR00T time
  ``tau`` of one training forward, its loss, and the initial noise and predicted action chunk of ``get_action``;
- ``versions.json``: lerobot / torch / transformers / diffusers versions.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

import torch
from lerobot.policies.groot.action_head.flow_matching_action_head import (
    FlowmatchingActionHead,
    FlowmatchingActionHeadConfig,
)
from safetensors.torch import save_file
from transformers.feature_extraction_utils import BatchFeature


def alternate_text_and_images(head: FlowmatchingActionHead, every: int, image_tokens: int) -> None:
    """GR00T N1.6's ``AlternateVLDiT`` out of LeRobot's N1.5 DiT: cross-attention block ``i`` reads
    only the text tokens (those after the first ``image_tokens``) when ``i % (2 every) == 0``, only
    the image tokens otherwise. The batches have no padding, so reading a slice is the mask."""
    for i, block in enumerate(head.model.transformer_blocks):
        if i % 2:
            continue
        part = slice(image_tokens, None) if i % (2 * every) == 0 else slice(None, image_tokens)

        def forward(hidden_states, *args, _forward=block.forward, _part=part, encoder_hidden_states=None, **kwargs):
            return _forward(hidden_states, *args, encoder_hidden_states=encoder_hidden_states[:, _part], **kwargs)

        block.forward = forward


def build(s: dict) -> FlowmatchingActionHead:
    """The head at the sizes in ``s``; dropout off, no per-block position table; with
    ``attend_text_every`` set, N1.6's alternating cross-attention (the first ``image_tokens``
    backbone tokens are the image's)."""
    w = s["width"]
    transformer = dict(dropout=0.0, final_dropout=True, positional_embeddings=None)
    config = FlowmatchingActionHeadConfig(
        action_dim=s["action_dim"], action_horizon=s["chunk"], add_pos_embed=True, max_seq_len=s["max_seq_len"],
        input_embedding_dim=w, hidden_size=w, backbone_embedding_dim=s["backbone_width"],
        max_state_dim=s["state_dim"], max_num_embodiments=s["embodiments"], num_inference_timesteps=s["steps"],
        num_target_vision_tokens=s["future_tokens"], noise_s=0.999, num_timestep_buckets=1000, use_vlln=True,
        tune_projector=True, tune_diffusion_model=True,
        diffusion_model_cfg=dict(num_attention_heads=s["heads"], attention_head_dim=w // s["heads"], output_dim=w,
                                 num_layers=s["layers"], interleave_self_attention=True, norm_type="ada_norm",
                                 cross_attention_dim=s["backbone_width"], **transformer),
        vl_self_attention_cfg=dict(num_attention_heads=s["vl_heads"],
                                   attention_head_dim=s["backbone_width"] // s["vl_heads"],
                                   num_layers=s["vl_layers"], **transformer))
    head = FlowmatchingActionHead(config)
    if s.get("attend_text_every"):
        alternate_text_and_images(head, s["attend_text_every"], s["image_tokens"])
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return head


def head_inputs(io: dict) -> tuple[BatchFeature, BatchFeature]:
    """The head's two arguments: backbone output (``io["features"]``, all valid) and action inputs
    (``io["state"]``, ``io["actions"]``, every action valid, ``io["embodiment_id"]`` per sample)."""
    b, tokens = io["features"].shape[:2]
    backbone = {"backbone_features": io["features"], "backbone_attention_mask": torch.ones(b, tokens)}
    inputs = {"state": io["state"], "action": io["actions"], "embodiment_id": io["embodiment_id"],
              "action_mask": torch.ones_like(io["actions"])}
    return BatchFeature(backbone), BatchFeature(inputs)


def main(out: Path, s: dict) -> None:
    torch.manual_seed(s["seed"])
    head = build(s)
    b = s["batch"]
    ids = torch.tensor(s["embodiment_ids"]) if "embodiment_ids" in s else torch.full((b,), s["embodiment"])
    io = {"features": torch.randn(b, s["tokens"], s["backbone_width"]),
          "state": torch.randn(b, 1, s["state_dim"]),
          "actions": torch.rand(b, s["chunk"], s["action_dim"]) * 2 - 1,
          "noise": torch.randn(b, s["chunk"], s["action_dim"]),
          "tau": torch.rand(b) * 0.999,
          "embodiment_id": ids}
    backbone, inputs = head_inputs(io)
    # The head draws its noise and time inside forward(); hand it the ones saved above.
    head.sample_time = lambda batch_size, device, dtype: io["tau"].to(device, dtype)
    real_randn = torch.randn
    torch.randn = lambda *args, **kwargs: io["noise"].clone()
    try:
        head.train()
        io["loss"] = head(backbone, inputs)["loss"].detach().reshape(1)
    finally:
        torch.randn = real_randn
    head.eval()
    torch.manual_seed(s["sample_seed"])
    io["initial_noise"] = torch.randn(b, s["chunk"], s["action_dim"])
    torch.manual_seed(s["sample_seed"])
    io["action_chunk"] = head.get_action(*head_inputs(io))["action_pred"]
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in head.state_dict().items()}, out / "head.safetensors")
    save_file({k: v.contiguous() for k, v in io.items()}, out / "io.safetensors")
    versions = {name: version(name) for name in ("lerobot", "torch", "transformers", "diffusers")}
    (out / "versions.json").write_text(json.dumps(versions))


if __name__ == "__main__":
    main(Path(sys.argv[1]), json.loads(sys.argv[2]))
