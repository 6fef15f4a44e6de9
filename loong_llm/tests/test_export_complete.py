"""A trained run is complete on its own: ``loong convert loong-to-hf`` writes weights, config,
tokenizer and generation config that transformers loads from the folder alone (modes from the
umask), and ``generate`` / ``eval perplexity --checkpoint`` find the run's tokenizer."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

from loong_core.testing import run_train


def loong(*args: str, cwd=None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "loong_core.cli.main", *args], capture_output=True,
                          text=True, timeout=600, cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("export") / "run"
    run_train(["experiment=llama_debug", "trainer.train_iters=2", "trainer.eval_interval=0",
               "trainer.progress_bar=false", "trainer.tensorboard=false", f"trainer.run_dir={path}"])
    return path


def test_export_loads_model_and_tokenizer_from_the_folder_alone(run_dir, tmp_path):
    import torch
    import transformers as tf

    old = os.umask(0o027)
    try:
        loong("convert", "loong-to-hf", str(run_dir), str(tmp_path / "hf"))  # a run directory
    finally:
        os.umask(old)
    alone = shutil.copytree(tmp_path / "hf", tmp_path / "elsewhere" / "hf")
    names = sorted(p.name for p in alone.iterdir())
    assert names == ["config.json", "generation_config.json", "model.safetensors",
                     "tokenizer.json", "tokenizer_config.json"]
    modes = {p.name: stat.S_IMODE(os.stat(tmp_path / "hf" / p.name).st_mode) for p in alone.iterdir()}
    assert set(modes.values()) == {0o640}, modes
    tokenizer = tf.AutoTokenizer.from_pretrained(alone)
    model = tf.AutoModelForCausalLM.from_pretrained(alone)
    generation = json.loads((alone / "generation_config.json").read_text())
    assert tokenizer.eos_token == "<|endoftext|>"
    assert generation["eos_token_id"] == tokenizer.convert_tokens_to_ids("<|endoftext|>")
    ids = tokenizer("To be, or not to be", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids["input_ids"].shape[1] + 4
    assert torch.equal(out[0, :ids["input_ids"].shape[1]], ids["input_ids"][0])


def test_generate_and_perplexity_find_the_runs_tokenizer(run_dir, tmp_path):
    checkpoint = next((run_dir / "checkpoints").iterdir())
    out = loong("generate", "--checkpoint", str(checkpoint), "--prompt", "To be", "--max-new-tokens", "3")
    assert out.stdout.startswith("To be")
    text = tmp_path / "text.txt"
    text.write_text("To be, or not to be, that is the question. " * 8)
    proc = loong("eval", "perplexity", "--checkpoint", str(run_dir), "--text", str(text),
                 "--seq-length", "32", "--json", "--num-threads", "1")
    ppl = json.loads(proc.stdout)
    assert 1.0 < ppl["perplexity"] < 512
    assert f"perplexity over {ppl['tokens'] + 1} tokens: step" in proc.stderr  # progress
