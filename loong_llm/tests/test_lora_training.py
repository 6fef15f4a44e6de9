"""LoRA fine-tuning through `loong train`, merged into plain weights on export to Hugging Face."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loong_core.testing import losses, run_train


def _loong(*args):
    proc = subprocess.run([sys.executable, "-m", "loong_core.cli.main", *args], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_lora_run_exports_merged_weights_with_the_same_perplexity(tiny, tmp_path):
    run_dir = tmp_path / "lora"
    run_train([*tiny, f"trainer.run_dir={run_dir}", "trainer.train_iters=6", "model.lora.rank=4",
               "model.lora.alpha=8", "optim.lr=1e-2"])
    curve = losses(run_dir)
    assert curve[6] < curve[1]
    checkpoint = run_dir / "checkpoints" / "iter_0000006"
    hf_dir = tmp_path / "hf"
    _loong("convert", "loong-to-hf", str(checkpoint), str(hf_dir), "--dtype", "float32")
    names = json.loads((hf_dir / "model.safetensors.index.json").read_text())["weight_map"] \
        if (hf_dir / "model.safetensors.index.json").exists() else None
    if names is not None:
        assert not any("lora" in n for n in names)
    text = tmp_path / "text.txt"
    text.write_text("To be, or not to be, that is the question:\n" * 20)
    # the BPE the run's dataset trained (shakespeare_small: 512 tokens) lives in the data cache
    tokenizer = next(Path(os.environ["LOONG_CACHE"]).glob("text/shakespeare-v512-*/tokenizer.json"))
    ours = json.loads(_loong("eval", "perplexity", "--checkpoint", str(checkpoint), "--text", str(text),
                             "--tokenizer", str(tokenizer),
                             "--seq-length", "64", "--json"))
    theirs = json.loads(_loong("eval", "perplexity", "--hf", str(hf_dir), "--text", str(text),
                               "--tokenizer", str(tokenizer),
                               "--seq-length", "64", "--json"))
    assert theirs["perplexity"] == pytest.approx(ours["perplexity"], rel=1e-4)
