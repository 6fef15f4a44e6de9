"""``loong eval perplexity`` and ``loong generate`` agree with transformers on the same HF model."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loong_llm.hf.testing import add_mtp_layers, write_hf_model

PROMPT = "Install and train"
SEQ = 64


def loong(*args: str) -> str:
    cmd = [sys.executable, "-m", "loong_core.cli.main", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr[-6000:]}"
    return result.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A tiny random Qwen3 with a 256-token byte-level BPE, and a text file."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("infer")
    text = (Path(__file__).parents[2] / "README.md").read_text()[:2000]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(
        vocab_size=256, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    directory = write_hf_model("qwen3", root / "qwen3", seed=1)
    tok.save(str(directory / "tokenizer.json"))
    (root / "text.txt").write_text(text)
    return directory, root / "text.txt", tok, text


def _transformers_perplexity(directory, ids: list[int]) -> tuple[float, int]:
    """Perplexity of ``ids`` in windows of SEQ tokens by transformers' model in ``directory``."""
    import torch
    import transformers as tf

    ref = tf.AutoModelForCausalLM.from_pretrained(directory).eval()
    nll, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, SEQ):
            chunk = torch.tensor([ids[start: start + SEQ + 1]])
            logits = ref(chunk[:, :-1]).logits[0]
            nll += float(torch.nn.functional.cross_entropy(logits, chunk[0, 1:], reduction="sum"))
            count += chunk.shape[1] - 1
    return math.exp(nll / count), count


def test_perplexity_matches_transformers(model):
    directory, text_file, tok, text = model
    got = json.loads(loong("eval", "perplexity", "--hf", str(directory), "--text", str(text_file),
                           "--seq-length", str(SEQ), "--json"))
    ids = tok.encode(text).ids
    perplexity, count = _transformers_perplexity(directory, ids)
    assert got["tokens"] == count == len(ids) - 1
    assert got["perplexity"] == pytest.approx(perplexity, rel=1e-5)


@pytest.mark.parametrize("family", ["deepseek_v32+mtp", "glm4_moe", "minimax_m2", "qwen3_next",
                                    "qwen3_5", "qwen3_5_moe", "deepseek_v3+mtp"])
def test_new_families_evaluate_like_transformers_with_the_family_from_config(model, tmp_path, family):
    """``loong eval perplexity --hf DIR`` (no --family) on each newer family's HF folder (with
    ``+mtp``: MTP layers stored, which loong builds and transformers drops; the main model's
    perplexity and generation are the same)."""
    _, text_file, tok, text = model
    name, _, variant = family.partition("+")
    directory = write_hf_model(name, tmp_path / name, seed=4)
    if variant == "mtp":
        add_mtp_layers(directory, 1)
    tok.save(str(directory / "tokenizer.json"))
    got = json.loads(loong("eval", "perplexity", "--hf", str(directory), "--text", str(text_file),
                           "--seq-length", str(SEQ), "--json"))
    perplexity, _ = _transformers_perplexity(directory, tok.encode(text).ids)
    assert got["perplexity"] == pytest.approx(perplexity, rel=1e-5)
    generated = loong("generate", "--hf", str(directory), "--prompt", PROMPT, "--max-new-tokens", "4")
    assert generated.startswith(PROMPT)


def test_perplexity_prints_one_line(model):
    directory, text_file, _, _ = model
    line = loong("eval", "perplexity", "--hf", str(directory), "--text", str(text_file))
    assert line.startswith("perplexity: ") and float(line.split()[1]) > 1.0


def test_greedy_generation_matches_transformers(model):
    import torch
    import transformers as tf

    directory, _, tok, _ = model
    got = loong("generate", "--hf", str(directory), "--prompt", PROMPT, "--max-new-tokens", "8")
    ref = tf.AutoModelForCausalLM.from_pretrained(directory).eval()
    ids = torch.tensor([tok.encode(PROMPT).ids])
    with torch.no_grad():
        out = ref.generate(ids, max_new_tokens=8, do_sample=False, attention_mask=torch.ones_like(ids))
    assert got == PROMPT + tok.decode(out[0, ids.shape[1]:].tolist())
