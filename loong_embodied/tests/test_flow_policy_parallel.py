"""The flow policy on the torch engine: DDP over 2 ranks follows one rank, and a run resumed after a
crash reproduces the uninterrupted losses bit for bit."""

from __future__ import annotations

import os

import pytest
import torch

from loong_core.testing import install_plugin, losses, run_train
from loong_embodied.policies.flow.config import FlowPolicyConfig
from loong_embodied.policies.flow.model import FlowPolicyProvider

CRASH_PLUGIN = '''
import os
from loong_core.hookspecs import hookimpl

@hookimpl
def loong_on_log_step(run, step, metrics):
    if step == int(os.environ.get("CRASH_AT_STEP", "-1")):
        os._exit(17)   # a hard crash: no cleanup, no final checkpoint
'''

STEPS = 4


def test_training_noise_follows_the_sample_not_the_batch_it_lands_in():
    config = FlowPolicyConfig(name="flow_policy", state_dim=3, action_dim=2, chunk_size=4, hidden_size=16,
                              num_layers=1, frequency_dim=8)
    provider = FlowPolicyProvider(config)
    model = provider.build_torch_model()
    torch.nn.init.normal_(model.action_out.weight)     # zero-initialised: make the loss depend on x_t
    batch = {"observation.state": torch.randn(4, 3), "task_index": torch.zeros(4, dtype=torch.long),
             "action": torch.randn(4, 4, 2), "noise_seed": torch.arange(10, 14)}
    whole, _, _ = provider.torch_forward_step(model, batch)
    halves = [provider.torch_forward_step(model, {k: v[s] for k, v in batch.items()})[0]
              for s in (slice(0, 2), slice(2, 4))]
    torch.testing.assert_close(whole, halves[0] + halves[1])


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    install_plugin(site, "loong-test-crash", "crash", {"loong_test_crash": CRASH_PLUGIN})
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "LOONG_PLUGINS": "embodied,crash"}


@pytest.fixture(scope="module")
def common(written):
    path, _ = written
    return ["experiment=flow_policy_debug", f"data.path={path}", f"trainer.train_iters={STEPS}",
            "trainer.save_interval=2", "trainer.save_at_end=false", "trainer.progress_bar=false",
            "trainer.tensorboard=false"]


@pytest.fixture(scope="module")
def ddp2(common, env, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ddp2") / "run"
    run_train([*common, "parallel=ddp", f"trainer.run_dir={run_dir}"], nproc=2, env=env, timeout=300)
    return losses(run_dir)


@pytest.mark.multirank
def test_ddp2_loss_curve_matches_one_rank(common, env, ddp2, tmp_path):
    run_train([*common, f"trainer.run_dir={tmp_path / 'one'}"], env=env, timeout=300)
    one = losses(tmp_path / "one")
    assert sorted(ddp2) == sorted(one) == list(range(1, STEPS + 1))
    for step in one:
        assert ddp2[step] == pytest.approx(one[step], abs=1e-5, rel=1e-5), (step, ddp2, one)


@pytest.mark.multirank
def test_ddp2_resume_after_crash_reproduces_losses_bit_for_bit(common, env, ddp2, tmp_path):
    crashed = tmp_path / "crashed"
    proc = run_train([*common, f"trainer.run_dir={crashed}"], nproc=2, env={**env, "CRASH_AT_STEP": "3"},
                     check=False, timeout=300)
    assert proc.returncode != 0
    assert sorted(p.name for p in (crashed / "checkpoints").iterdir()) == ["iter_0000002"]
    run_train([*common, f"trainer.run_dir={crashed}", "trainer.resume=auto"], nproc=2, env=env, timeout=300)
    resumed = losses(crashed)
    assert [resumed[s] for s in range(1, STEPS + 1)] == [ddp2[s] for s in range(1, STEPS + 1)]
