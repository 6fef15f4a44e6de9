"""The Pi0.5-style, GR00T-style and X-VLA-style VLA policies: backbone parity with transformers, masks,
the prefix cache, sampling, freezing and a quick overfit (tiny random configs, CPU, one thread)."""

from __future__ import annotations

import pytest
import torch

from loong_core.errors import ConfigError
from loong_embodied.policies.common import flow
from loong_embodied.policies.groot.config import GrootConfig
from loong_embodied.policies.groot.model import GrootProvider
from loong_embodied.policies.pi05.config import Pi05Config
from loong_embodied.policies.pi05.model import Pi05Provider
from loong_embodied.policies.xvla.config import XVLAConfig
from loong_embodied.policies.xvla.model import XVLAProvider

COMMON = dict(state_dim=5, action_dim=2, chunk_size=4, image_size=[3, 16, 16], image_keys=["observation.image"],
              patch_size=8, vision_hidden_size=32, vision_layers=1, vision_heads=2, vision_intermediate_size=64,
              hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64,
              max_text_tokens=12, num_inference_steps=3, time_embedding_dim=16)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def pi05(**overrides) -> Pi05Provider:
    return Pi05Provider(Pi05Config(name="pi05", expert_hidden_size=24, expert_intermediate_size=48, state_bins=16,
                                   **{**COMMON, **overrides}))


def groot(**overrides) -> GrootProvider:
    return GrootProvider(GrootConfig(name="groot", head_hidden_size=32, head_layers=2, head_heads=2,
                                     **{**COMMON, **overrides}))


def xvla(**overrides) -> XVLAProvider:
    return XVLAProvider(XVLAConfig(name="xvla", head_hidden_size=32, head_layers=2, head_heads=2, num_domains=2,
                                   soft_prompt_len=3, max_seq_len=64, max_state_dim=8, max_action_dim=4,
                                   **{**COMMON, **overrides}))


def batch(b: int = 4) -> dict:
    g = torch.Generator().manual_seed(0)
    return {"observation.state": torch.randn(b, 1, 5, generator=g),
            "observation.image": torch.rand(b, 1, 3, 16, 16, generator=g),
            "task": ["reach", "push", "door open", "button press topdown"][:b],
            "action": torch.rand(b, 4, 2, generator=g) * 2 - 1, "noise_seed": torch.arange(b)}


@pytest.mark.parametrize("backbone", ["llama", "qwen2"])
def test_pi05_prefix_stream_matches_the_transformers_decoder_layer(backbone):
    torch.manual_seed(0)
    model = pi05(backbone_type=backbone).build_torch_model()
    layer = model.layers[0]
    layer.vlm.self_attn.config._attn_implementation = "eager"     # no mask given: full attention
    x = torch.randn(2, 7, 32)
    positions = torch.arange(7)[None].expand(2, -1)
    rope = model.rotary(x, positions)
    ours, _ = layer.prefix_forward(x, rope, torch.ones(2, 1, 7, 7, dtype=torch.bool))
    reference = layer.vlm(x, attention_mask=None, position_ids=positions, position_embeddings=rope)
    reference = reference[0] if isinstance(reference, tuple) else reference
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)


def test_pi05_velocity_ignores_padding_and_the_prefix_cache_changes_nothing():
    torch.manual_seed(0)
    model = pi05().build_torch_model().eval()
    for p in model.parameters():                       # zero-initialised modulations: make them matter
        torch.nn.init.normal_(p, std=0.2)
    b = batch()
    x_t, t = torch.randn(4, 4, 2), torch.rand(4)
    full = model(b, x_t, t)
    prefix = model.encode_prefix(b)
    _, caches = model.run_layers(prefix, None, None)
    torch.testing.assert_close(model.run_layers(prefix, x_t, t, caches)[0], full)
    # Pad embedding changes reach only padded prompt positions, which no query may attend to.
    with torch.no_grad():
        model.embed_tokens.weight[0] += 5.0
    torch.testing.assert_close(model(b, x_t, t), full)
    other = {**b, "task": ["push", *b["task"][1:]]}
    assert not torch.allclose(model(other, x_t, t)[0], full[0])


