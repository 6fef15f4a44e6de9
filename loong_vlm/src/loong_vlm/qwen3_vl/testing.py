"""Testing kit of Qwen3-VL and Qwen3-VL-MoE: a tiny random ``Qwen3VLForConditionalGeneration``
(or ``Qwen3VLMoeForConditionalGeneration``; built in code, no downloads), a batch with two images
of different sizes and a 2-frame video, and a parity check of our model's logits against
transformers'.

Parity, one process per rank:
``torchrun --nproc-per-node N -m loong_vlm.qwen3_vl.testing OUT.json HF_DIR --tp T [--ep E] [--sp]``
writes ``{"max_abs_diff": ...}`` (and ``"max_abs_diff_sp"``, with sequence parallelism, for ``--sp``);
the family is the directory's ``model_type``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

VOCAB, IMAGE, VIDEO, START, END = 128, 120, 121, 118, 119


def hf_config(moe: bool = False):
    """A transformers Qwen3-VL config small enough for CPU tests (3 decoder layers, deepstack
    after vision blocks 0 and 2, interleaved MRoPE sections [6, 5, 5] of a 32-wide head); with
    ``moe`` a Qwen3-VL-MoE one (4 experts of width 24, top-2, in every layer)."""
    from transformers import Qwen3VLConfig, Qwen3VLMoeConfig

    text = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 5000.0,
                                                    "mrope_section": [6, 5, 5], "mrope_interleaved": True})
    vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=4, in_channels=3, patch_size=4,
                  temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64, num_position_embeddings=36,
                  deepstack_visual_indexes=[0, 2])
    if moe:
        text.update(moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1)
    config_class = Qwen3VLMoeConfig if moe else Qwen3VLConfig
    return config_class(text_config=text, vision_config=vision, image_token_id=IMAGE, video_token_id=VIDEO,
                        vision_start_token_id=START, vision_end_token_id=END, tie_word_embeddings=not moe)


def _model_class(moe: bool):
    import transformers as tf

    return tf.Qwen3VLMoeForConditionalGeneration if moe else tf.Qwen3VLForConditionalGeneration


def write_hf_model(directory: Path, seed: int = 0, moe: bool = False) -> Path:
    """Save a randomly initialised tiny Qwen3-VL (``moe``: Qwen3-VL-MoE, untied output layer) in
    fp32 (std 0.1, non-trivial norms)."""
    import torch

    torch.manual_seed(seed)
    model = _model_class(moe)(hf_config(moe)).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.1)
    model.save_pretrained(directory)
    return directory


def sample_batch(seq_length: int = 32) -> dict:
    """Two samples: a 4x4-patch image in the first; a 4x6-patch image and a 2-frame video
    (frames separated by a timestamp token) in the second. Visual keys of ``docs/vlm_inputs.md``
    plus ``mm_token_type_ids`` (transformers' processor output) and ``grids_per_sample``."""
    import torch

    g = torch.Generator().manual_seed(0)

    def text(n):
        return torch.randint(0, START, (n,), generator=g).tolist()

    image_a, image_b, video = [1, 4, 4], [1, 4, 6], [2, 4, 4]
    first = text(3) + [START] + [IMAGE] * 4 + [END] + text(5)
    second = text(2) + [START] + [IMAGE] * 6 + [END] + text(2)
    second += [START] + [VIDEO] * 4 + [END] + text(1) + [START] + [VIDEO] * 4 + [END] + text(2)
    rows = [r + text(seq_length - len(r)) for r in (first, second)]
    tokens = torch.tensor(rows)
    patches = lambda grids: sum(t * h * w for t, h, w in grids)  # noqa: E731
    return {
        "tokens": tokens,
        "mm_token_type_ids": (tokens == IMAGE).long() + 2 * (tokens == VIDEO).long(),
        "pixel_values": torch.randn(patches([image_a, image_b]), 3 * 2 * 4 * 4, generator=g),
        "image_grid_thw": torch.tensor([image_a, image_b]),
        "pixel_values_videos": torch.randn(patches([video]), 3 * 2 * 4 * 4, generator=g),
        "video_grid_thw": torch.tensor([video]),
        "grids_per_sample": [([image_a], []), ([image_b], [video])],
    }


def loong_position_ids(batch: dict):
    """``[b, 3, s]`` Qwen3-VL position ids of :func:`sample_batch`."""
    import torch

    from loong_vlm.qwen3_vl.rope import qwen3_vl_position_ids

    rows = []
    for tokens, (images, videos) in zip(batch["tokens"], batch["grids_per_sample"]):
        rows.append(qwen3_vl_position_ids(tokens, torch.tensor(images).reshape(-1, 3),
                                          torch.tensor(videos).reshape(-1, 3), image_token_id=IMAGE,
                                          video_token_id=VIDEO, spatial_merge_size=2))
    return torch.stack(rows)


def is_moe(hf_dir: Path) -> bool:
    """Whether ``hf_dir`` holds a Qwen3-VL-MoE model."""
    return json.loads((Path(hf_dir) / "config.json").read_text())["model_type"] == "qwen3_vl_moe"


def reference_logits(hf_dir: Path, batch: dict):
    """transformers' logits of ``batch``."""
    import torch

    ref = _model_class(is_moe(hf_dir)).from_pretrained(hf_dir, dtype=torch.float32).eval()
    keys = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "mm_token_type_ids")
    with torch.no_grad():
        return ref(input_ids=batch["tokens"], **{k: batch[k] for k in keys}).logits


def parity_main(argv: list[str] | None = None) -> int:
    """One rank of the parity check (see the module docstring)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("hf_dir")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--ep", type=int, default=1)
    parser.add_argument("--sp", action="store_true", help="also with sequence parallelism (--tp > 1)")
    args = parser.parse_args(argv)

    import torch

    from loong_core.config.schema import ParallelConfig
    from loong_vlm import parity
    from loong_vlm.qwen3_vl.config import Qwen3VLConfig, Qwen3VLMoeConfig

    batch = sample_batch()
    reference = reference_logits(Path(args.hf_dir), batch)  # before the cpu backend's patches
    parity.start_ranks()
    from loong_vlm.qwen3_vl.model import Qwen3VLMoeProvider, Qwen3VLProvider

    moe = is_moe(Path(args.hf_dir))
    provider_class, config_class = (Qwen3VLMoeProvider, Qwen3VLMoeConfig) if moe else (Qwen3VLProvider, Qwen3VLConfig)
    visual = {k: batch[k] for k in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")}
    results = {}
    for name, sequence_parallel in (("max_abs_diff", False), ("max_abs_diff_sp", True))[: 1 + args.sp]:
        provider = provider_class(config_class(name="qwen3_vl_moe" if moe else "qwen3_vl", init_from_hf=args.hf_dir))
        p = ParallelConfig(tensor_model_parallel_size=args.tp, expert_model_parallel_size=args.ep,
                           sequence_parallel=sequence_parallel or (moe and args.tp > 1))
        model = parity.build_loaded_model(provider, p)
        with torch.no_grad():
            logits = parity.full_logits(model(batch["tokens"], loong_position_ids(batch), None, **visual), VOCAB)
        results[name] = (logits - reference).abs().max().item()
        parity.finish_layout()
    parity.write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(parity_main())
