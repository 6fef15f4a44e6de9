"""LLaVA records: placeholder expansion per image size, assistant-only loss, packing, clear errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from loong_core.errors import ConfigError
from loong_core.kernels.segment_mask import dense_mask
from loong_vlm.data.config import LlavaConfig
from loong_vlm.data.llava import LlavaDataModule
from loong_vlm.mrope import mrope_position_ids

Image = pytest.importorskip("PIL.Image")

# 4x4 patches, 2x2 merge windows: an image of 8x8..32x32 pixels takes 1..16 tokens
GEOMETRY = dict(patch_size=4, merge_size=2, min_pixels=8 * 8, max_pixels=32 * 32, video_min_pixels=8 * 8,
                video_max_pixels=16 * 16, vocab_size=300)


def _module(tmp_path, **overrides) -> LlavaDataModule:
    settings = {"seq_length": 128, "cache_dir": str(tmp_path / "cache"), **GEOMETRY, **overrides}
    config = LlavaConfig(name="llava", **settings)
    module = LlavaDataModule(config)
    module.prepare()
    module.setup()
    return module


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The built-in digits demo set (single images, pairs and 4-frame videos of mixed sizes)."""
    return _module(tmp_path_factory.mktemp("llava"))


def _write(tmp_path, records, name="data.jsonl", sizes=((20, 12),)) -> str:
    for i, (h, w) in enumerate(sizes):
        Image.fromarray(np.full((h, w, 3), 40 * i, dtype=np.uint8)).save(tmp_path / f"img{i}.png")
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_each_placeholder_run_has_its_image_grid_token_count(demo):
    train, _ = demo.build(10, 2, seed=0)
    image_id, video_id = demo.layout.image_token_id, demo.layout.video_token_id
    for i in range(5):
        sample = train[i]
        tokens = sample["tokens"]
        grids = sample["image_grid_thw"].tolist() + sample["video_grid_thw"].tolist()
        expected = sum(t * h * w // 4 for t, h, w in grids)
        assert int(((tokens == image_id) | (tokens == video_id)).sum()) == expected
        assert not sample["loss_mask"][(tokens == image_id) | (tokens == video_id)].any()
    grids = {tuple(r.image_grids[0]) for r in demo.records["train"] if r.image_grids}
    assert len(grids) > 5  # images keep their own sizes (dynamic resolution)


def test_loss_is_on_the_assistant_replies_only(demo):
    sample = demo.build(2, 2, seed=0)[0][0]
    trained = demo.tokenizer.tokenizer.decode(sample["labels"][sample["loss_mask"] > 0].tolist(),
                                              skip_special_tokens=False)
    replies = [trained_reply for trained_reply in trained.split("<|im_end|>\n") if trained_reply]
    assert replies and all(r.replace(" and ", "").isdigit() for r in replies), trained


def test_packed_positions_restart_with_each_record(demo):
    layout = demo.layout
    records, used = [], 0
    for record in demo.records["train"]:  # the first records that fit one sample together
        if used + layout.positions(record) > layout.seq_length:
            break
        records.append(record)
        used += layout.positions(record)
    assert len(records) >= 2
    sample = layout.sample(records)
    start = 0
    for record in records:
        ids, _ = layout.expanded(record)
        alone = mrope_position_ids(
            torch.from_numpy(ids[:-1]), torch.tensor(record.image_grids).reshape(-1, 3),
            torch.tensor(record.video_grids).reshape(-1, 3), image_token_id=layout.image_token_id,
            video_token_id=layout.video_token_id, spatial_merge_size=2)
        n = len(ids) - 1
        assert torch.equal(sample["position_ids"][:, start: start + n], alone)
        assert dense_mask(sample["segment_ids"])[start: start + n, :start].all()  # no cross-record attention
        start += n
    assert sample["num_positions"] == start == demo.sample_cost(sample)


def test_collate_decodes_pixels_in_reading_order(demo):
    train, _ = demo.build(4, 2, seed=1)
    samples = [train[0], train[1]]
    batch = demo.collate(samples)
    files = samples[0]["image_files"] + samples[1]["image_files"]
    grids = batch["image_grid_thw"]
    assert grids.shape == (len(files), 3) and batch["pixel_values"].shape == (int(grids.prod(-1).sum()), 3 * 2 * 16)
    last = files[-1]
    with Image.open(last) as image:
        expected, grid = demo.processor.image(image)
    assert tuple(grids[-1].tolist()) == grid
    assert torch.equal(batch["pixel_values"][-expected.shape[0]:], torch.from_numpy(expected))
    assert batch["tokens"].shape == (2, 128) and batch["position_ids"].shape == (2, 3, 128)
    assert batch["segment_ids"].shape == (2, 128) and "attention_mask" not in batch


def test_balancer_cost_reads_no_pixels(demo, monkeypatch):
    def refuse(path):
        raise AssertionError(f"decoded {path}")

    monkeypatch.setattr("loong_vlm.data.llava_batch._open_rgb", refuse)
    train, _ = demo.build(4, 2, seed=0)
    assert demo.sample_cost(train[0]) == float((train[0]["tokens"] != demo.layout.pad_id).sum())


def test_videos_take_temporal_patches(demo):
    record = next(r for r in demo.records["train"] if r.videos)
    assert len(record.videos[0]) == 4 and record.video_grids[0][0] == 2
    batch = demo.collate([demo.layout.sample([record])])
    assert batch["pixel_values_videos"].shape[0] == int(torch.tensor(record.video_grids[0]).prod())
    assert "pixel_values" not in batch


def test_messages_with_content_parts_and_a_saved_tokenizer(tmp_path):
    records = [{"image": "img0.png", "messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]},
        {"role": "assistant", "content": "a grey box"}]}] * 3
    path = _write(tmp_path, records)
    trained = _module(tmp_path, path=path)
    reused = _module(tmp_path, path=path, tokenizer=str(trained.data_dir / "tokenizer"))
    a, b = (m.layout.sample(m.records["train"][:1]) for m in (trained, reused))
    assert torch.equal(a["tokens"], b["tokens"]) and int((a["tokens"] == trained.layout.image_token_id).sum()) == 4


