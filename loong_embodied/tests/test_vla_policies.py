"""The Pi0.5-style, GR00T-style and X-VLA-style VLA policies: backbone parity with transformers, masks,
the prefix cache, sampling, freezing and a quick overfit (tiny random configs, CPU, one thread).

GR00T's per-embodiment layers and N1.6's layout (at the end) need no reference either: a mixed
batch equals each sample run alone, gradients reach only the embodiments present, N1.6's text
cross-attention blocks never read an image token, and ``tune_top_llm_layers`` trains the
backbone's top layers only (the weight-for-weight checks against LeRobot are in
``test_lerobot_groot.py``, marker ``lerobot``)."""

from __future__ import annotations

import pytest
import torch

from loong_core.errors import ConfigError
from loong_embodied.policies.common import flow
from loong_embodied.policies.common.embodiment import EmbodimentGroups
from loong_embodied.policies.groot.config import GrootConfig
from loong_embodied.policies.groot.dit import DiT
from loong_embodied.policies.groot.embodiment import EmbodimentLinear, EmbodimentMLP
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
    return Pi05Provider(Pi05Config(name="pi05", expert_hidden_size=24, expert_intermediate_size=48,
                                   **{**COMMON, "state_bins": 16, **overrides}))


def groot(**overrides) -> GrootProvider:
    return GrootProvider(GrootConfig(name="groot", **{"head_hidden_size": 32, "head_layers": 2, "head_heads": 2,
                                                      **COMMON, **overrides}))


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


def test_pi05_state_token_follows_pi0_the_actions_read_it_and_it_never_sees_the_actions():
    """Pi0's layout (LeRobot's pi0 ``att_masks``: prefix 0, state 1, actions 1, 0, 0, ...)."""
    torch.manual_seed(0)
    model = pi05(state_bins=0, state_token=True).build_torch_model().eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    b, t, x_t = batch(), torch.rand(4), torch.randn(4, 4, 2)
    prefix = model.encode_prefix(b)
    allowed = prefix["suffix_allowed"][:, 0]                   # [B, 1 + chunk, prefix + 1 + chunk]
    first_suffix = allowed.shape[-1] - 5
    assert not allowed[:, 0, first_suffix + 1:].any() and allowed[:, 0, first_suffix].all()
    assert allowed[:, 1:, first_suffix:].all()
    full = model(b, x_t, t)
    assert full.shape == (4, 4, 2)
    _, caches = model.run_layers(prefix, None, None)          # the cached prefix still serves every step
    torch.testing.assert_close(model.run_layers(prefix, x_t, t, caches)[0], full)
    moved = {**b, "observation.state": b["observation.state"] + 0.5}
    assert (model(moved, x_t, t) - full).abs().max() > 1e-4   # without binned tokens, the state still arrives
    # with binned state only, a state change inside one bin reaches nothing: the token is what sees it
    binned = pi05(state_bins=4).build_torch_model().eval()
    nudged = {**b, "observation.state": b["observation.state"] * 0 + 0.1}
    same_bin = {**b, "observation.state": b["observation.state"] * 0 + 0.2}
    torch.testing.assert_close(binned(nudged, x_t, t), binned(same_bin, x_t, t))


def test_pi05_time_is_pi0s_beta_scaled_to_0p001_1():
    """LeRobot's ``sample_time``: ``Beta(1.5, 1) * 0.999 + 0.001``, by its inverse CDF."""
    u = torch.tensor([0.0, 0.125, 1.0])
    torch.testing.assert_close(flow.pi0_time(u), torch.tensor([0.001, 0.001 + 0.999 * 0.25, 1.0]))


# GR00T's per-embodiment layers and N1.6's layout

N16 = dict(vl_layers=0, future_tokens=0, head_layers=4, attend_text_every=2, num_embodiments=3)


def test_a_mixed_batch_equals_each_sample_run_alone_and_trains_only_the_embodiments_present():
    torch.manual_seed(0)
    layer = EmbodimentLinear(4, 6, 5)
    x, ids = torch.randn(5, 3, 6), torch.tensor([2, 0, 2, 3, 0])
    out = layer(x, EmbodimentGroups(ids, 4))
    for i in range(5):
        alone = layer(x[i:i + 1], EmbodimentGroups(ids[i:i + 1], 4))
        torch.testing.assert_close(out[i:i + 1], alone, rtol=0, atol=1e-6)
        torch.testing.assert_close(alone, x[i:i + 1] @ layer.weight[ids[i]].T + layer.bias[ids[i]], rtol=0, atol=1e-6)
    out.square().sum().backward()
    assert layer.weight.grad[1].abs().max() == 0 and layer.bias.grad[1].abs().max() == 0   # embodiment 1 absent
    assert all(layer.weight.grad[e].abs().max() > 0 for e in (0, 2, 3))


