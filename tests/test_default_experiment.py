"""The default experiment (real model, real corpus) learns; a short version of `loong train`."""

from __future__ import annotations

import math

from loong_core.testing import read_metrics, run_train


def test_default_experiment_validation_loss_falls(default_experiment_run):
    # `loong train` for 40 steps, validation every 20 (the session's run, shared with the README tests)
    _, run_dir = default_experiment_run
    valid = read_metrics(run_dir, "valid")
    assert [r["step"] for r in valid] == [0, 20, 40]  # the experiment evaluates before step 1
    # an untrained model is close to uniform guessing over 4096 tokens: ln(4096) = 8.3 nats
    assert valid[0]["loss"] > math.log(4096) - 0.5
    assert valid[-1]["loss"] < valid[0]["loss"] - 1.5
    assert (run_dir / "checkpoints" / "iter_0000040" / "loong_complete.json").is_file()
    assert any(p.name.startswith("events.out.tfevents") for p in (run_dir / "tensorboard").iterdir())
    train = read_metrics(run_dir, "train")
    assert all(r["tokens_per_sec"] > 0 and 0 < r["mfu"] < 1 for r in train)


def test_nan_loss_stops_with_a_clear_error(tmp_path):
    proc = run_train(["experiment=llama_debug", f"trainer.run_dir={tmp_path / 'nan'}",
                      "optim.lr=1e30", "optim.clip_grad=0.0", "trainer.train_iters=20",
                      "trainer.eval_interval=0"], check=False)
    assert proc.returncode == 2
    # one error naming the step, what was not finite and the fix; no checkpoint is ever written
    assert "non-finite values at step" in proc.stderr
    assert "lower optim.lr" in proc.stderr and "trainer.exit_on_nan=false" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list((tmp_path / "nan" / "checkpoints").glob("iter_*"))