def test_missing_image_names_the_record_and_the_file(tmp_path):
    path = _write(tmp_path, [{"image": "nope.png", "conversations": [
        {"from": "human", "value": "<image>\nhi"}, {"from": "gpt", "value": "ok"}]}] * 2)
    with pytest.raises(ConfigError, match=r"data.jsonl:1: image file '.*nope.png' does not exist"):
        _module(tmp_path, path=path)


def test_marker_count_must_match_the_images(tmp_path):
    path = _write(tmp_path, [{"image": ["img0.png", "img0.png"], "conversations": [
        {"from": "human", "value": "<image>\nhi"}, {"from": "gpt", "value": "ok"}]}] * 2)
    with pytest.raises(ConfigError, match=r"data.jsonl:1: the text has 1 <image> marker\(s\) but the record lists 2"):
        _module(tmp_path, path=path)


def test_too_long_record_says_which_and_the_fix(tmp_path):
    record = {"image": "img0.png", "conversations": [{"from": "human", "value": "<image>\nhi"},
                                                      {"from": "gpt", "value": "ok"}]}
    big = {**record, "image": "img1.png"}
    path = _write(tmp_path, [record, record, big, record], sizes=((8, 8), (32, 32)))
    message = (r"data.jsonl:3: the record needs \d+ positions \(16 of them image/video placeholders\) but "
               r"data.seq_length is 30; set data.seq_length=\d+ or more")
    with pytest.raises(ConfigError, match=message):
        _module(tmp_path, path=path, seq_length=30, valid_path=path)
    kept = _module(tmp_path, path=path, seq_length=30, valid_path=path, skip_too_long=True)
    assert len(kept.records["train"]) == 3


def test_a_json_list_reads_like_jsonl(tmp_path):
    from loong_vlm.data.llava_format import IMAGE_MARKUP, read_llava_records

    record = {"image": ["img0.png", "img0.png"], "conversations": [
        {"from": "system", "value": "Be brief."}, {"from": "human", "value": "<image> vs <image>?"},
        {"from": "gpt", "value": "same"}]}
    jsonl = read_llava_records(_write(tmp_path, [record]))
    (tmp_path / "data.json").write_text(json.dumps([record]))
    listed = read_llava_records(tmp_path / "data.json")
    assert [r.messages for r in jsonl] == [r.messages for r in listed]
    assert listed[0].messages[1]["content"] == f"{IMAGE_MARKUP} vs {IMAGE_MARKUP}?"
    assert listed[0].images == [str(tmp_path / "img0.png")] * 2 and listed[0].where.endswith("data.json[0]")
