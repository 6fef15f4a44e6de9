"""Commands that read a checkpoint refuse one of another kind with one clear error."""

from __future__ import annotations

import os
import subprocess
import sys

from loong_core.testing import run_train


def test_loong_sample_on_an_llm_run_names_what_it_holds(tmp_path):
    run_dir = tmp_path / "llm"
    run_train(["experiment=llama_debug", "trainer.train_iters=1", "trainer.eval_interval=0",
               "trainer.progress_bar=false", "trainer.tensorboard=false", f"trainer.run_dir={run_dir}"])
    proc = subprocess.run([sys.executable, "-m", "loong_core.cli.main", "sample", "--checkpoint",
                           str(run_dir), "--out", str(tmp_path / "x.png")], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "holds a 'llama' model (experiment llama_debug), not a diffusion model" in proc.stderr
    assert "loong generate" in proc.stderr
