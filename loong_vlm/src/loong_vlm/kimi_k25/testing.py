"""Testing kit of Kimi-K2.5: a tiny random ``Kimi_K25ForConditionalGeneration`` (MoonViT over a
DeepSeek-V3 decoder with MLA and routed + shared experts; built in code, no downloads), a batch
with two images of different sizes and a video cut into clips of 4 and 2 frames, and a parity
check of our model's logits against transformers'.

Parity, one process per rank:
``torchrun --nproc-per-node N -m loong_vlm.kimi_k25.testing OUT.json HF_DIR LAYOUT...`` (layouts
``tp1``, ``tp2`` (with sequence parallelism), ``ep2``, built one after the other) writes
``{layout: max |loong - transformers|, "max_abs_ref": max |transformers|}``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

VOCAB, IMAGE, VIDEO, START, END = 256, 250, 251, 248, 249
PATCH, MERGE = 4, 2
#: parity layouts (``ParallelConfig`` fields); MoE under TP needs sequence parallelism
LAYOUTS = {"tp1": {}, "tp2": {"tensor_model_parallel_size": 2, "sequence_parallel": True},
           "ep2": {"expert_model_parallel_size": 2}}


def hf_config():
    """A transformers Kimi-K2.5 config small enough for CPU tests: a 2-block MoonViT (width 32,
    4 heads, a 6x6 position table, 4 frame embeddings) over loong_llm's tiny DeepSeek-V3 test
    decoder (one dense layer, then 4 routed experts top-2 in 2 groups and a shared expert)."""
    from transformers import Kimi_K25Config

    from loong_llm.hf.testing import hf_config as text_config

    vision = dict(patch_size=PATCH, pos_emb_height=6, pos_emb_width=6, pos_emb_time=4, num_attention_heads=4,
                  num_hidden_layers=2, hidden_size=32, intermediate_size=64, merge_kernel_size=[MERGE, MERGE],
                  rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
    return Kimi_K25Config(text_config=text_config("deepseek_v3").to_dict(), vision_config=vision,
                          projection_hidden_size=32, image_token_id=IMAGE, video_token_id=VIDEO,
                          vision_start_token_id=START, vision_end_token_id=END, tie_word_embeddings=False)


def write_hf_model(directory: Path, seed: int = 0) -> Path:
    """Save a randomly initialised tiny Kimi-K2.5 in fp32 (std 0.1, non-trivial norms and router
    biases)."""
    import torch
    from transformers import Kimi_K25ForConditionalGeneration

    torch.manual_seed(seed)
    model = Kimi_K25ForConditionalGeneration(hf_config()).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.1)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn_like(b))
    model.save_pretrained(directory)
    return Path(directory)


def merge_block_order(pixel_values, grid_thw, merge: int = MERGE):
    """Raster-ordered patches ``[P, C, p, p]`` (transformers' Kimi processors) as loong's rows
    ``[P, C * p * p]``, each frame's patches in merge-block order."""
    import torch

    from loong_vlm.encoders.patch_geometry import merge_block_coordinates

    rows, start = [], 0
    for t, h, w in grid_thw.tolist():
        row, col = merge_block_coordinates(h, w, merge)
        for _ in range(t):
            rows.append(pixel_values[start + row * w + col])
            start += h * w
    return torch.cat(rows).reshape(pixel_values.shape[0], -1)


def sample_batch(seq_length: int = 40) -> dict:
    """Two samples: a 4x4-patch image in the first; a 4x6-patch image and a 6-frame video cut into
    clips of 4 and 2 frames (4 tokens each) in the second. transformers' inputs (raster patches
    ``[P, 3, 4, 4]``, the video as its processor's two clip grids) plus loong's
    (``loong_pixel_values`` / ``loong_pixel_values_videos`` in merge-block order, the video as the
    one ``[6, 4, 4]`` grid loong's data gives: the encoder cuts it into the same clips)."""
    import torch

    g = torch.Generator().manual_seed(0)

    def text(n):
        return torch.randint(0, START, (n,), generator=g).tolist()

    images, clips = torch.tensor([[1, 4, 4], [1, 4, 6]]), torch.tensor([[4, 4, 4], [2, 4, 4]])
    first = text(3) + [START] + [IMAGE] * 4 + [END] + text(5)
    second = text(2) + [START] + [IMAGE] * 6 + [END] + text(2)
    second += [START] + [VIDEO] * 4 + [END] + text(1) + [START] + [VIDEO] * 4 + [END] + text(2)
    rows = [r + text(seq_length - len(r)) for r in (first, second)]
    pixels = torch.randn(int(images.prod(-1).sum()), 3, PATCH, PATCH, generator=g)
    videos = torch.randn(int(clips.prod(-1).sum()), 3, PATCH, PATCH, generator=g)
    return {"tokens": torch.tensor(rows), "pixel_values": pixels, "image_grid_thw": images,
            "pixel_values_videos": videos, "video_grid_thw": clips,
            "loong_pixel_values": merge_block_order(pixels, images),
            "loong_pixel_values_videos": merge_block_order(videos, clips),
            "loong_video_grid_thw": torch.tensor([[6, 4, 4]])}


def reference_logits(hf_dir: Path, batch: dict):
    """transformers' logits of ``batch``."""
    import torch
    from transformers import Kimi_K25ForConditionalGeneration

    ref = Kimi_K25ForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32).eval()
    keys = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
    with torch.no_grad():
        return ref(input_ids=batch["tokens"], **{k: batch[k] for k in keys}).logits


def parity_main(argv: list[str] | None = None) -> int:
    """One rank of the parity check (see the module docstring)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("hf_dir")
    parser.add_argument("layouts", nargs="+", choices=sorted(LAYOUTS))
    args = parser.parse_args(argv)

    import torch

    from loong_core.config.schema import ParallelConfig
    from loong_vlm import parity
    from loong_vlm.kimi_k25.config import KimiK25Config

    batch = sample_batch()
    reference = reference_logits(Path(args.hf_dir), batch)  # before the cpu backend's patches
    parity.start_ranks()
    from loong_vlm.kimi_k25.provider import KimiK25Provider

    tokens = batch["tokens"]
    visual = {"pixel_values": batch["loong_pixel_values"], "image_grid_thw": batch["image_grid_thw"],
              "pixel_values_videos": batch["loong_pixel_values_videos"],
              "video_grid_thw": batch["loong_video_grid_thw"]}
    results = {"max_abs_ref": reference.abs().max().item()}
    for layout in args.layouts:
        provider = KimiK25Provider(KimiK25Config(name="kimi_k25", init_from_hf=args.hf_dir))
        model = parity.build_loaded_model(provider, ParallelConfig(**LAYOUTS[layout]))
        with torch.no_grad():
            positions = torch.arange(tokens.shape[1]).expand_as(tokens)
            logits = parity.full_logits(model(tokens, positions, None, **visual), VOCAB)
        results[layout] = (logits - reference).abs().max().item()
        parity.finish_layout()
    parity.write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(parity_main())