def test_an_embodiment_mlp_runs_a_mixed_batch_sorted_once_as_each_sample_alone():
    """EmbodimentMLP sorts a mixed batch by embodiment once, runs every layer as one grouped product
    and puts the rows back: outputs and weight gradients equal those of each sample alone (fp32)."""
    torch.manual_seed(0)
    mlp = EmbodimentMLP(5, [6, 8, 3], torch.nn.ReLU)
    x, ids = torch.randn(7, 4, 6), torch.tensor([3, 0, 3, 4, 0, 0, 3])
    out = mlp(x, EmbodimentGroups(ids, 5))
    grads = torch.autograd.grad(out.square().sum(), list(mlp.parameters()))
    want = [torch.zeros_like(g) for g in grads]
    for i in range(7):
        alone = mlp(x[i:i + 1], EmbodimentGroups(ids[i:i + 1], 5))
        torch.testing.assert_close(out[i:i + 1], alone, rtol=0, atol=1e-6)
        for total, g in zip(want, torch.autograd.grad(alone.square().sum(), list(mlp.parameters()))):
            total += g
    for got, ref in zip(grads, want):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    assert grads[0][1].abs().max() == 0 and grads[0][2].abs().max() == 0   # embodiments 1, 2 absent


def test_a_mixed_batch_trains_under_bf16_autocast():
    """The torch engine's bf16 mixed precision (autocast): the products come out in bf16 and the
    mixed batch's rows still equal each sample's own layer (at bf16's rounding)."""
    torch.manual_seed(0)
    layer = EmbodimentLinear(3, 8, 4)
    x, ids = torch.randn(6, 2, 8), torch.tensor([0, 2, 1, 2, 0, 1])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x, EmbodimentGroups(ids, 3))
    assert out.dtype == torch.bfloat16
    reference = torch.einsum("bti,boi->bto", x, layer.weight[ids]) + layer.bias[ids].unsqueeze(1)
    torch.testing.assert_close(out.float(), reference, rtol=2e-2, atol=2e-2)
    out.float().square().sum().backward()
    assert layer.weight.grad.dtype == torch.float32 and layer.weight.grad.abs().min(dim=-1).values.gt(0).all()


def test_an_embodiment_id_beyond_num_embodiments_names_the_setting():
    with pytest.raises(ConfigError, match="model.num_embodiments=3"):
        EmbodimentGroups(torch.tensor([0, 3]), 3)


def test_the_policy_reads_each_samples_embodiment_id():
    torch.manual_seed(0)
    model = groot(**N16).build_torch_model().eval()
    b = batch(3)
    x_t, t = torch.randn(3, 4, 2), torch.tensor([0.2, 0.5, 0.9])
    features = model.features(b)
    mixed = model.velocity({**b, "embodiment_id": torch.tensor([0, 2, 1])}, x_t, t, *features)
    for i, e in enumerate([0, 2, 1]):
        one = {k: v[i:i + 1] for k, v in b.items() if k != "task"} | {"task": b["task"][i:i + 1]}
        alone = model.velocity({**one, "embodiment_id": torch.tensor([e])}, x_t[i:i + 1], t[i:i + 1],
                               *(f[i:i + 1] for f in features))
        torch.testing.assert_close(mixed[i:i + 1], alone, rtol=0, atol=1e-5)
    default = model.velocity(b, x_t, t, *features)               # no ids in the batch: model.embodiment_id (0)
    torch.testing.assert_close(default, model.velocity({**b, "embodiment_id": torch.zeros(3, dtype=torch.long)},
                                                       x_t, t, *features), rtol=0, atol=0)
    assert (default - mixed)[1:].abs().max() > 1e-4


def _dit_reads_images(layers: int) -> bool:
    """Whether a ``layers``-block N1.6 DiT's output moves when only the image tokens change."""
    torch.manual_seed(0)
    dit = DiT(16, layers, 2, context_dim=8, attend_text_every=2).eval()
    x, cond, context = torch.randn(2, 5, 16), torch.randn(2, 16), torch.randn(2, 6, 8)
    valid, image = torch.ones(2, 6, dtype=torch.bool), torch.tensor([[True] * 3 + [False] * 3] * 2)
    moved = context.clone()
    moved[:, :3] += 1.0
    return not torch.allclose(dit(x, cond, context, valid, image), dit(x, cond, moved, valid, image), atol=1e-6)


def test_n16_dit_reads_text_in_block_0_and_images_in_block_2():
    assert not _dit_reads_images(2)           # block 0 (text) and block 1 (self): image tokens never read
    assert _dit_reads_images(3)               # block 2 reads the images
    with pytest.raises(ValueError, match="image-token mask"):
        DiT(16, 2, 2, context_dim=8, attend_text_every=2)(torch.randn(1, 2, 16), torch.randn(1, 16),
                                                          torch.randn(1, 3, 8), torch.ones(1, 3, dtype=torch.bool))


