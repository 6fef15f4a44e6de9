"""Testing kit of InternVL: tiny random ``InternVLForConditionalGeneration`` models (built in code,
no downloads), a batch of two samples whose images are cut into 2 and 3 tiles, and a parity check
of our model's logits against transformers'.

Parity, one process per rank:
``torchrun --nproc-per-node N -m loong_vlm.internvl.testing OUT.json HF_DIR... [--tp T]``
writes ``{dir name: max |loong - transformers|}``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

VOCAB, IMAGE, START, END = 128, 120, 118, 119
TILE, PATCH = 16, 4
TOKENS_PER_TILE = (TILE // PATCH // 2) ** 2  # after the 2x2 pixel shuffle
#: variant -> (text model_type, vision_config overrides): InternVL 2.5 / 3 (InternViT-300M style,
#: Qwen2 text) and an InternViT-6B-style tower (RMSNorm, whole-projection q/k norms, a final
#: LayerNorm, no q/k/v biases) over Qwen3 text (InternVL 3.5)
VARIANTS = {"qwen2": ("qwen2", {"attention_bias": True}),
            "qwen3_6b_style": ("qwen3", {"norm_type": "rms_norm", "use_qk_norm": True, "use_mean_pooling": False,
                                         "attention_bias": False})}


def hf_config(variant: str = "qwen2"):
    """A transformers InternVL config small enough for CPU tests (16-pixel tiles of 4-pixel
    patches: 4 tokens per tile after the pixel shuffle)."""
    from transformers import InternVLConfig

    text_type, vision_overrides = VARIANTS[variant]
    text = dict(model_type=text_type, vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6)
    if text_type == "qwen3":
        text["head_dim"] = 32
    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  image_size=[TILE, TILE], patch_size=[PATCH, PATCH], layer_scale_init_value=0.1, **vision_overrides)
    return InternVLConfig(vision_config=vision, text_config=text, image_token_id=IMAGE, downsample_ratio=0.5,
                          image_seq_length=TOKENS_PER_TILE, tie_word_embeddings=False)


def write_hf_model(directory: Path, variant: str = "qwen2", seed: int = 0) -> Path:
    """Save a randomly initialised tiny InternVL (std 0.1, non-trivial norms and layer scales) in fp32."""
    import torch
    from transformers import InternVLForConditionalGeneration

    torch.manual_seed(seed)
    model = InternVLForConditionalGeneration(hf_config(variant)).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ("norm" in name and name.endswith("weight")) or "lambda_" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.1)
    model.save_pretrained(directory)
    return Path(directory)


def sample_batch(seq_length: int = 40) -> dict:
    """Two samples: an image of 2 tiles in the first, one of 3 tiles in the second, each as
    ``<img> <IMG_CONTEXT> x tokens </img>`` among text; ``pixel_values`` ``[5, 3, 16, 16]``."""
    import torch

    g = torch.Generator().manual_seed(0)

    def text(n):
        return torch.randint(0, START, (n,), generator=g).tolist()

    rows = []
    for before, tiles in ((3, 2), (6, 3)):
        row = text(before) + [START] + [IMAGE] * (TOKENS_PER_TILE * tiles) + [END]
        rows.append(row + text(seq_length - len(row)))
    return {"tokens": torch.tensor(rows), "pixel_values": torch.randn(5, 3, TILE, TILE, generator=g)}


def reference_logits(hf_dir: Path, batch: dict):
    """transformers' logits of ``batch``."""
    import torch
    from transformers import InternVLForConditionalGeneration

    ref = InternVLForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return ref(input_ids=batch["tokens"], pixel_values=batch["pixel_values"]).logits


def parity_main(argv: list[str] | None = None) -> int:
    """One rank of the parity check (see the module docstring)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("hf_dirs", nargs="+")
    parser.add_argument("--tp", type=int, default=1)
    args = parser.parse_args(argv)

    import torch

    from loong_core.config.schema import ParallelConfig
    from loong_vlm import parity

    batch = sample_batch()
    references = {d: reference_logits(Path(d), batch) for d in args.hf_dirs}  # before the cpu backend's patches
    parity.start_ranks()
    from loong_vlm.internvl.config import InternVLConfig
    from loong_vlm.internvl.provider import InternVLProvider

    tokens = batch["tokens"]
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    results = {}
    for hf_dir in args.hf_dirs:
        provider = InternVLProvider(InternVLConfig(name="internvl", init_from_hf=hf_dir))
        model = parity.build_loaded_model(provider, ParallelConfig(tensor_model_parallel_size=args.tp))
        with torch.no_grad():
            logits = parity.full_logits(model(tokens, positions, None, images=batch["pixel_values"][None]), VOCAB)
        results[Path(hf_dir).name] = (logits - references[hf_dir]).abs().max().item()
        parity.finish_layout()
    parity.write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(parity_main())