@pytest.mark.parametrize("make", [pi05, groot, xvla], ids=["pi05", "groot", "xvla"])
def test_sampling_gives_action_chunks_in_the_action_range(make):
    torch.manual_seed(0)
    model = make().build_torch_model().eval()
    actions = model.sample(batch(3), generator=torch.Generator().manual_seed(1))
    assert actions.shape == (3, 4, 2) and actions.abs().max() <= 1.0
    again = model.sample(batch(3), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(actions, again)


@pytest.mark.parametrize("make", [pi05, groot], ids=["pi05", "groot"])
def test_the_loss_averages_only_the_actions_that_are_not_padding(make):
    # Padded actions still enter the noisy chunk the action tokens attend to (as in LeRobot), so
    # their values may move other predictions; what padding must not do is count in the loss.
    provider = make()
    model = provider.build_torch_model()
    pad = torch.tensor([[False] * 4, [False, False, True, True], *[[False] * 4] * 2])
    b = {**batch(), "action_is_pad": pad}
    loss_sum, count, _ = provider.torch_forward_step(model, b)
    actions = flow.chunk_actions(b)
    noise, t = flow.flow_draws(actions, b["noise_seed"], provider.flow_time)
    x_t, target = flow.interpolate(actions, noise, t)
    err = (model(b, x_t, t) - target).pow(2)
    expected = torch.stack([err[i][~pad[i]].mean() for i in range(4)]).sum()
    assert float(count) == 4.0
    torch.testing.assert_close(loss_sum, expected)
    assert not torch.allclose(loss_sum, err.mean(dim=(1, 2)).sum())      # the padded entries would change it


@pytest.mark.parametrize("make", [pi05, groot, xvla], ids=["pi05", "groot", "xvla"])
def test_flow_matching_loss_goes_down_on_a_tiny_batch(make):
    torch.manual_seed(0)
    provider = make()
    model = provider.build_torch_model()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    b, losses = batch(), []
    for _ in range(40):
        loss_sum, count, _ = provider.torch_forward_step(model, b)
        (loss_sum / count).backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss_sum.detach()) / float(count))
    assert losses[-1] < 0.25 * losses[0], losses


@pytest.mark.parametrize("tune", [False, True])
def test_groot_freezes_the_backbone_unless_tuned(tune):
    provider = groot(tune_backbone=tune)
    model = provider.build_torch_model()
    provider.torch_forward_step(model, batch())[0].backward()
    backbone = [*model.vision.parameters(), *model.language.parameters()]
    head = [*model.dit.parameters(), *model.action_decoder.parameters(), *model.features_norm.parameters()]
    assert all(p.requires_grad == tune and (p.grad is not None) == tune for p in backbone)
    assert all(p.grad is not None for p in head)


def test_timestep_distributions_weight_noisy_times():
    u = torch.linspace(0.0, 1.0, 1001)
    for t in (flow.pi0_time(u), flow.groot_time(u)):
        assert 0.0 <= float(t.min()) and float(t.max()) <= 1.0
        assert float((t > 0.5).float().mean()) > 0.6      # Beta(1.5, 1): more mass at noisy times


def test_bad_backbone_type_names_the_key():
    with pytest.raises(ConfigError, match="model.backbone_type"):
        pi05(backbone_type="gpt2").build_torch_model()


def test_pi05_attention_follows_pi05_action_tokens_see_each_other_and_the_prefix_never_sees_them():
    """LeRobot's pi05 (its ``att_masks``: 0 for the prefix, then 1, 0, 0, ... for the actions)."""
    torch.manual_seed(0)
    model = pi05().build_torch_model().eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    b, t = batch(), torch.rand(4)
    x_t = torch.randn(4, 4, 2)
    prefix = model.encode_prefix(b)
    v, kvs = model.run_layers(prefix, x_t, t)
    _, prefix_only = model.run_layers(prefix, None, None)
    for (k, v_), (k0, v0) in zip(kvs, prefix_only):
        assert torch.equal(k, k0) and torch.equal(v_, v0)
    later = x_t.clone()
    later[:, -1] += 1.0
    assert (model.run_layers(prefix, later, t)[0][:, 0] - v[:, 0]).abs().max() > 1e-4   # the first sees the last


def test_pi05_time_is_pi0s_beta_scaled_to_0p001_1():
    """LeRobot's ``sample_time``: ``Beta(1.5, 1) * 0.999 + 0.001``, by its inverse CDF."""
    u = torch.tensor([0.0, 0.125, 1.0])
    torch.testing.assert_close(flow.pi0_time(u), torch.tensor([0.001, 0.001 + 0.999 * 0.25, 1.0]))
