"""``data.video_layout=qwen3_vl``: the ``llava`` data lays out videos as transformers' Qwen3-VL
processor does (a timestamp and its own vision start / end per temporal patch), with
``Qwen3VLModel.get_rope_index`` position ids; packing still isolates records; the model refuses a
layout of another family.

transformers' ``Qwen3VLVideoProcessor`` resizes frames with torchvision, which is not installed:
the reference processor runs with a video processor whose pixel step is replaced by the grid and
frame metadata our data computed; the rest (timestamps, text expansion, tokenization, the image
processor, ``mm_token_type_ids``) is transformers' own code.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from loong_core.errors import ConfigError
from loong_core.kernels.segment_mask import dense_mask
from loong_vlm.data.config import LlavaConfig
from loong_vlm.data.geometry import check_vision_geometry
from loong_vlm.data.llava import LlavaDataModule
from loong_vlm.data.video_layout import frame_timestamps, timestamp_text
from loong_vlm.data.vision import sample_frame_indices
from loong_vlm.qwen3_vl.rope import qwen3_vl_position_ids

Image = pytest.importorskip("PIL.Image")
qwen3_vl_processing = pytest.importorskip("transformers.models.qwen3_vl.processing_qwen3_vl")

GEOMETRY = dict(patch_size=4, merge_size=2, min_pixels=8 * 8, max_pixels=32 * 32, video_min_pixels=8 * 8,
                video_max_pixels=16 * 16, vocab_size=300, video_layout="qwen3_vl")
# an image with a 6-frame video at 2 fps; a 5-frame video without fps (transformers assumes 24);
# an image alone; a 3-frame video (its last frame repeats to fill a temporal patch) at 3 fps
RECORDS = [
    {"image": "img.png", "video": [f"a{i}.png" for i in range(6)], "fps": 2.0, "conversations": [
        {"from": "human", "value": "<image>\nand <video>\nWhat moves?"}, {"from": "gpt", "value": "a box"}]},
    {"video": [f"b{i}.png" for i in range(5)], "conversations": [
        {"from": "human", "value": "<video> What moves?"}, {"from": "gpt", "value": "a grey box"}]},
    {"image": "img.png", "conversations": [
        {"from": "human", "value": "What is it? <image>"}, {"from": "gpt", "value": "a box"}]},
    {"video": [f"a{i}.png" for i in range(3)], "fps": 3, "conversations": [
        {"from": "human", "value": "<video>"}, {"from": "gpt", "value": "box"}]},
]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The records above, prepared with a trained tokenizer, one record per sample."""
    root = tmp_path_factory.mktemp("qwen3_video")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (20, 12, 3), dtype=np.uint8)).save(root / "img.png")
    for name, size in (("a", (16, 24)), ("b", (12, 12))):
        for i in range(6):
            Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(root / f"{name}{i}.png")
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS * 3))
    config = LlavaConfig(name="llava", path=str(root / "data.jsonl"), cache_dir=str(root / "cache"), seq_length=160,
                         pack=False, valid_fraction=0.2, **GEOMETRY)
    module = LlavaDataModule(config)
    module.prepare()
    module.setup()
    return module


def _reference_processor(module: LlavaDataModule, monkeypatch):
    """transformers' ``Qwen3VLProcessor`` with our tokenizer, its Qwen2-VL image processor and a
    Qwen3-VL video processor that reports the grids and frame indices our data computed."""
    from transformers import PreTrainedTokenizerFast
    from transformers.feature_extraction_utils import BatchFeature
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    processor_class = qwen3_vl_processing.Qwen3VLProcessor
    check = processor_class.check_argument_for_proper_class
    monkeypatch.setattr(processor_class, "check_argument_for_proper_class",  # the video class map needs torchvision
                        lambda self, name, arg: type(arg) if name == "video_processor" else check(self, name, arg))
    p = module.processor

    class GridOnlyVideoProcessor(Qwen3VLVideoProcessor):
        def preprocess(self, videos, video_metadata=None, **kwargs):
            grids = [p.video_grid(len(frames), *frames[0].shape[:2]) for frames in videos]
            return BatchFeature({"video_grid_thw": torch.tensor(grids), "video_metadata": video_metadata})

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(module.data_dir / "tokenizer" / "tokenizer.json"))
    images = Qwen2VLImageProcessorPil(patch_size=p.patch_size, temporal_patch_size=p.temporal_patch_size,
                                      merge_size=p.merge_size, min_pixels=p.min_pixels, max_pixels=p.max_pixels)
    videos = GridOnlyVideoProcessor(patch_size=p.patch_size, temporal_patch_size=p.temporal_patch_size,
                                    merge_size=p.merge_size)
    return processor_class(image_processor=images, tokenizer=tokenizer, video_processor=videos), tokenizer


def _reference_inputs(module, processor, tokenizer, record, fps):
    from transformers.video_utils import VideoMetadata

    text = module.tokenizer.tokenizer.decode(record.ids.tolist(), skip_special_tokens=False)  # one pad per input
    images = [np.asarray(Image.open(f).convert("RGB")) for f in record.images] or None
    videos, metadata = None, None
    if record.videos:
        videos = [np.stack([np.asarray(Image.open(f).convert("RGB")) for f in frames]) for frames in record.videos]
        p = module.processor
        metadata = [VideoMetadata(total_num_frames=len(frames), fps=fps, frames_indices=sample_frame_indices(
            len(frames), p.video_max_frames, p.temporal_patch_size)) for frames in record.videos]
    return processor(text=[text], images=images, videos=videos, video_metadata=metadata, return_metadata=True,
                     return_tensors="pt")


