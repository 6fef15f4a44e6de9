"""VLM arms of ``benchmarks/peers.py``: a small Qwen2.5-VL on images of mixed sizes, loong packed vs
transformers padded.

* ``loong``: ``loong train experiment=qwen2_5_vl_debug`` at the shape (megatron engine, one rank):
  LLaVA records packed into ``seq_length`` positions (block-diagonal attention, no padding between
  records), step times from its ``metrics.jsonl``;
* ``loong_auto`` / ``loong_bf16``: ``loong`` with ``kernels=auto`` / in bf16 mixed precision;
* ``transformers``: ``Qwen2_5_VLForConditionalGeneration`` (SDPA) fed the way its documentation
  trains it: ``Qwen2_5_VLProcessor`` (its PIL image processor, the chat text with the image
  markup, ``padding=True``) on the records of loong's packed sample of the same step as one
  padded batch, labels -100 on padding and on the prompt, torch's fused AdamW and clipping.

Both read the same records (written once per shape into ``$TMPDIR/loong-peers-vlm-<shape>``: one
image per record, each side drawn from 56..448 px in steps of 28, so no resize is needed and both
processors give the same patch grids; a prompt and an answer of 4..40 words) and the same tokenizer
(the BPE loong trains on them: the transformers arm loads its ``tokenizer.json``). The models have
the same configuration (``describe``) and random initialisations of their own.

A packed step holds a varying number of records (about ``batch``), so every arm's step time is
scaled to ``batch`` records (seconds per step x ``batch`` / records in that step); the table's
samples/s are records per second. Step ``i`` of every arm trains on the same records: those of
loong's ``i``-th packed sample (:func:`_steps_records`, from loong's own packing of the split,
which its loader walks in order), so the step times compare the same images and texts. (Before
2026-12-06 16:00 UTC the transformers arm took ``batch`` records in file order, so the arms'
medians came from different records: images of 56..448 px make a step's cost vary by 2x.)
loong packs by best fit (``data.pack_algorithm=best_fit``), which groups records of similar
sizes: the transformers batches then carry about 9% padding instead of 73%, as transformers'
``group_by_length`` would give them.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

SHAPES = {
    "default": dict(vision_layers=4, vision_hidden=256, vision_heads=4, vision_ffn=512, window=112, fullatt=3,
                    hidden=512, layers=4, heads=8, groups=2, ffn=1408, mrope=[8, 12, 12], vocab=1024,
                    sides=list(range(56, 449, 28)), records=160, batch=8, seq=1024),
    "smoke": dict(vision_layers=2, vision_hidden=32, vision_heads=2, vision_ffn=64, window=56, fullatt=1,
                  hidden=64, layers=2, heads=4, groups=2, ffn=128, mrope=[2, 3, 3], vocab=320,
                  sides=[56, 84, 112], records=24, batch=2, seq=256),
}
UNIT = "samples"
PATCH, MERGE, TEMPORAL = 14, 2, 2
OPTIM = dict(lr=1.0e-3, weight_decay=0.01, betas=(0.9, 0.95), eps=1e-8, clip=1.0)
SEED = 1234
_THREADS = os.cpu_count()
_COMMON = f"AdamW fused, fp32, {_THREADS} threads"
ARMS = {
    "loong": f"`loong train` megatron engine, packed records (data.pack=true, block-diagonal attention), "
             f"kernels=torch, {_COMMON}",
    "loong_auto": f"the same with kernels=auto (loong's default), {_THREADS} threads",
    "loong_bf16": "the same in bf16 mixed precision (parallel.mixed_precision=bf16)",
    "transformers": f"Qwen2_5_VLForConditionalGeneration, sdpa, its processor (PIL image processor), padded "
                    f"batch, {_COMMON}",
    "transformers_bf16": "the same in bf16 autocast (Trainer(bf16=True) on a CPU: fp32 weights, gradients and "
                         "Adam state)",
}
_WORDS = ("red green blue small large round square digit shape line circle corner bright dark left right top "
          "bottom middle picture shows there is a an the of with near far light shadow pattern stripe dot").split()


def units(shape: dict) -> int:
    return shape["batch"]


def describe(shape: dict) -> str:
    return (f"Qwen2.5-VL: ViT {shape['vision_layers']} layers x {shape['vision_hidden']} ({shape['vision_heads']} "
            f"heads, SwiGLU {shape['vision_ffn']}, patch {PATCH}, windows of {shape['window']} px, layer "
            f"{shape['fullatt']} full attention), 2x2 merger, Qwen2 decoder {shape['layers']} layers x "
            f"{shape['hidden']} (heads {shape['heads']}/{shape['groups']}, SwiGLU {shape['ffn']}, MRoPE "
            f"{shape['mrope']}), vocabulary {shape['vocab']}; {shape['records']} records of one image each, sides "
            f"{shape['sides'][0]}..{shape['sides'][-1]} px ({_tokens(shape['sides'][0])}..{_tokens(shape['sides'][-1])}"
            f" image tokens), {shape['batch']} records per step (loong: packed into {shape['seq']} positions)")


def _tokens(side: int) -> int:
    return (side // PATCH) ** 2 // MERGE ** 2


def run(arm: str, shape: dict, steps: int) -> list[float]:
    root = _records(shape)
    if arm.startswith("loong"):
        return _loong(shape, steps, root, "auto" if arm == "loong_auto" else "torch",
                      "bf16" if arm == "loong_bf16" else "fp32")
    return _transformers(shape, steps, root, "bf16" if arm == "transformers_bf16" else "fp32")


# -- data ------------------------------------------------------------------------------------------
def _records(shape: dict) -> Path:
    """Write (once) the records, their images and a one-record validation file; their folder."""
    import numpy as np
    from PIL import Image

    root = Path(tempfile.gettempdir()) / f"loong-peers-vlm-{shape['records']}-{shape['sides'][-1]}-{shape['vocab']}"
    if (root / "done").is_file():
        return root
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    records = []
    for n in range(shape["records"] + 1):
        w, h = (int(rng.choice(shape["sides"])) for _ in range(2))
        y, x = np.mgrid[0:h, 0:w]
        base = rng.uniform(0, 255, 3)
        pixels = (base + 60 * np.sin(x[..., None] / rng.uniform(5, 40) + y[..., None] / rng.uniform(5, 40))
                  + rng.normal(0, 8, (h, w, 3)))
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(root / f"{n}.png")
        prompt = " ".join(rng.choice(_WORDS, int(rng.integers(4, 12))))
        answer = " ".join(rng.choice(_WORDS, int(rng.integers(4, 41))))
        records.append({"image": f"{n}.png", "conversations": [{"from": "human", "value": f"<image>\n{prompt}"},
                                                               {"from": "gpt", "value": answer}]})
    (root / "train.json").write_text(json.dumps(records[:-1]))
    (root / "valid.json").write_text(json.dumps(records[-1:]))
    (root / "done").write_text("")
    return root


def _data_fields(shape: dict, root: Path) -> dict:
    """The LLaVA data settings both arms use (``data.*`` of the loong arm)."""
    return dict(path=str(root / "train.json"), valid_path=str(root / "valid.json"), vocab_size=shape["vocab"],
                seq_length=shape["seq"], pack=True, patch_size=PATCH, temporal_patch_size=TEMPORAL,
                merge_size=MERGE, min_pixels=56 * 56, max_pixels=448 * 448, cache_dir=str(root / "cache"))


def _loong_data(shape: dict, root: Path):
    """loong's LLaVA data module on the records, prepared (the tokenizer trained once, cached)."""
    from loong_vlm.data.config import LlavaConfig
    from loong_vlm.data.llava import LlavaDataModule

    module = LlavaDataModule(LlavaConfig(name="llava", **_data_fields(shape, root)))
    module.prepare()
    module.setup()
    return module