def test_the_backbone_marks_its_camera_tokens_as_image_tokens():
    model = groot(**N16).build_torch_model()
    hidden, valid, image = model.backbone(batch(2))
    cameras = (16 // 8) ** 2                                   # one camera, 8-px patches of a 16-px image
    assert image.shape == valid.shape == hidden.shape[:2]
    assert image[:, :cameras].all() and not image[:, cameras:].any()


def test_tune_top_llm_layers_trains_the_top_layers_and_nothing_else_of_the_backbone():
    torch.manual_seed(0)
    provider = groot(**N16, tune_top_llm_layers=1)
    model = provider.build_torch_model()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad and n.startswith(("vision.", "language."))}
    assert trainable and all(n.startswith(("language.layers.1.", "language.norm.")) for n in trainable), trainable
    loss_sum, count, _ = provider.torch_forward_step(model.train(), batch(2))
    (loss_sum / count).backward()
    assert all(p.grad is not None and p.grad.abs().max() > 0 for n, p in model.named_parameters() if n in trainable)
    assert all(p.grad is None for n, p in model.named_parameters() if n.startswith("language.layers.0."))
    with pytest.raises(ConfigError, match="model.tune_top_llm_layers=3"):
        groot(tune_top_llm_layers=3).build_torch_model()


def test_n16_policy_learns_a_fixed_batch():
    torch.manual_seed(0)
    provider = groot(**N16, tune_top_llm_layers=1)
    model = provider.build_torch_model().train()
    b = {**batch(4), "embodiment_id": torch.tensor([0, 1, 2, 1])}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    noise, t = torch.randn(4, 4, 2, generator=torch.Generator().manual_seed(1)), torch.full((4,), 0.5)
    x_t, target = flow.interpolate(b["action"], noise, t)
    first = None
    for _ in range(40):
        loss = (model(b, x_t, t) - target).square().mean()
        first = float(loss) if first is None else first
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert float(loss) < 0.1 * first, (first, float(loss))


def test_eagle_style_image_tokens_merge_each_2x2_block_of_patches_into_one():
    torch.manual_seed(0)
    model = groot(**N16, vision_merge=2).build_torch_model()
    hidden, _, image = model.backbone(batch(2))
    assert int(image[0].sum()) == 1                        # a 2x2 patch grid (16-px image, 8-px patches) -> 1 token
    vision = model.vision
    patches = vision.tower(pixel_values=batch(2)["observation.image"][:, -1] * 2.0 - 1.0).last_hidden_state
    expected = vision.projector(patches.reshape(2, 1, -1))  # rows of the block, one after the other
    torch.testing.assert_close(vision(batch(2)), expected, rtol=0, atol=1e-6)
    with pytest.raises(ConfigError, match="model.vision_merge=3"):
        groot(vision_merge=3).build_torch_model()


def test_groot_n16_state_dropout_masks_the_state_in_training_only():
    torch.manual_seed(0)
    model = groot(**N16, state_dropout_prob=1.0).build_torch_model()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    b, t, x_t = batch(), torch.rand(4), torch.randn(4, 4, 2)
    moved = {**b, "observation.state": b["observation.state"] + 1.0}
    model.train()
    torch.testing.assert_close(model(moved, x_t, t), model(b, x_t, t))   # every state replaced by the mask
    model.eval()
    assert (model(moved, x_t, t) - model(b, x_t, t)).abs().max() > 1e-4   # inference reads the state
    model.train()
    model(b, x_t, t).square().sum().backward()
    assert model.state_mask.grad.abs().max() > 0                           # the mask token learns


def test_groot_n16_state_noise_draws_follow_each_samples_seed():
    torch.manual_seed(0)
    model = groot(**N16, state_noise_scale=0.5, state_dropout_prob=0.5).build_torch_model().train()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    b, t, x_t = batch(), torch.rand(4), torch.randn(4, 4, 2)
    full = model(b, x_t, t)
    torch.testing.assert_close(model(b, x_t, t), full)                     # seeded: the same draws again
    half = {k: v[2:] for k, v in b.items()}                                # samples 2, 3 alone (another rank)
    torch.testing.assert_close(model(half, x_t[2:], t[2:]), full[2:], rtol=0, atol=1e-5)
    reseeded = {**b, "noise_seed": b["noise_seed"] + 100}
    assert (model(reseeded, x_t, t) - full).abs().max() > 1e-4
    model.eval()
    plain = groot(**N16).build_torch_model().eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if k != "state_mask"})
    torch.testing.assert_close(model(b, x_t, t), plain(b, x_t, t))         # no augmentation at inference


def test_groot_state_augmentation_rejects_bad_values():
    with pytest.raises(ConfigError, match="model.state_dropout_prob=1.5"):
        groot(state_dropout_prob=1.5).build_torch_model()
