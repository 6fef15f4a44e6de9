"""Driver run by the LeRobot venv's python (never by loong's): LeRobot 0.4.4's ``xvla`` policy.

    python xvla_policy.py OUT_DIR SIZES_JSON

Builds ``XVLAPolicy`` offline at a reduced size (an explicit small Florence-2 config, action space
``auto``), perturbs every parameter with a fixed seed (so zero-initialised biases matter too),
sets dropout to 0, and replaces its Florence-2 encoding (``forward_vlm``) by fixed random VLM and
auxiliary view tokens, which loong's side reads too. Writes to ``OUT_DIR``:

- ``policy.safetensors``: the policy's state dict (Florence-2 included);
- ``io.safetensors``: the tokens, state, actions, domain ids, the noise and time of one training
  forward and its loss, and the initial noise and predicted action chunk of ``predict_action_chunk``;
- ``versions.json``: lerobot / torch / transformers versions.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

import torch
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies.xvla.configuration_xvla import XVLAConfig
from lerobot.policies.xvla.modeling_xvla import XVLAPolicy
from lerobot.utils.constants import ACTION, OBS_LANGUAGE_TOKENS, OBS_STATE
from safetensors.torch import save_file

FLORENCE = {"vision_config": {"dim_embed": [16, 16, 16, 16], "num_heads": [1, 1, 1, 1], "num_groups": [1, 1, 1, 1],
                              "depths": [1, 1, 1, 1], "projection_dim": 32, "window_size": 2},
            "text_config": {"d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
                            "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64},
            "projection_dim": 32}
IMAGE = "observation.images.cam"


def build(s: dict) -> XVLAPolicy:
    """The policy at the sizes in ``s``, weights perturbed, dropout off."""
    config = XVLAConfig(florence_config=FLORENCE, hidden_size=s["width"], depth=s["layers"], num_heads=s["heads"],
                        num_domains=s["domains"], len_soft_prompts=s["soft_prompts"], dim_time=s["time_dim"],
                        max_len_seq=s["max_seq_len"], use_hetero_proj=s["hetero"], action_mode="auto",
                        max_state_dim=s["max_state_dim"], max_action_dim=s["max_action_dim"],
                        chunk_size=s["chunk"], n_action_steps=s["chunk"], num_denoising_steps=s["steps"],
                        device="cpu")
    config.input_features = {OBS_STATE: PolicyFeature(FeatureType.STATE, (s["state_dim"],)),
                             IMAGE: PolicyFeature(FeatureType.VISUAL, (3, 32, 32))}
    config.output_features = {ACTION: PolicyFeature(FeatureType.ACTION, (s["action_dim"],))}
    policy = XVLAPolicy(config)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    for module in policy.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return policy


def feed(policy: XVLAPolicy, io: dict) -> dict:
    """Replaces ``policy``'s Florence-2 encoding by ``io["features"]`` and ``io["aux"]``; the policy's
    training batch of ``io["state"]``, ``io["actions"]`` and ``io["domain_id"]`` (placeholder
    language tokens and image, which only that encoding reads)."""
    policy.model.forward_vlm = lambda *args, **kwargs: {"vlm_features": io["features"],
                                                         "aux_visual_inputs": io["aux"]}
    b = io["state"].shape[0]
    return {OBS_LANGUAGE_TOKENS: torch.zeros(b, 4, dtype=torch.long), IMAGE: torch.zeros(b, 3, 32, 32),
            OBS_STATE: io["state"], ACTION: io["actions"], "domain_id": io["domain_id"]}


def main(out: Path, s: dict) -> None:
    torch.manual_seed(s["seed"])
    policy = build(s)
    b = s["batch"]
    io = {"features": torch.randn(b, s["tokens"], 32), "aux": torch.randn(b, s["aux_tokens"], 32),
          "state": torch.randn(b, 1, s["state_dim"]), "actions": torch.rand(b, s["chunk"], s["action_dim"]) * 2 - 1,
          "domain_id": torch.tensor(s["domain_ids"]), "noise": torch.randn(b, s["chunk"], s["max_action_dim"]),
          "u": torch.rand(1)}
    batch = feed(policy, io)
    seen = {}
    transformer_forward = policy.model.transformer.forward

    def recording(**kwargs):
        seen["t"] = kwargs["t"].detach().clone()
        return transformer_forward(**kwargs)

    policy.model.transformer.forward = recording
    # X-VLA draws its time (one uniform, stratified over the batch) and noise inside forward().
    real_rand, real_randn_like = torch.rand, torch.randn_like
    torch.rand = lambda *args, **kwargs: io["u"].clone()
    torch.randn_like = lambda *args, **kwargs: io["noise"].clone()
    try:
        policy.train()
        io["loss"] = policy(batch)[0].detach().reshape(1)
    finally:
        torch.rand, torch.randn_like = real_rand, real_randn_like
    io["t"] = seen["t"]
    torch.manual_seed(s["sample_seed"])
    io["initial_noise"] = torch.randn(b, s["chunk"], s["max_action_dim"])
    torch.manual_seed(s["sample_seed"])
    io["action_chunk"] = policy.predict_action_chunk({k: v for k, v in batch.items() if k != ACTION})
    out.mkdir(parents=True, exist_ok=True)
    # Florence-2 ties its encoder embeddings to the shared ones: clones, for safetensors.
    save_file({k: v.clone().contiguous() for k, v in policy.state_dict().items()}, out / "policy.safetensors")
    save_file({k: v.contiguous() for k, v in io.items()}, out / "io.safetensors")
    versions = {name: version(name) for name in ("lerobot", "torch", "transformers")}
    (out / "versions.json").write_text(json.dumps(versions))


if __name__ == "__main__":
    main(Path(sys.argv[1]), json.loads(sys.argv[2]))