# -- loong -----------------------------------------------------------------------------------------
def _loong(shape: dict, steps: int, root: Path, kernels: str, precision: str = "fp32") -> list[float]:
    from loong_core.testing import read_metrics, run_train

    data = [f"data.{key}={value}" for key, value in _data_fields(shape, root).items()]
    model = [f"model.encoder.patch_size={PATCH}", f"model.encoder.image_size={shape['sides'][-1]}",
             f"model.encoder.num_layers={shape['vision_layers']}",
             f"model.encoder.hidden_size={shape['vision_hidden']}",
             f"model.encoder.num_attention_heads={shape['vision_heads']}",
             f"model.encoder.ffn_hidden_size={shape['vision_ffn']}", f"model.encoder.window_size={shape['window']}",
             f"model.encoder.fullatt_block_indexes=[{shape['fullatt']}]",
             f"model.foundation.num_layers={shape['layers']}", f"model.foundation.hidden_size={shape['hidden']}",
             f"model.foundation.num_attention_heads={shape['heads']}",
             f"model.foundation.num_query_groups={shape['groups']}", f"model.foundation.ffn_hidden_size={shape['ffn']}",
             f"model.foundation.mrope_section=[{','.join(str(s) for s in shape['mrope'])}]",
             "model.foundation.max_position_embeddings=4096"]
    with tempfile.TemporaryDirectory() as run_dir:
        run_train(["experiment=qwen2_5_vl_debug", *data, *model, f"trainer.seed={SEED}", "data.video_max_pixels=3136",
                   "trainer.micro_batch_size=1", "trainer.global_batch_size=1", f"trainer.train_iters={steps}",
                   f"optim.lr={OPTIM['lr']}", f"optim.min_lr={OPTIM['lr']}", "optim.lr_warmup_iters=0",
                   f"optim.weight_decay={OPTIM['weight_decay']}", f"optim.clip_grad={OPTIM['clip']}",
                   "optim.implementation=fused", f"kernels={kernels}", f"parallel.mixed_precision={precision}",
                   "trainer.log_interval=1", "trainer.eval_interval=0", "trainer.eval_at_start=false",
                   "trainer.save_at_end=false", "trainer.progress_bar=false", "trainer.tensorboard=false",
                   f"trainer.run_dir={run_dir}"], env={"OMP_NUM_THREADS": str(_THREADS)}, timeout=1800)
        times = [r["step_time"] for r in sorted(read_metrics(run_dir), key=lambda r: r["step"])]
    per_step = [len(records) for records in _steps_records(shape, root, len(times))]
    return [t * shape["batch"] / n for t, n in zip(times, per_step)]


