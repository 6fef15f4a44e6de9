"""End to end: the debug VLM trains, a swapped foundation trains, and TP2 (+SP), PP2 and DP2 follow
the one-rank loss curve."""

from __future__ import annotations

import math

import pytest
import yaml

from loong_core.testing import losses, read_metrics, run_train

STEPS = 3


@pytest.fixture(scope="module")
def debug_run(tmp_path_factory, tiny):
    """Two steps of the debug VLM with a validation pass; its checkpoint seeds the others."""
    run_dir = tmp_path_factory.mktemp("vlm") / "debug"
    run_train([*tiny, f"trainer.run_dir={run_dir}", "trainer.train_iters=2", "trainer.eval_interval=2",
               "trainer.eval_iters=1"])
    return run_dir


def test_debug_vlm_trains_and_reports_accuracy(debug_run):
    train = read_metrics(debug_run)
    assert [r["step"] for r in train] == [1, 2]
    assert all(math.isfinite(r["loss"]) and 0.0 <= r["accuracy"] <= 1.0 for r in train)
    assert train[0]["balance/max_over_mean_after"] <= train[0]["balance/max_over_mean_before"]
    (valid,) = read_metrics(debug_run, "valid")
    assert math.isfinite(valid["loss"]) and 0.0 <= valid["accuracy"] <= 1.0
    assert (debug_run / "checkpoints" / "iter_0000002").is_dir()


def test_swapping_the_foundation_is_one_override_and_trains(tmp_path, tiny):
    run_dir = tmp_path / "qwen3"
    run_train([*tiny, "model@model.foundation=qwen3_debug", f"trainer.run_dir={run_dir}",
               f"trainer.train_iters={STEPS}", "trainer.eval_interval=0", "trainer.save_at_end=false"])
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["model"]["foundation"]["name"] == "qwen3"
    assert saved["model"]["foundation"]["qk_layernorm"] is True
    curve = losses(run_dir)
    assert sorted(curve) == list(range(1, STEPS + 1)) and curve[STEPS] < curve[1]


LAYOUTS = {
    "tp2_sp": ["parallel=tp2"],  # tensor + sequence parallel: encoder and projector TP-sharded too
    "pp2": ["parallel=pp2"],  # encoder + projector on the first stage only
    "dp2_kk_swap": [],  # two data-parallel ranks; the kk_swap balancer splits each global batch
}


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory, tiny, debug_run):
    """The one-rank loss curve from the debug run's checkpoint."""
    root = tmp_path_factory.mktemp("layouts")
    common = [*tiny, f"trainer.init_from={debug_run / 'checkpoints' / 'iter_0000002'}",
              f"trainer.train_iters={STEPS}", "trainer.eval_interval=0", "trainer.save_at_end=false",
              "optim.lr_decay_iters=20"]
    run_train([*common, f"trainer.run_dir={root / 'ref'}"])
    return common, losses(root / "ref"), root


@pytest.mark.multirank
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_parallel_layout_follows_the_one_rank_curve(one_rank, layout):
    common, ref, root = one_rank
    run_train([*common, *LAYOUTS[layout], f"trainer.run_dir={root / layout}"], nproc=2)
    got = losses(root / layout)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in ref:
        assert got[step] == pytest.approx(ref[step], abs=2e-5, rel=2e-5), (layout, step, got, ref)
    assert abs(ref[STEPS] - ref[1]) > 1e-3  # the weights move, so a frozen model could not pass


@pytest.mark.slow
def test_default_digits_experiment_reads_held_out_digits(tmp_path):
    """The shipped ``vlm_digits`` run (about 40 s on 2 idle cores) reaches >= 90% held-out accuracy."""
    run_dir = tmp_path / "digits"
    run_train(["experiment=vlm_digits", f"trainer.run_dir={run_dir}", "trainer.progress_bar=false",
               "trainer.tensorboard=false", "trainer.save_at_end=false"])
    valid = {r["step"]: r for r in read_metrics(run_dir, "valid")}
    assert valid[0]["accuracy"] < 0.2  # chance before training
    assert valid[600]["accuracy"] >= 0.9, valid
