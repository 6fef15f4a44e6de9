"""Testing kit of ERNIE-4.5-VL: a tiny random ``Ernie4_5_VLMoeForConditionalGeneration`` (built in
code, no downloads), a batch with two images of different sizes and a 4-frame video, and a parity
check of our model's logits against transformers'.

Parity, one process per rank:
``torchrun --nproc-per-node N -m loong_vlm.ernie4_5_vl.testing OUT.json HF_DIR LAYOUT...`` (layouts
``tp1``, ``tp2`` (sequence parallel), ``ep2``, built one after the other) writes
``{layout: max |loong - transformers|, "max_abs_ref": max |transformers|, "positions_equal": ...}``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

VOCAB, IMAGE, VIDEO = 256, 250, 251
IMAGE_START, IMAGE_END, VIDEO_START, VIDEO_END = 246, 247, 248, 249
PATCH, MERGE = 4, 2
#: parity layouts (``ParallelConfig`` fields); MoE under TP needs sequence parallelism
LAYOUTS = {"tp1": {}, "tp2": {"tensor_model_parallel_size": 2, "sequence_parallel": True},
           "ep2": {"expert_model_parallel_size": 2}}


def hf_config():
    """A transformers ERNIE-4.5-VL config small enough for CPU tests: a 2-block ViT (width 32, 4
    heads) and a 3-layer decoder (width 64, 4 heads / 2 KV heads, 3D RoPE sections [3, 3, 2]):
    one dense layer, then two MoE layers of 4 text experts (width 32) and 4 vision experts
    (width 16), top-2, one shared expert."""
    from transformers import Ernie4_5_VLMoeConfig

    text = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, moe_intermediate_size=[32, 16], moe_k=2,
                moe_num_experts=4, moe_num_shared_experts=1, mlp_layer_types=["dense", "sparse", "sparse"],
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [3, 3, 2]})
    vision = dict(depth=2, hidden_size=32, num_heads=4, intermediate_size=64, patch_size=PATCH,
                  spatial_merge_size=MERGE, rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
    return Ernie4_5_VLMoeConfig(text_config=text, vision_config=vision, image_token_id=IMAGE, video_token_id=VIDEO,
                                image_start_token_id=IMAGE_START, image_end_token_id=IMAGE_END,
                                video_start_token_id=VIDEO_START, video_end_token_id=VIDEO_END,
                                tie_word_embeddings=False)


def write_hf_model(directory: Path, seed: int = 0) -> Path:
    """Save a randomly initialised tiny ERNIE-4.5-VL in fp32 (std 0.1, non-trivial norms and
    expert-score biases)."""
    import torch
    from transformers import Ernie4_5_VLMoeForConditionalGeneration

    torch.manual_seed(seed)
    model = Ernie4_5_VLMoeForConditionalGeneration(hf_config()).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ("norm" in name or ".ln." in name) and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("e_score_correction_bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.1)
    model.save_pretrained(directory)
    return Path(directory)


def sample_batch(seq_length: int = 40) -> dict:
    """Two samples: a 4x4-patch image in the first; a 4x6-patch image and a 4-frame 4x4-patch video
    (8 tokens) in the second, each between its start / end tokens. Pixel rows are shared by
    transformers and loong (both take merge-block order)."""
    import torch

    g = torch.Generator().manual_seed(0)

    def text(n):
        return torch.randint(0, IMAGE_START, (n,), generator=g).tolist()

    images, videos = torch.tensor([[1, 4, 4], [1, 4, 6]]), torch.tensor([[4, 4, 4]])
    first = text(3) + [IMAGE_START] + [IMAGE] * 4 + [IMAGE_END] + text(5)
    second = text(2) + [IMAGE_START] + [IMAGE] * 6 + [IMAGE_END] + text(2)
    second += [VIDEO_START] + [VIDEO] * 8 + [VIDEO_END] + text(3)
    tokens = torch.tensor([r + text(seq_length - len(r)) for r in (first, second)])
    kinds = (tokens == IMAGE).long() + 2 * (tokens == VIDEO).long()
    moe_kinds = kinds.clone()
    moe_kinds[(tokens == IMAGE_START) | (tokens == IMAGE_END)] = 1
    moe_kinds[(tokens == VIDEO_START) | (tokens == VIDEO_END)] = 2
    pixels = torch.randn(int(images.prod(-1).sum()), 3 * PATCH * PATCH, generator=g)
    video_pixels = torch.randn(int(videos.prod(-1).sum()), 3 * PATCH * PATCH, generator=g)
    return {"tokens": tokens, "mm_token_type_ids": kinds, "moe_mm_token_type_ids": moe_kinds,
            "pixel_values": pixels, "image_grid_thw": images, "pixel_values_videos": video_pixels,
            "video_grid_thw": videos}


def loong_positions(batch: dict):
    """``[b, 3, s]`` position ids of ``batch`` by :func:`~loong_vlm.ernie4_5_vl.rope.ernie_position_ids`
    (each sample with its own images / videos, in order)."""
    import torch

    from loong_vlm.ernie4_5_vl.rope import ernie_position_ids

    images, videos = list(batch["image_grid_thw"]), list(batch["video_grid_thw"])
    rows = []
    for tokens in batch["tokens"]:
        n_img, n_vid = int((tokens == IMAGE_START).sum()), int((tokens == VIDEO_START).sum())
        mine_i, images = images[:n_img], images[n_img:]
        mine_v, videos = videos[:n_vid], videos[n_vid:]
        rows.append(ernie_position_ids(tokens, torch.stack(mine_i) if mine_i else None,
                                       torch.stack(mine_v) if mine_v else None, image_token_id=IMAGE,
                                       video_token_id=VIDEO, spatial_merge_size=MERGE))
    return torch.stack(rows)


def reference(hf_dir: Path, batch: dict):
    """transformers' logits of ``batch``, its ``[3, b, s]`` position ids, and how far the logits move
    when every token is routed to the text experts."""
    import torch
    from transformers import Ernie4_5_VLMoeForConditionalGeneration

    ref = Ernie4_5_VLMoeForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32).eval()
    keys = ("mm_token_type_ids", "moe_mm_token_type_ids", "pixel_values", "image_grid_thw",
            "pixel_values_videos", "video_grid_thw")
    with torch.no_grad():
        logits = ref(input_ids=batch["tokens"], **{k: batch[k] for k in keys}).logits
        positions, _ = ref.model.get_rope_index(batch["tokens"], batch["mm_token_type_ids"],
                                                batch["image_grid_thw"], batch["video_grid_thw"])
        inputs = {k: batch[k] for k in keys}
        inputs["moe_mm_token_type_ids"] = torch.zeros_like(batch["tokens"])
        text_only = ref(input_ids=batch["tokens"], **inputs).logits
    return logits, positions, (text_only - logits).abs().max().item()


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
    from loong_vlm.ernie4_5_vl.config import Ernie45VLConfig

    batch = sample_batch()
    # the references before the cpu backend's patches
    ref_logits, ref_positions, text_routing_diff = reference(Path(args.hf_dir), batch)
    positions = loong_positions(batch)
    parity.start_ranks()
    from loong_vlm.ernie4_5_vl.provider import Ernie45VLProvider

    visual = {k: batch[k] for k in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")}
    results = {"max_abs_ref": ref_logits.abs().max().item(), "text_routing_diff": text_routing_diff,
               "positions_equal": bool(torch.equal(positions.transpose(0, 1), ref_positions))}
    for layout in args.layouts:
        provider = Ernie45VLProvider(Ernie45VLConfig(name="ernie4_5_vl", init_from_hf=args.hf_dir))
        model = parity.build_loaded_model(provider, ParallelConfig(**LAYOUTS[layout]))
        with torch.no_grad():
            logits = model(batch["tokens"], positions, None, **visual)
            logits = parity.full_logits(logits, VOCAB)
        results[layout] = (logits - ref_logits).abs().max().item()
        parity.finish_layout()
    parity.write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(parity_main())
