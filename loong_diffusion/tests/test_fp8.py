"""FP8 training (torchao float8, emulated on CPU) of the digits DiT on the torch engine.

20 steps of ``dit_digits_debug`` in bf16, in FP8 tensorwise (hybrid) and in FP8 rowwise (e4m3)
from the same seed: every step's loss within ``FP8_TOLERANCE`` (2^-6 relative) of bf16's.
Measured: at most 1.5e-4 (tensorwise) and 2.0e-4 (rowwise); every Linear but the patch embedding
and the output layer (dims not multiples of 16) runs in FP8. A run resumed from an FP8 checkpoint
repeats the FP8 losses bit for bit. Measured: 41 s for the module (3 runs of 20 steps, one of 10).
"""

from __future__ import annotations

import pytest

from loong_core.testing import assert_fp8_close_to_bf16, losses, run_train

pytest.importorskip("torchao", reason="FP8 needs torchao: pip install 'loong-core[fp8]'")

STEPS = 20
RECIPES = {"bf16": [], "tensorwise": ["parallel.fp8_format=hybrid", "parallel.fp8_recipe=tensorwise"],
           "rowwise": ["parallel.fp8_format=e4m3", "parallel.fp8_recipe=rowwise"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, quiet):
    root = tmp_path_factory.mktemp("fp8")
    common = ["experiment=dit_digits_debug", *quiet, f"trainer.train_iters={STEPS}", "trainer.eval_interval=0",
              "trainer.save_at_end=false", "parallel.mixed_precision=bf16"]
    result = {}
    for name, overrides in RECIPES.items():
        save = ["trainer.save_interval=10"] if name == "tensorwise" else []
        proc = run_train([*common, *overrides, *save, f"trainer.run_dir={root / name}"])
        result[name] = (losses(root / name), proc.stdout + proc.stderr)
    return common, root, result


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_dit_fp8_loss_stays_close_to_bf16(runs, recipe):
    _, _, result = runs
    fp8, log = result[recipe]
    assert_fp8_close_to_bf16(result["bf16"][0], fp8, STEPS)
    assert f"fp8_recipe={recipe}" in log and "emulated: cpu has no fp8 matmuls" in log
    assert "13 Linear in fp8" in log and "2 dims not multiples of 16 [patch, out]" in log


def test_resume_from_an_fp8_checkpoint_repeats_the_fp8_losses(runs, tmp_path):
    common, root, result = runs
    run_train([*common, *RECIPES["tensorwise"], f"trainer.run_dir={tmp_path}",
               f"trainer.resume={root / 'tensorwise' / 'checkpoints' / 'iter_0000010'}"])
    resumed, ref = losses(tmp_path), result["tensorwise"][0]
    assert [resumed[s] for s in range(11, STEPS + 1)] == [ref[s] for s in range(11, STEPS + 1)]
