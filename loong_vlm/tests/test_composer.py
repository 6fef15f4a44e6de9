"""The composer puts projected image features at the placeholder tokens and nowhere else."""

from __future__ import annotations

import pytest
import torch

from loong_vlm.composer import place_features

IMAGE = 5


def test_place_features_replaces_exactly_the_placeholder_rows():
    tokens = torch.tensor([[1, IMAGE, IMAGE, 2], [IMAGE, 3, 4, IMAGE]])
    embeddings = torch.zeros(2, 4, 3)
    features = torch.arange(12, dtype=torch.float32).reshape(4, 3) + 1
    placed = place_features(embeddings, tokens, features, IMAGE)
    assert torch.equal(placed[0, 1], features[0]) and torch.equal(placed[0, 2], features[1])
    assert torch.equal(placed[1, 0], features[2]) and torch.equal(placed[1, 3], features[3])
    assert torch.equal(placed[tokens != IMAGE], torch.zeros(4, 3))


def test_place_features_passes_gradients_to_features_and_text():
    tokens = torch.tensor([[IMAGE, 1]])
    embeddings = torch.ones(1, 2, 2, requires_grad=True)
    features = torch.ones(1, 2, requires_grad=True)
    place_features(embeddings, tokens, features, IMAGE).sum().backward()
    assert features.grad.tolist() == [[1.0, 1.0]]
    assert embeddings.grad[0].tolist() == [[0.0, 0.0], [1.0, 1.0]]


def test_feature_count_must_match_placeholders():
    with pytest.raises(ValueError, match="2 image placeholder tokens but the encoder produced 3"):
        place_features(torch.zeros(1, 3, 2), torch.tensor([[IMAGE, IMAGE, 0]]), torch.zeros(3, 2), IMAGE)


def _build(config):
    from loong_vlm.provider import VLMProvider

    provider = VLMProvider(config)
    torch.manual_seed(0)
    return provider, provider.build_megatron_model(provider.megatron_config({}), True, True, None)


def _batch(image_positions=range(2, 18), seq=24, batch=2):
    tokens = torch.randint(10, 90, (batch, seq), generator=torch.Generator().manual_seed(0))
    tokens[:, list(image_positions)] = IMAGE
    images = torch.randn(batch, 1, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    return tokens, torch.arange(seq).expand(batch, seq), images


def test_images_change_logits_only_from_the_first_placeholder_on(mcore_single_rank, tiny_vlm_config):
    _, model = _build(tiny_vlm_config())
    tokens, positions, images = _batch()
    with torch.no_grad():
        a = model(tokens, positions, None, images=images)
        b = model(tokens, positions, None, images=images.flip(0))
    assert torch.equal(a[:, :2], b[:, :2])  # causal: nothing before the image sees it
    assert (a[:, 2:] - b[:, 2:]).abs().amax() > 1e-3


def test_frozen_encoder_gets_no_gradient_but_projector_does(mcore_single_rank, tiny_vlm_config):
    provider, model = _build(tiny_vlm_config(freeze=True))
    tokens, positions, images = _batch()
    batch = {"tokens": tokens, "position_ids": positions, "images": images,
             "labels": torch.roll(tokens, -1, 1), "loss_mask": torch.ones(tokens.shape)}
    output, loss_func = provider.forward_step(model, batch)
    loss, count, metrics = loss_func(output)
    loss.backward()
    assert all(p.grad is None and not p.requires_grad for p in model.encoder.parameters())
    assert all(p.grad is not None for p in model.projector.parameters())
    assert int(count) == tokens.numel() and metrics["accuracy"][1] == tokens.numel()


def test_patch_merger_quarters_the_image_tokens(mcore_single_rank, tiny_vlm_config):
    from loong_vlm.config import MLPProjectorConfig

    config = tiny_vlm_config()
    config.projector = MLPProjectorConfig(name="mlp_projector", spatial_merge_size=2)
    provider, model = _build(config)
    assert provider.image_tokens_per_image() == 4
    tokens, positions, images = _batch(image_positions=range(2, 6))
    with torch.no_grad():
        assert model(tokens, positions, None, images=images).shape[:2] == (2, 24)
