"""The Qwen2.5-VL-style encoder: 2D rotary angles by patch row and column; trains in the VLM."""

from __future__ import annotations

import torch

from loong_vlm.encoders.rope2d_vit import rope_2d


def test_rope_2d_turns_half_the_pairs_with_the_row_and_half_with_the_column():
    angles = rope_2d((2, 3), head_dim=8, theta=10000.0)  # 2 frequencies per axis
    assert angles.shape == (6, 1, 1, 8)
    flat = angles[:, 0, 0]
    assert torch.equal(flat[:, :4], flat[:, 4:])  # rotate-half pairs share angles
    rows, cols = flat[:, :2], flat[:, 2:4]
    assert torch.equal(rows[0], rows[2]) and torch.equal(rows[3], rows[5])  # same row, other column
    assert torch.equal(cols[0], cols[3]) and torch.equal(cols[1], cols[4])  # same column, other row
    assert rows[3, 0] == 1.0 and cols[2, 0] == 2.0  # angle = index x inverse frequency 1.0


def test_rope2d_encoder_with_merger_feeds_the_foundation(mcore_single_rank, tiny_vlm_config):
    from loong_vlm.config import MLPProjectorConfig, Rope2DViTConfig
    from loong_vlm.provider import VLMProvider

    config = tiny_vlm_config()
    config.encoder = Rope2DViTConfig(name="vit_rope2d", image_size=16, num_channels=1, patch_size=4,
                                     num_layers=1, hidden_size=32, num_attention_heads=2, ffn_hidden_size=64)
    config.projector = MLPProjectorConfig(name="mlp_projector", spatial_merge_size=2)
    provider = VLMProvider(config)
    assert provider.image_tokens_per_image() == 4
    torch.manual_seed(0)
    model = provider.build_megatron_model(provider.megatron_config({}), True, True, None)
    assert not any("position_embeddings" in name for name, _ in model.encoder.named_parameters())
    tokens = torch.randint(10, 90, (2, 12), generator=torch.Generator().manual_seed(0))
    tokens[:, 2:6] = config.image_token_id
    images = torch.randn(2, 1, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    batch = {"tokens": tokens, "position_ids": torch.arange(12).expand(2, 12), "images": images,
             "labels": torch.roll(tokens, -1, 1), "loss_mask": torch.ones(tokens.shape)}
    output, loss_func = provider.forward_step(model, batch)
    loss_func(output)[0].backward()
    assert all(p.grad is not None for p in model.encoder.parameters())
    with torch.no_grad():
        flipped = model(tokens, batch["position_ids"], None, images=images.flip(0))
    assert (flipped[:, 2:] - output[:, 2:].detach()).abs().amax() > 1e-3