def _steps_records(shape: dict, root: Path, steps: int) -> list[list[int]]:
    """The records (indices into ``train.json``) loong trains on at each of its first ``steps``
    steps: its packed samples in the order its loader walks them."""
    train, _ = _loong_data(shape, root).build(steps, 1, SEED)
    return [train.samples[step % len(train)] for step in range(steps)]


# -- transformers ----------------------------------------------------------------------------------
def _processor(shape: dict, root: Path):
    """``Qwen2_5_VLProcessor`` without a video processor: transformers' Qwen2-VL video processor
    needs torchvision, which has no build for this CPU torch; the records have no video."""
    from transformers import PreTrainedTokenizerFast, Qwen2_5_VLProcessor, Qwen2VLImageProcessorPil

    class _ImageTextProcessor(Qwen2_5_VLProcessor):
        def check_argument_for_proper_class(self, name, arg):
            if name == "video_processor" and arg is None:
                return None
            return super().check_argument_for_proper_class(name, arg)

    from loong_llm.data.chat import CHATML_TEMPLATE

    tokenizer_dir = _loong_data(shape, root).data_dir / "tokenizer"
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_dir / "tokenizer.json"))
    tokenizer.pad_token = tokenizer.eos_token = "<|im_end|>"  # padded positions are masked out
    tokenizer.chat_template = CHATML_TEMPLATE
    images = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=448 * 448, patch_size=PATCH,
                                      temporal_patch_size=TEMPORAL, merge_size=MERGE)
    return _ImageTextProcessor(image_processor=images, tokenizer=tokenizer, video_processor=None,
                               chat_template=CHATML_TEMPLATE)


def _hf_model(shape: dict, processor):
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = processor.tokenizer.convert_tokens_to_ids
    text = dict(vocab_size=len(processor.tokenizer), hidden_size=shape["hidden"], num_hidden_layers=shape["layers"],
                num_attention_heads=shape["heads"], num_key_value_heads=shape["groups"],
                intermediate_size=shape["ffn"], max_position_embeddings=4096, rms_norm_eps=1e-6, bos_token_id=None,
                eos_token_id=None,
                tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                            "mrope_section": shape["mrope"]})
    vision = dict(depth=shape["vision_layers"], hidden_size=shape["vision_hidden"],
                  intermediate_size=shape["vision_ffn"], num_heads=shape["vision_heads"], in_channels=3,
                  patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=TEMPORAL,
                  window_size=shape["window"], fullatt_block_indexes=[shape["fullatt"]],
                  out_hidden_size=shape["hidden"], tokens_per_second=2)
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"),
                              video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
                              vision_end_token_id=ids("<|vision_end|>"), tie_word_embeddings=False,
                              attn_implementation="sdpa")
    torch.manual_seed(0)
    return Qwen2_5_VLForConditionalGeneration(config).train()


def _hf_batches(shape: dict, steps: int, root: Path, processor):
    """``steps`` processed batches, each the records of loong's step, with labels on the answers."""
    from PIL import Image

    records = json.loads((root / "train.json").read_text())
    batches = []
    for indices in _steps_records(shape, root, steps):
        chosen = [records[index] for index in indices]
        texts, prompts = [], []
        for record in chosen:
            human, gpt = record["conversations"]
            user = human["value"].replace("<image>", "<|vision_start|><|image_pad|><|vision_end|>")
            messages = [{"role": "user", "content": user}, {"role": "assistant", "content": gpt["value"]}]
            texts.append(processor.apply_chat_template(messages, tokenize=False))
            prompts.append(processor.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True))
        images = [Image.open(root / r["image"]).convert("RGB") for r in chosen]
        batch = processor(text=texts, images=images, padding=True, return_tensors="pt")
        labels = batch["input_ids"].clone()
        labels[batch["attention_mask"] == 0] = -100
        for row, (prompt, image) in enumerate(zip(prompts, images)):  # no loss on the prompt
            labels[row, : len(processor(text=[prompt], images=[image])["input_ids"][0])] = -100
        batch["labels"] = labels
        batches.append((batch, len(chosen)))
    return batches


def _transformers(shape: dict, steps: int, root: Path, precision: str) -> list[float]:
    import peers_harness
    import torch

    torch.set_num_threads(_THREADS)
    processor = _processor(shape, root)
    model = _hf_model(shape, processor)
    optimizer = torch.optim.AdamW(model.parameters(), lr=OPTIM["lr"], betas=OPTIM["betas"], eps=OPTIM["eps"],
                                  weight_decay=OPTIM["weight_decay"], fused=True)
    times = []
    for batch, records in _hf_batches(shape, steps, root, processor):
        start = time.perf_counter()
        with peers_harness.peer_autocast(precision):
            loss = model(**batch, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIM["clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append((time.perf_counter() - start) * shape["batch"] / records)
    return times
