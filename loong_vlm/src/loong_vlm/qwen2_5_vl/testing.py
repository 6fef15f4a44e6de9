"""Testing kit of Qwen2.5-VL: a tiny random transformers model (built in code, no downloads), a
batch with two images of different sizes and a video, and a parity check against transformers.

Parity, one process per rank:
``torchrun --nproc-per-node N -m loong_vlm.qwen2_5_vl.testing OUT.json HF_DIR --tp T [--encoder-tp E]``
writes ``{"max_abs_diff": ...}`` (logits of the loong model loaded through ``model.init_from_hf``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

VOCAB, IMAGE, VIDEO, MERGE = 256, 250, 251, 2
TOKENS_PER_SECOND = 2
#: ``(kind, text length or patch grid)`` of the two samples: 22 tokens each.
SAMPLES = ([("text", 3), ("image", (1, 4, 6)), ("text", 2), ("video", (2, 4, 4)), ("text", 3)],
           [("text", 5), ("image", (1, 8, 4)), ("text", 9)])


def hf_config(vocab_size: int = VOCAB, **vision):
    """A transformers ``Qwen2_5_VLConfig`` small enough for CPU tests (4x4 patches, windows of
    2x2 merged tokens, layer 1 of 3 with full attention: ``model=qwen2_5_vl_debug``'s encoder)."""
    from transformers import Qwen2_5_VLConfig

    text = dict(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=96, max_position_embeddings=512,
                rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=None, eos_token_id=None,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]})
    vision = {**dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, in_channels=3,
                     patch_size=4, spatial_merge_size=MERGE, temporal_patch_size=2, window_size=16,
                     fullatt_block_indexes=[1], out_hidden_size=64, tokens_per_second=TOKENS_PER_SECOND),
              **vision}
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=IMAGE,
                            video_token_id=VIDEO, vision_start_token_id=252, vision_end_token_id=253,
                            tie_word_embeddings=True)


def write_hf_model(directory: Path, seed: int = 0, vocab_size: int = VOCAB, **vision) -> Path:
    """Save a randomly initialised tiny Qwen2.5-VL (std 0.1, non-trivial norms) to ``directory``."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    model = tf.Qwen2_5_VLForConditionalGeneration(hf_config(vocab_size, **vision))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_q" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.1)
    model.save_pretrained(directory)
    return Path(directory)


def sample_batch(patch_dim: int = 96, seed: int = 0) -> dict:
    """Tokens ``[2, 22]``, the Qwen-style visual inputs and MRoPE position ids ``[2, 3, 22]``."""
    import torch

    from loong_vlm.mrope import mrope_position_ids

    gen = torch.Generator().manual_seed(seed)
    rows, images, videos = [], [], []
    for sample in SAMPLES:
        tokens = []
        for kind, value in sample:
            if kind == "text":
                tokens += torch.randint(0, 240, (value,), generator=gen).tolist()
            else:
                (images if kind == "image" else videos).append(value)
                tokens += [IMAGE if kind == "image" else VIDEO] * (value[0] * value[1] * value[2] // MERGE ** 2)
        rows.append(tokens)
    tokens = torch.tensor(rows)
    image_grid, video_grid = torch.tensor(images), torch.tensor(videos)
    seconds = [0.5]
    positions = []
    for i, row in enumerate(tokens):
        grids = {"image_grid_thw": image_grid[i:i + 1], "video_grid_thw": video_grid if i == 0 else None}
        positions.append(mrope_position_ids(row, **grids, image_token_id=IMAGE, video_token_id=VIDEO,
                                            spatial_merge_size=MERGE, tokens_per_second=TOKENS_PER_SECOND,
                                            second_per_grid_ts=seconds if i == 0 else None))
    return {"tokens": tokens, "position_ids": torch.stack(positions),
            "pixel_values": torch.randn(int(image_grid.prod(-1).sum()), patch_dim, generator=gen),
            "image_grid_thw": image_grid,
            "pixel_values_videos": torch.randn(int(video_grid.prod(-1).sum()), patch_dim, generator=gen),
            "video_grid_thw": video_grid, "second_per_grid_ts": torch.tensor(seconds)}


def reference_logits(hf_dir: Path, batch: dict):
    """transformers' logits of ``batch`` (its own position ids, from ``mm_token_type_ids``)."""
    import torch
    import transformers as tf

    model = tf.Qwen2_5_VLForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32).eval()
    tokens = batch["tokens"]
    types = (tokens == IMAGE).int() + 2 * (tokens == VIDEO).int()
    with torch.no_grad():
        return model(input_ids=tokens, mm_token_type_ids=types, pixel_values=batch["pixel_values"],
                     image_grid_thw=batch["image_grid_thw"], pixel_values_videos=batch["pixel_values_videos"],
                     video_grid_thw=batch["video_grid_thw"],
                     second_per_grid_ts=batch["second_per_grid_ts"]).logits


def parity_main(argv: list[str] | None = None) -> int:
    """One rank of a parity check (see the module docstring)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("hf_dir")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--encoder-tp", type=int, default=None, help="the encoder's own TP size")
    args = parser.parse_args(argv)

    import torch

    from loong_core.config.schema import ParallelConfig
    from loong_core.devices.cpu import CPUBackend

    batch = sample_batch()
    reference = reference_logits(Path(args.hf_dir), batch)  # before the cpu backend's redirects
    CPUBackend(int(os.environ.get("LOCAL_RANK", 0)), num_threads=1).setup()
    torch.distributed.init_process_group("gloo")
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from loong_core.engines.megatron import parallel
    from loong_vlm.qwen2_5_vl.config import Qwen25VLConfig
    from loong_vlm.qwen2_5_vl.provider import Qwen25VLProvider

    p = ParallelConfig(tensor_model_parallel_size=args.tp)
    cfg = Qwen25VLConfig(name="qwen2_5_vl", init_from_hf=args.hf_dir)
    cfg.encoder.tensor_model_parallel_size = args.encoder_tp
    provider = Qwen25VLProvider(cfg)
    parallel.initialize(p, seed=1234)
    model = provider.build_megatron_model(provider.megatron_config(parallel.transformer_kwargs(p)),
                                          True, True, None)
    provider.initialize_weights([model])
    model.eval()
    visual = {k: batch[k] for k in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")}
    with torch.no_grad():
        logits = model(batch["tokens"], batch["position_ids"], None, **visual)
        logits = gather_from_tensor_model_parallel_region(logits)[..., :VOCAB]
    diff = (logits - reference).abs().max().item()
    if torch.distributed.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"max_abs_diff": diff, "tp": args.tp, "encoder_tp": args.encoder_tp}))
    ps.destroy_model_parallel()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(parity_main())
