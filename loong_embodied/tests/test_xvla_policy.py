"""The X-VLA-style policy's own rules: its loss on the predicted actions, per-domain soft prompts and
layers, the auxiliary camera tokens, its time embedding and sampler, and config errors (tiny random
configs, CPU, one thread). LeRobot parity is ``test_lerobot_xvla.py``."""

from __future__ import annotations

import math

import pytest
import torch

from loong_core.errors import ConfigError
from loong_embodied.policies.common import flow
from loong_embodied.policies.xvla.config import XVLAConfig
from loong_embodied.policies.xvla.head import time_embedding
from loong_embodied.policies.xvla.model import XVLAProvider, pad_last

SIZES = dict(name="xvla", state_dim=5, action_dim=2, chunk_size=4, image_size=[3, 16, 16],
             image_keys=["observation.image"], patch_size=8, vision_hidden_size=32, vision_layers=1, vision_heads=2,
             vision_intermediate_size=64, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8,
             intermediate_size=64, max_text_tokens=12, num_inference_steps=3, head_hidden_size=32, head_layers=2,
             head_heads=2, num_domains=2, soft_prompt_len=3, time_embedding_dim=16, max_seq_len=64, max_state_dim=8,
             max_action_dim=4, dropout=0.0)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def provider(**overrides) -> XVLAProvider:
    torch.manual_seed(0)
    return XVLAProvider(XVLAConfig(**{**SIZES, **overrides}))


def batch(b: int = 4, cameras: tuple[str, ...] = ("observation.image",)) -> dict:
    g = torch.Generator().manual_seed(0)
    out = {"observation.state": torch.randn(b, 1, 5, generator=g), "task": ["reach", "push", "door", "button"][:b],
           "action": torch.rand(b, 4, 2, generator=g) * 2 - 1, "noise_seed": torch.arange(b)}
    return {**out, **{key: torch.rand(b, 1, 3, 16, 16, generator=g) for key in cameras}}


def test_the_loss_is_the_error_of_the_predicted_actions_on_real_channels_and_unpadded_steps():
    p = provider()
    model = p.build_torch_model()
    pad = torch.tensor([[False] * 4, [False, False, True, True], *[[False] * 4] * 2])
    b = {**batch(), "action_is_pad": pad}
    loss_sum, count, _ = p.torch_forward_step(model, b)
    padded = pad_last(b["action"], 4)
    noise, t = flow.flow_draws(padded, b["noise_seed"], p.flow_time)
    pred = model(b, flow.interpolate(padded, noise, t)[0], t)
    err = (pred[..., :2] - b["action"]).pow(2)               # the actions, not noise - actions
    expected = torch.stack([err[i][~pad[i]].mean() for i in range(4)]).sum()
    assert float(count) == 4.0
    torch.testing.assert_close(loss_sum, expected)
    assert pred.shape == (4, 4, 4) and not torch.allclose(loss_sum, (pred - padded).pow(2).mean(dim=(1, 2)).sum())


def test_a_domain_reads_only_its_own_soft_prompts_and_layers():
    model = provider().build_torch_model().eval()
    b, x_t, t = batch(), torch.randn(4, 4, 4), torch.rand(4)
    zero = model(b, x_t, t)
    one = model({**b, "domain_id": torch.tensor([1, 1, 1, 1])}, x_t, t)
    assert (one - zero).abs().min() > 0.0                      # every output moves with the domain
    with torch.no_grad():
        model.head.soft_prompts[1] += 1.0
        model.head.action_encoder.weight[1] += 1.0
        model.head.action_decoder.bias[1] += 1.0
    torch.testing.assert_close(model(b, x_t, t), zero, atol=0, rtol=0)
    mixed = model({**b, "domain_id": torch.tensor([0, 1, 0, 1])}, x_t, t)
    torch.testing.assert_close(mixed[0::2], zero[0::2])


