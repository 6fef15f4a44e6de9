"""Packed LLaVA samples through the Qwen2.5-VL model: the logits of each record equal its logits
alone, and the data's vision geometry is checked against the model's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from loong_core.errors import ConfigError
from loong_core.kernels.segment_mask import with_attention_mask
from loong_vlm.data.config import LlavaConfig
from loong_vlm.data.llava import LlavaDataModule, LlavaSplit

pytest.importorskip("PIL")

GEOMETRY = dict(patch_size=4, merge_size=2, min_pixels=8 * 8, max_pixels=32 * 32, video_min_pixels=8 * 8,
                video_max_pixels=16 * 16)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    config = LlavaConfig(name="llava", seq_length=256, vocab_size=300, cache_dir=str(tmp_path_factory.mktemp("c")),
                         **GEOMETRY)
    module = LlavaDataModule(config)
    module.prepare()
    module.setup()
    return module


def _tiny_qwen2_5_vl(**encoder):
    from loong_llm.families.qwen2.config import Qwen2Config
    from loong_vlm.qwen2_5_vl.config import Qwen25MergerConfig, Qwen25ViTConfig, Qwen25VLConfig

    return Qwen25VLConfig(
        name="qwen2_5_vl",
        encoder=Qwen25ViTConfig(name="qwen2_5_vit", **{**dict(
            patch_size=4, num_layers=2, hidden_size=32, num_attention_heads=2, ffn_hidden_size=48, window_size=16,
            fullatt_block_indexes=[1]), **encoder}),
        projector=Qwen25MergerConfig(name="qwen2_5_merger"),
        foundation=Qwen2Config(name="qwen2", num_layers=2, hidden_size=64, num_attention_heads=4,
                               num_query_groups=2, ffn_hidden_size=96, vocab_size=300, max_position_embeddings=512,
                               position_embedding_type="mrope", mrope_section=[2, 3, 3]))


def _provider(demo, **encoder):
    from loong_vlm.qwen2_5_vl.provider import Qwen25VLProvider

    provider = Qwen25VLProvider(_tiny_qwen2_5_vl(**encoder))
    provider.apply_data_overrides(demo.model_overrides())
    return provider


def _logits(model, batch, mask: bool = True):
    visual = {k: batch[k] for k in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
              if k in batch}
    with torch.no_grad():
        return model(batch["tokens"], batch["position_ids"],
                     with_attention_mask(batch).get("attention_mask") if mask else None,
                     **visual)[0]


def test_packed_logits_equal_each_record_alone(demo, mcore_single_rank):
    provider = _provider(demo)
    torch.manual_seed(0)
    model = provider.build_megatron_model(provider.megatron_config({}), True, True, None).eval()
    layout = demo.layout
    records = [r for r in demo.records["train"] if r.videos][:1] + [r for r in demo.records["train"] if r.images][:3]
    assert sum(layout.positions(r) for r in records) <= layout.seq_length and len(records[1].images) == 2
    packed = _logits(model, demo.collate([layout.sample(records)]))
    alone_layout = dataclasses.replace(layout, pack=False)
    start, worst, leak = 0, 0.0, 0.0
    leaky = _logits(model, demo.collate([layout.sample(records)]), mask=False)
    for record in records:
        n = layout.positions(record)
        alone = _logits(model, demo.collate([alone_layout.sample([record])]))[:n]
        worst = max(worst, (packed[start: start + n] - alone).abs().max().item())
        leak = max(leak, (leaky[start: start + n] - alone).abs().max().item())
        start += n
    print(f"packed vs alone: max abs diff {worst:.2e} (without the block mask: {leak:.2e})")
    assert worst < 1e-5
    assert leak > 1e-3  # the block mask is what keeps the records apart


def test_both_packing_algorithms_place_every_record_once_per_epoch(demo):
    records = len(demo.records["train"])
    layouts = {name: dataclasses.replace(demo.layout, pack_algorithm=name) for name in ("best_fit", "next_fit")}
    bins = {}
    for name, layout in layouts.items():
        split = LlavaSplit(layout, demo.records["train"], 1, seed=0, split="train")
        assert sorted(i for sample in split.samples for i in sample) == list(range(records))  # one epoch
        assert all(sum(layout.positions(demo.records["train"][i]) for i in s) <= layout.seq_length
                   for s in split.samples)
        bins[name] = len(split.samples)
    assert bins["best_fit"] <= bins["next_fit"]
    with pytest.raises(ConfigError, match="Unknown data.pack_algorithm 'knapsack'"):
        LlavaConfig(name="llava", pack_algorithm="knapsack")


def test_patch_geometry_must_match_the_encoder(demo):
    with pytest.raises(ConfigError, match=r"data.patch_size = 4 but model.encoder.patch_size = 14.*"
                                          r"set data.patch_size=14"):
        _provider(demo, patch_size=14)


def test_fixed_size_encoders_refuse_dynamic_resolution_data(demo, tiny_vlm_config):
    from loong_vlm.provider import VLMProvider

    provider = VLMProvider(tiny_vlm_config())
    with pytest.raises(ConfigError, match="takes fixed-size images; use a dynamic-resolution encoder"):
        provider.apply_data_overrides(demo.model_overrides())
