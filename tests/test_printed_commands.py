"""Commands loong prints for the user to run next work as printed (with small step counts)."""

from __future__ import annotations

import shlex
import subprocess
import sys

from loong_core.testing import read_metrics, run_train

SMALL = ["trainer.train_iters=2", "trainer.eval_interval=0", "trainer.save_at_end=false",
         "trainer.progress_bar=false", "trainer.tensorboard=false"]


def _printed(output: str, prefix: str) -> list[str]:
    line = next(x for x in output.splitlines() if x.startswith(prefix))
    words = shlex.split(line[len(prefix):])
    assert words[:2] == ["loong", "train"], line
    return words[2:]


def test_hf_to_loong_train_from_it_command_trains_as_printed(tmp_path):
    from loong_llm.hf.testing import write_hf_model

    src = write_hf_model("qwen3", tmp_path / "src", seed=5, vocab_size=512)
    out = subprocess.run([sys.executable, "-m", "loong_core.cli.main", "convert", "hf-to-loong",
                          "--family", "qwen3", str(src), str(tmp_path / "ckpt")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    overrides = _printed(out.stdout, "train from it: ")
    assert overrides[0].startswith("model=") and "model.vocab_size=512" in overrides
    run_train([*overrides, *SMALL, f"trainer.run_dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [2]