def test_a_mixed_domain_batch_equals_each_sample_run_alone_with_the_same_gradients():
    """A mixed batch runs sorted by domain (one grouped product per per-domain layer) and is put back
    in its order: outputs and weight gradients equal those of each sample run alone (fp32)."""
    model = provider(num_domains=3, hetero_projection=True).build_torch_model().eval()
    b, x_t, t = batch(), torch.randn(4, 4, 4), torch.rand(4)
    b["domain_id"] = torch.tensor([2, 0, 2, 1])
    mixed = model(b, x_t, t)
    grads = torch.autograd.grad(mixed.square().sum(), list(model.head.parameters()))
    alone_grads = [torch.zeros_like(g) for g in grads]
    for i in range(4):
        one = {k: v[i:i + 1] for k, v in b.items()}
        out = model(one, x_t[i:i + 1], t[i:i + 1])
        torch.testing.assert_close(mixed[i:i + 1], out, atol=1e-6, rtol=0)
        for total, g in zip(alone_grads, torch.autograd.grad(out.square().sum(), list(model.head.parameters()))):
            total += g
    for name, got, want in zip([n for n, _ in model.head.named_parameters()], grads, alone_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=name)


def test_a_domain_id_beyond_num_domains_names_the_setting():
    model = provider().build_torch_model().eval()
    with pytest.raises(ConfigError, match="model.num_domains=2"):
        model({**batch(), "domain_id": torch.tensor([0, 1, 2, 0])}, torch.randn(4, 4, 4), torch.rand(4))


def test_a_second_camera_becomes_auxiliary_tokens_outside_the_language_model():
    model = provider(image_keys=["observation.image", "observation.wrist"]).build_torch_model().eval()
    b = batch(cameras=("observation.image", "observation.wrist"))
    features, aux = model.backbone(b)
    assert features.shape == (4, 4 + 12, 32) and aux.shape == (4, 4, 32)      # 2x2 patches, 12 text tokens
    torch.testing.assert_close(aux, model.vision(b)[:, 4:])                  # the wrist's projected patches
    other = {**b, "observation.wrist": torch.rand(4, 1, 3, 16, 16)}
    torch.testing.assert_close(model.backbone(other)[0], features)          # the wrist never enters the LM


def test_time_embedding_is_cos_then_sin_of_t_over_periods_up_to_100():
    emb = time_embedding(torch.tensor([0.0, 1.0]), 4)
    torch.testing.assert_close(emb[0], torch.tensor([1.0, 1.0, 0.0, 0.0]))
    torch.testing.assert_close(emb[1], torch.tensor([math.cos(1.0), math.cos(0.1), math.sin(1.0), math.sin(0.1)]))
    assert time_embedding(torch.tensor([0.5]), 5).shape == (1, 5) and time_embedding(torch.tensor([0.5]), 5)[0, 4] == 0


def test_renoise_sampling_mixes_each_estimate_with_the_first_noise_at_falling_times():
    seen = []

    def predict(x_t, t):
        seen.append((x_t.clone(), float(t[0])))
        return torch.full_like(x_t, 2.0)

    out = flow.renoise_sample(predict, (1, 2, 3), 4, "cpu", torch.Generator().manual_seed(0))
    noise = torch.randn(1, 2, 3, generator=torch.Generator().manual_seed(0))
    assert [t for _, t in seen] == [1.0, 0.75, 0.5, 0.25]
    torch.testing.assert_close(seen[0][0], noise)
    torch.testing.assert_close(seen[2][0], 0.5 * noise + 0.5 * 2.0)
    assert torch.equal(out, torch.full((1, 2, 3), 2.0))


def test_xvla_time_is_uniform_below_1():
    u = torch.linspace(0.0, 1.0 - 1e-7, 1001)
    t = flow.xvla_time(u)
    assert float(t.max()) < 1.0 - 1e-5 + 1e-7 and abs(float(t.mean()) - 0.5) < 1e-3


def test_dropout_acts_only_while_training():
    model = provider(dropout=0.5).build_torch_model()
    b, x_t, t = batch(), torch.randn(4, 4, 4), torch.rand(4)
    assert not torch.allclose(model.train()(b, x_t, t), model(b, x_t, t))
    model.eval()
    torch.testing.assert_close(model(b, x_t, t), model(b, x_t, t))


@pytest.mark.parametrize(("overrides", "key"), [({"max_action_dim": 1}, "model.max_action_dim"),
                                                ({"domain_id": 2}, "model.domain_id"),
                                                ({"max_seq_len": 12}, "model.max_seq_len")])
def test_bad_sizes_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key):
        provider(**overrides).build_torch_model()
