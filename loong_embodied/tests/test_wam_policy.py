"""The world-action model: its two-term loss, the masked attention that makes the world rollout
optional at inference, the future frame the data delivers, and a short ``loong train`` run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loong_core.errors import ConfigError
from loong_core.testing import losses, run_train
from loong_embodied.policies.wam.config import WAMConfig
from loong_embodied.policies.wam.provider import WAMProvider

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def provider(**overrides) -> WAMProvider:
    fields = dict(name="wam", state_dim=5, action_dim=2, chunk_size=4, image_size=[3, 16, 16],
                  image_keys=["observation.image"], num_tasks=2, latent_size=8, latent_patch=2, hidden_size=32,
                  num_layers=2, num_attention_heads=2, frequency_dim=16, num_inference_steps=3)
    return WAMProvider(WAMConfig(**{**fields, **overrides}))


def batch(b: int = 4) -> dict:
    g = torch.Generator().manual_seed(0)
    return {"observation.state": torch.randn(b, 5, generator=g),
            "observation.image": torch.rand(b, 3, 16, 16, generator=g),
            "observation.image.future": torch.rand(b, 3, 16, 16, generator=g),
            "task_index": torch.arange(b) % 2, "action": torch.rand(b, 4, 2, generator=g) * 2 - 1,
            "noise_seed": torch.arange(b)}


def random_model(p: WAMProvider):
    """A model whose zero-initialised modulations and outputs are random (so every input matters)."""
    torch.manual_seed(0)
    model = p.build_torch_model()
    for param in model.parameters():
        torch.nn.init.normal_(param, std=0.2)
    return model


def test_the_loss_is_the_action_loss_plus_the_weighted_world_loss():
    half, double = provider(world_loss_weight=0.5), provider(world_loss_weight=2.0)
    model = random_model(half)
    b = batch()
    action, world = half.losses(model, b)
    loss_half, count, metrics = half.torch_forward_step(model, b)
    loss_double, _, _ = double.torch_forward_step(model, b)
    assert float(count) == 4.0 and float(world.detach().min()) > 0.0
    torch.testing.assert_close(loss_half, (action + 0.5 * world).sum())
    torch.testing.assert_close(loss_double - loss_half, 1.5 * world.sum())
    torch.testing.assert_close(metrics["action_loss"], torch.stack([action.sum(), count]))
    torch.testing.assert_close(metrics["world_loss"], torch.stack([world.sum(), count]))


def test_the_future_frame_moves_the_world_loss_and_never_the_action_loss():
    p = provider()
    model = random_model(p)
    b = batch()
    action, world = p.losses(model, b)
    other = {**b, "observation.image.future": 1.0 - b["observation.image.future"]}
    action_other, world_other = p.losses(model, other)
    torch.testing.assert_close(action_other, action, rtol=0, atol=1e-6)   # actions never attend the future
    assert (world_other - world).abs().min() > 1e-3
    # The current frame is context for both streams: it moves both losses.
    current = {**b, "observation.image": 1.0 - b["observation.image"]}
    action_current, world_current = p.losses(model, current)
    assert (action_current - action).abs().min() > 1e-4 and (world_current - world).abs().min() > 1e-4


def test_a_future_frame_past_the_episode_end_does_not_count():
    p = provider()
    model = random_model(p)
    pad = torch.tensor([False, True, False, False])
    action, world = p.losses(model, {**batch(), "observation.image.future_is_pad": pad})
    reference_action, reference_world = p.losses(model, batch())
    assert float(world[1].detach()) == 0.0
    torch.testing.assert_close(world[~pad], reference_world[~pad])
    torch.testing.assert_close(action, reference_action)


def test_padded_actions_do_not_count_in_the_action_loss():
    p = provider()
    model = random_model(p)
    pad = torch.tensor([[False] * 4, [False, False, True, True], *[[False] * 4] * 2])
    masked, _ = p.losses(model, {**batch(), "action_is_pad": pad})
    full, _ = p.losses(model, batch())
    # Same draws, same predictions: only the sample with padding averages fewer errors.
    torch.testing.assert_close(masked[[0, 2, 3]], full[[0, 2, 3]])
    assert abs(float(masked[1]) - float(full[1])) > 1e-4


def test_sampling_with_and_without_the_world_rollout_gives_the_same_actions():
    p = provider()
    model = random_model(p).eval()
    b = {k: v for k, v in batch(3).items() if k not in ("action", "observation.image.future")}
    actions, future = model.rollout(b, torch.Generator().manual_seed(1), world=True)
    fast, none = model.rollout(b, torch.Generator().manual_seed(1), world=False)
    assert actions.shape == (3, 4, 2) and future.shape == (3, 16, 12) and none is None
    assert actions.abs().max() <= 1.0
    torch.testing.assert_close(fast, actions, rtol=0, atol=1e-5)
    torch.testing.assert_close(model.sample(b, torch.Generator().manual_seed(1)), fast)


def test_joint_training_fits_both_streams_on_a_tiny_batch():
    p = provider()
    torch.manual_seed(0)
    model = p.build_torch_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    b, first, last = batch(), None, None
    for _ in range(40):
        action, world = p.losses(model, b)
        (action + world).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        first = first or (float(action.mean()), float(world.mean()))
        last = (float(action.mean()), float(world.mean()))
    assert last[0] < 0.25 * first[0] and last[1] < 0.5 * first[1], (first, last)


def test_training_without_a_future_frame_names_the_data_key():
    p = provider()
    b = {k: v for k, v in batch().items() if k != "observation.image.future"}
    with pytest.raises(ConfigError, match="data.future_offset"):
        p.losses(p.build_torch_model(), b)


def test_the_data_delivers_the_camera_frame_k_steps_ahead(written):
    from loong_embodied.data.config import LeRobotDataConfig
    from loong_embodied.data.module import LeRobotDataModule

    root, episodes = written
    module = LeRobotDataModule(LeRobotDataConfig(name="lerobot", path=str(root), chunk_size=2, future_offset=3))
    module.setup()
    assert module.model_overrides()["future_offset"] == 3
    split, _ = module.build(4, 1, seed=0)
    split.order = np.arange(len(module.frames))                 # frames in order: episode 0 has 7
    for i, (future, pad) in {0: (3, False), 3: (6, False), 4: (6, True)}.items():
        item = split[i]
        assert item["observation.image"].shape == (3, 16, 16)  # the current frame keeps its shape
        expected = episodes[0][future]["observation.image"].transpose(2, 0, 1) / 255.0
        np.testing.assert_allclose(item["observation.image.future"].numpy(), expected, atol=1e-6)
        assert bool(item["observation.image.future_is_pad"]) is pad
        current = episodes[0][i]["observation.image"].transpose(2, 0, 1) / 255.0
        np.testing.assert_allclose(item["observation.image"].numpy(), current, atol=1e-6)


def test_wam_debug_reduces_the_loss(lerobot_metaworld, tmp_path):
    run_dir = tmp_path / "run"
    run_train(["experiment=wam_debug", f"data.path={lerobot_metaworld}", f"trainer.run_dir={run_dir}",
               "trainer.train_iters=30", "trainer.save_at_end=false", "trainer.progress_bar=false",
               "trainer.tensorboard=false"], env={"LOONG_PLUGINS": "embodied"}, timeout=300)
    steps = losses(run_dir)
    assert sorted(steps) == list(range(1, 31))
    first, last = np.mean([steps[s] for s in range(1, 6)]), np.mean([steps[s] for s in range(26, 31)])
    assert last < 0.9 * first, (first, last)