def test_tokens_and_positions_equal_transformers_qwen3_vl(data, monkeypatch):
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    from loong_vlm.qwen3_vl import testing

    processor, tokenizer = _reference_processor(data, monkeypatch)
    rope = Qwen3VLModel(testing.hf_config())
    layout, seen = data.layout, set()
    for record in data.records["train"] + data.records["valid"]:
        index = (int(record.where.rsplit(":", 1)[1]) - 1) % len(RECORDS)  # data.jsonl:LINE
        seen.add(index)
        reference = _reference_inputs(data, processor, tokenizer, record, RECORDS[index].get("fps"))
        ids, _ = layout.expanded(record)
        assert ids.tolist() == reference["input_ids"][0].tolist(), tokenizer.decode(ids.tolist())
        assert record.image_grids == [tuple(g) for g in reference.get("image_grid_thw", torch.zeros(0, 3)).tolist()]
        expected, _ = rope.get_rope_index(reference["input_ids"], reference["mm_token_type_ids"],
                                          reference.get("image_grid_thw"), reference.get("video_grid_thw"))
        sample = layout.sample([record])
        n = len(ids) - 1
        assert torch.equal(sample["position_ids"][:, :n], expected[:, 0, :n])
        assert torch.equal(sample["tokens"][:n], torch.from_numpy(ids[:-1]))
    assert seen == set(range(len(RECORDS)))


def test_a_video_is_timestamped_per_temporal_patch(data):
    record = next(r for r in data.records["train"] if r.videos and r.images)
    ids, mask = data.layout.expanded(record)
    text = data.tokenizer.tokenizer.decode(ids.tolist(), skip_special_tokens=False)
    (t, h, w), = record.video_grids
    frame = "<|vision_start|>" + "<|video_pad|>" * (h * w // 4) + "<|vision_end|>"
    video = f"<|vision_start|><0.2 seconds>{frame}<1.2 seconds>{frame}<2.2 seconds>{frame}<|vision_end|>"
    assert t == 3 and video in text  # 6 frames at 2 fps: patches centred at 0.25, 1.25, 2.25 s
    start = text.index(video)
    span = data.tokenizer.tokenizer.encode(text[:start], add_special_tokens=False).ids
    assert not mask[len(span): len(span) + len(data.tokenizer.tokenizer.encode(video).ids)].any()


def test_frame_timestamps_follow_transformers_rule():
    reference = qwen3_vl_processing.Qwen3VLProcessor._calculate_timestamps
    for indices, fps in (([0, 1, 2, 3], 2.0), ([0, 1, 2], 3.0), ([0, 3, 6, 9, 12, 15], 24.0), ([0], 1.0)):
        assert frame_timestamps(indices, fps, 2) == reference(None, list(indices), fps, 2)
    assert frame_timestamps([0, 1, 2, 3], None, 2) == reference(None, [0, 1, 2, 3], 24, 2)
    assert [timestamp_text(s) for s in (0.25, 1.0, 12.75)] == ["<0.2 seconds>", "<1.0 seconds>", "<12.8 seconds>"]


def test_packed_records_keep_their_own_qwen3_positions(data):
    layout = data.layout
    packed = dataclasses.replace(layout, pack=True, seq_length=400)
    records = data.records["train"][:4]
    assert sum(layout.positions(r) for r in records) <= 400 and any(r.videos for r in records)
    sample = packed.sample(records)
    start = 0
    for record in records:
        ids, _ = layout.expanded(record)
        n = len(ids) - 1
        assert n == layout.positions(record)
        alone = qwen3_vl_position_ids(torch.from_numpy(ids[:-1]), torch.tensor(record.image_grids).reshape(-1, 3),
                                      torch.tensor(record.video_grids).reshape(-1, 3),
                                      image_token_id=layout.image_token_id, video_token_id=layout.video_token_id)
        assert torch.equal(sample["position_ids"][:, start: start + n], alone)
        assert torch.equal(sample["tokens"][start: start + n], torch.from_numpy(ids[:-1]))
        mask = dense_mask(sample["segment_ids"])
        assert mask[start: start + n, :start].all()  # masked: no cross-record attention
        assert not mask[start: start + n, start: start + n].tril().any()
        start += n
    assert sample["num_positions"] == start


def test_the_model_refuses_the_other_video_layout(data):
    from loong_vlm.qwen2_5_vl.config import Qwen25VLConfig
    from loong_vlm.qwen3_vl.config import Qwen3VLConfig

    qwen3 = Qwen3VLConfig(name="qwen3_vl")
    check_vision_geometry(qwen3, {"video_layout": data.model_overrides()["video_layout"]})
    with pytest.raises(ConfigError, match="data.video_layout=qwen3_vl"):
        check_vision_geometry(qwen3, {"video_layout": "qwen2_5"})
    with pytest.raises(ConfigError, match="data.video_layout=qwen2_5"):
        check_vision_geometry(Qwen25VLConfig(name="qwen2_5_vl"), {"video_layout": "qwen3_vl"})
    with pytest.raises(ConfigError, match="data.video_layout"):
        LlavaConfig(name="llava", video_layout="qwen3")
