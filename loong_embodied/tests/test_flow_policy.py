"""The flow-matching action-chunk policy: shapes, padded actions and a 2-step training run."""

from __future__ import annotations

import torch

from loong_core.testing import losses, run_train
from loong_embodied.policies.flow.config import FlowPolicyConfig
from loong_embodied.policies.flow.model import FlowPolicyProvider


def _batch(b=3, chunk=4):
    return {"observation.state": torch.randn(b, 2, 5), "observation.image": torch.rand(b, 2, 3, 16, 16),
            "task_index": torch.zeros(b, dtype=torch.long), "action": torch.randn(b, chunk, 2),
            "action_is_pad": torch.tensor([[False] * chunk, [False, False, True, True], [False] * chunk])}


def _provider():
    config = FlowPolicyConfig(name="flow_policy", state_dim=5, action_dim=2, chunk_size=4, n_obs_steps=2,
                              image_size=[3, 16, 16], image_keys=["observation.image"], hidden_size=32,
                              num_layers=1, frequency_dim=16, num_inference_steps=3)
    return FlowPolicyProvider(config)


def test_loss_is_a_per_sample_sum_and_sampling_gives_action_chunks():
    provider = _provider()
    model = provider.build_torch_model()
    loss_sum, count, metrics = provider.torch_forward_step(model, _batch())
    assert float(count) == 3 and loss_sum.requires_grad and metrics["loss"].shape == (2,)
    assert model.sample(_batch()).shape == (3, 4, 2)


def test_padded_actions_do_not_change_the_loss():
    provider = _provider()
    model = provider.build_torch_model()
    batch = _batch()
    other = {**batch, "action": batch["action"].clone()}
    other["action"][1, 2:] += 100.0                  # only padded entries change
    torch.manual_seed(0)
    a, _, _ = provider.torch_forward_step(model, batch)
    torch.manual_seed(0)
    b, _, _ = provider.torch_forward_step(model, other)
    torch.testing.assert_close(a, b)


def test_flow_policy_debug_trains_two_steps_on_the_lerobot_dataset(lerobot_metaworld, tmp_path):
    run_dir = tmp_path / "run"
    run_train(["experiment=flow_policy_debug", f"data.path={lerobot_metaworld}", f"trainer.run_dir={run_dir}",
               "trainer.progress_bar=false", "trainer.tensorboard=false"], timeout=300)
    steps = losses(run_dir)
    assert sorted(steps) == [1, 2] and all(0.0 < v < 10.0 for v in steps.values())
    assert (run_dir / "checkpoints" / "iter_0000002").is_dir()
