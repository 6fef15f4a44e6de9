"""``loong data encode-latents`` with tiny random encoders, and training from the cache it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from loong_core.testing import losses, run_train

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
CAPTIONS = ["a red square", "a blue circle on grass", "green", "two small red dots on a blue sky"]


@pytest.fixture(scope="module")
def encoders(tmp_path_factory):
    """A tiny AutoencoderKLWan (z_dim 4, /4 spatially), a tiny T5 encoder and a word-level tokenizer."""
    from diffusers import AutoencoderKLWan
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = tmp_path_factory.mktemp("encoders")
    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 2], num_res_blocks=1,
                           temperal_downsample=[False, True], latents_mean=[0.1, -0.2, 0.3, 0.0],
                           latents_std=[1.5, 0.5, 2.0, 1.0])
    vae.save_pretrained(root / "vae")
    words = sorted({w for c in CAPTIONS for w in c.split()})
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                                                unk_token="<unk>")
    fast.save_pretrained(root / "tokenizer")
    t5 = transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=len(vocab), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, pad_token_id=0))
    t5.save_pretrained(root / "t5")
    return root


@pytest.fixture(scope="module")
def cache(encoders, tmp_path_factory):
    from PIL import Image

    data = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    with open(data / "captions.jsonl", "w") as f:
        for i, caption in enumerate(CAPTIONS):
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(data / f"img{i}.png")
            f.write(json.dumps({"file": f"img{i}.png", "caption": caption}) + "\n")
    out = tmp_path_factory.mktemp("out") / "cache"
    proc = subprocess.run(
        [sys.executable, "-m", "loong_core.cli.main", "data", "encode-latents", str(data), str(out),
         "--captions", str(data / "captions.jsonl"), "--vae", str(encoders / "vae"),
         "--text-encoder", str(encoders / "t5"), "--tokenizer", str(encoders / "tokenizer"),
         "--resolution", "32", "--batch-size", "4"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return data, out, json.loads(proc.stdout)


def test_cache_holds_the_exact_vae_latents_and_text_embeddings(encoders, cache):
    from diffusers import AutoencoderKLWan
    from PIL import Image
    from safetensors.torch import load_file

    data, out, summary = cache
    assert summary["samples"] == 4 and summary["latent_shapes"] == [[4, 1, 8, 8]] and summary["text_dim"] == 32
    index = json.loads((out / "index.json").read_text())
    assert [r["caption"] for r in index["samples"]] == CAPTIONS
    assert index["vae"]["latents_std"] == [1.5, 0.5, 2.0, 1.0]
    assert not any(p.name.startswith(".") for p in out.parent.iterdir())  # the temp dir was renamed

    vae = AutoencoderKLWan.from_pretrained(encoders / "vae").eval()
    pixels = torch.stack([torch.from_numpy(np.asarray(Image.open(data / f"img{i}.png"), dtype=np.float32))
                          for i in range(4)]).permute(0, 3, 1, 2)[:, :, None] / 127.5 - 1.0
    with torch.no_grad():
        z = vae.encode(pixels).latent_dist.mode()
    mean = torch.tensor([0.1, -0.2, 0.3, 0.0]).view(1, 4, 1, 1, 1)
    std = torch.tensor([1.5, 0.5, 2.0, 1.0]).view(1, 4, 1, 1, 1)
    expected = (z - mean) / std
    t5 = transformers.T5EncoderModel.from_pretrained(encoders / "t5").eval()
    tok = transformers.AutoTokenizer.from_pretrained(encoders / "tokenizer")
    for i, record in enumerate(index["samples"]):
        assert record["latent_shape"] == [4, 1, 8, 8]
        # bit-equal when both sides use the same thread count; other tests in this process may have
        # changed torch's threads, which reorders the convolution sums by a few ulps
        torch.testing.assert_close(load_file(out / record["latents"])["latents"], expected[i],
                                   atol=1e-6, rtol=0)
        ids = tok(CAPTIONS[i], return_tensors="pt")["input_ids"]
        with torch.no_grad():
            direct = t5(input_ids=ids).last_hidden_state[0]
        got = load_file(out / record["text"])["text_embeds"]
        assert got.shape == (len(CAPTIONS[i].split()), 32) == direct.shape
        torch.testing.assert_close(got, direct, atol=1e-5, rtol=1e-5)


def test_wan_debug_trains_from_the_cache_and_samples_from_a_prompt(cache, encoders, tmp_path, quiet):
    _, out, _ = cache
    run_dir = tmp_path / "run"
    run_train(["experiment=wan_debug", "data=latent_cache", f"data.path={out}", "trainer.train_iters=2",
               *quiet, f"trainer.run_dir={run_dir}"])
    got = losses(run_dir)
    assert sorted(got) == [1, 2] and all(np.isfinite(v) for v in got.values())

    # the trained text-conditioned model samples from a prompt encoded by the same text encoder
    gif = tmp_path / "sample.gif"
    proc = subprocess.run(
        [sys.executable, "-m", "loong_core.cli.main", "sample", "--checkpoint",
         str(run_dir / "checkpoints" / "iter_0000002"), "--prompt", CAPTIONS[0],
         "--text-encoder", str(encoders / "t5"), "--tokenizer", str(encoders / "tokenizer"),
         "--steps", "2", "--out", str(gif)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert gif.stat().st_size > 0


def test_damaged_latent_cache_is_one_error_naming_the_folder(cache, tmp_path):
    import shutil

    from loong_core.data.manifest import DamagedCacheError
    from loong_diffusion.data.config import LatentCacheConfig
    from loong_diffusion.data.latent_cache import LatentCache

    _, out, _ = cache
    copy = shutil.copytree(out, tmp_path / "cache")
    LatentCache(LatentCacheConfig(name="latent_cache", path=str(copy))).setup()  # intact: fine
    latent = next(p for p in (copy / "latents").iterdir() if p.is_file())
    latent.write_bytes(latent.read_bytes()[:-8])
    with pytest.raises(DamagedCacheError, match=rf"latent cache in {copy} is damaged: latents/{latent.name} "
                                                rf".*Delete {copy} and recreate it \(loong data encode-latents"):
        LatentCache(LatentCacheConfig(name="latent_cache", path=str(copy))).setup()
