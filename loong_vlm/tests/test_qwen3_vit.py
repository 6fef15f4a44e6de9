"""The ``qwen3_vit`` encoder computes transformers' ``Qwen3VLVisionModel``: merged tokens and every
deepstack feature within 1e-5 (fp32) for two images of different sizes (and a 2-frame video)."""

from __future__ import annotations

import pytest
import torch

TOLERANCE = 1e-5


def tiny_vision_config():
    """A 3-block, 32-wide transformers vision config with deepstack after blocks 0 and 1."""
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig

    return Qwen3VLVisionConfig(depth=3, hidden_size=32, intermediate_size=64, num_heads=4, in_channels=3,
                               patch_size=4, temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=48,
                               num_position_embeddings=36, deepstack_visual_indexes=[0, 1])


def random_hf_vision_model(seed: int = 0):
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    torch.manual_seed(seed)
    model = Qwen3VLVisionModel(tiny_vision_config()).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.1)
    return model


def loong_encoder_config(hf):
    from loong_vlm.qwen3_vl.config import Qwen3ViTConfig

    return Qwen3ViTConfig(name="qwen3_vit", num_layers=hf.depth, hidden_size=hf.hidden_size,
                          num_attention_heads=hf.num_heads, ffn_hidden_size=hf.intermediate_size,
                          hidden_act=hf.hidden_act, num_channels=hf.in_channels, patch_size=hf.patch_size,
                          temporal_patch_size=hf.temporal_patch_size, spatial_merge_size=hf.spatial_merge_size,
                          out_hidden_size=hf.out_hidden_size, num_position_embeddings=hf.num_position_embeddings,
                          deepstack_visual_indexes=list(hf.deepstack_visual_indexes))


def load_vision_weights(encoder, hf_state: dict, num_heads: int, head_dim: int, num_deepstack: int) -> None:
    """Copy an HF vision state dict into ``encoder`` through the adapter's vision rules."""
    from megatron.core import parallel_state as ps

    from loong_vlm.qwen3_vl.rules import vision_rule_set

    rules = vision_rule_set(num_heads, head_dim, num_deepstack, hf_prefix="", loong_prefix="")
    tp_rank, tp = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    with torch.no_grad():
        for name, target in encoder.state_dict(keep_vars=True).items():
            if name.endswith("_extra_state"):
                continue
            rule, hf_names = rules.match(name)
            full = rules.to_loong(rule, [hf_state[n] for n in hf_names])
            dim = target.partition_dim if getattr(target, "tensor_model_parallel", False) else None
            target.copy_(rules.shard(rule, full, dim, tp_rank, tp))


def test_vision_rules_cover_every_hf_tensor_and_round_trip():
    from loong_vlm.qwen3_vl.rules import vision_rule_set

    hf = random_hf_vision_model()
    state = hf.state_dict()
    rules = vision_rule_set(4, 8, 2, hf_prefix="", loong_prefix="")
    covered = {n for rule in rules.rules for n in rule.hf if "{i}" not in n}
    covered |= {n.format(i=i) for rule in rules.rules for n in rule.hf if "{i}" in n for i in range(3)}
    assert covered == set(state)
    qkv_rule, names = rules.match("blocks.layers.1.self_attention.linear_qkv.weight")
    back = rules.to_hf(qkv_rule, rules.to_loong(qkv_rule, [state[names[0]]]))[0]
    assert torch.equal(back, state[names[0]])


@pytest.fixture(scope="module")
def vision_inputs():
    """Two images of different sizes (4x4 and 4x6 patches) and a 2-frame video, packed."""
    grid_thw = torch.tensor([[1, 4, 4], [1, 4, 6], [2, 2, 4]])
    patches = int(grid_thw.prod(-1).sum())
    pixel_values = torch.randn(patches, 3 * 2 * 4 * 4, generator=torch.Generator().manual_seed(3))
    return pixel_values, grid_thw


def test_qwen3_vit_matches_transformers(mcore_single_rank, vision_inputs):
    from loong_vlm.encoders.qwen3_vit import Qwen3ViTEncoder

    hf = random_hf_vision_model()
    pixel_values, grid_thw = vision_inputs
    with torch.no_grad():
        expected = hf(pixel_values, grid_thw=grid_thw)
    encoder = Qwen3ViTEncoder(loong_encoder_config(hf.config), {}).eval()
    load_vision_weights(encoder, hf.state_dict(), 4, 8, 2)
    with torch.no_grad():
        tokens, deepstack = encoder(pixel_values, grid_thw)
    assert tokens.shape == expected.pooler_output.shape == (int(grid_thw.prod(-1).sum()) // 4, 48)
    assert (tokens - expected.pooler_output).abs().max() < TOLERANCE
    assert len(deepstack) == len(expected.deepstack_features) == 2
    for ours, theirs in zip(deepstack, expected.deepstack_features):
        assert (ours - theirs).abs().max() < TOLERANCE
