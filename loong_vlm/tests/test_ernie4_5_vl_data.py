"""ERNIE-4.5-VL's data (``data.image_processing=ernie``, ``data.video_layout=ernie4_5_vl``) equals
transformers' ERNIE-4.5-VL processing: the image processor's pixel values and grids, the
processor's token ids (placeholders and their start / end tokens), its video pixel values, grids
and frame sampling (all bit-exact), and ``get_rope_index``'s positions; the data's vision start /
end ids reach the composer's vision-expert mask, and the balancer evens ``ernie4_5_vl_debug``
batches.

transformers' ``video_processing_ernie4_5_vl_moe`` module imports torchvision at its top, and
torchvision has no build for this CPU torch. The reference video processor is that module's own
class, compiled from its source without the torchvision imports and with ``draw_on_frames=False``
(drawing the time onto frames needs the checkpoint's font); the two torchvision calls it makes
are stood in by what torchvision runs for them: ``resize`` of a ``uint8`` video on the CPU is
torch's antialiased ``uint8`` bicubic kernel (``_do_native_uint8_resize_on_cpu`` is true for
bicubic), ``normalize`` is ``(x - mean) / std`` per channel.
"""

from __future__ import annotations

import ast
import inspect
import json
import types

import numpy as np
import pytest
import torch

from loong_core.errors import ConfigError
from loong_vlm.data.config import LlavaConfig
from loong_vlm.data.llava import LlavaDataModule
from loong_vlm.data.llava_batch import collate_llava

Image = pytest.importorskip("PIL.Image")
ernie_package = pytest.importorskip("transformers.models.ernie4_5_vl_moe")

GEOMETRY = dict(patch_size=4, merge_size=2, min_pixels=64, max_pixels=1024, video_min_pixels=64, video_max_pixels=256,
                video_max_frames=6, vocab_size=300, image_processing="ernie", video_layout="ernie4_5_vl")
#: images of six shapes (one upscaled to min_pixels, one shrunk to max_pixels, aspect ratios 1:1
#: to 1:5.6), a 7-frame video (6 kept, evenly spaced) and a 5-frame one (its last frame repeated)
RECORDS = [
    {"image": "a.png", "video": [f"v{i}.png" for i in range(7)], "conversations": [
        {"from": "human", "value": "<image>\nand <video>\nWhat moves?"}, {"from": "gpt", "value": "a box"}]},
    {"image": ["b.png", "c.png"], "conversations": [
        {"from": "human", "value": "<image> <image> What are these?"}, {"from": "gpt", "value": "two boxes"}]},
    {"video": [f"w{i}.png" for i in range(5)], "conversations": [
        {"from": "human", "value": "<video> What moves?"}, {"from": "gpt", "value": "a grey box"}]},
    {"image": ["d.png", "e.png", "f.png"], "conversations": [
        {"from": "human", "value": "<image><image><image>"}, {"from": "gpt", "value": "boxes"}]},
]
SHAPES = {"a": (20, 12), "b": (45, 30), "c": (9, 50), "d": (64, 64), "e": (5, 5), "f": (13, 27)}
TOKENS = {"image_token": "<|image_pad|>", "image_start_token": "<|vision_start|>",
          "image_end_token": "<|vision_end|>", "video_token": "<|video_pad|>",
          "video_start_token": "<|vision_start|>", "video_end_token": "<|vision_end|>"}


def transformers_video_processor_class():
    """transformers' ``Ernie4_5_VLMoeVideoProcessor`` compiled from its source without torchvision
    (see the module docstring); ``smart_resize`` is taken from the PIL image module, whose source
    is the same function (checked)."""
    folder = inspect.getfile(ernie_package).rsplit("/", 1)[0]
    path = folder + "/video_processing_ernie4_5_vl_moe.py"
    tree = ast.parse(open(path).read())
    body = []
    for node in tree.body:
        if isinstance(node, ast.If) or (isinstance(node, ast.ImportFrom) and "torchvision" in (node.module or "")):
            continue  # `if is_torchvision_available(): import tvF` and the torchvision imports
        if isinstance(node, ast.ImportFrom) and node.level:
            module = (node.module or "").replace("image_processing_ernie", "image_processing_pil_ernie")
            node.module = ("transformers.models.ernie4_5_vl_moe." if node.level == 1 else "transformers.") + module
            node.level = 0
        body.append(node)
    for node in ast.walk(ast.Module(body, [])):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):  # docstring decorator: needs a source file
            node.decorator_list = [d for d in node.decorator_list if getattr(d, "id", None) != "auto_docstring"]
    namespace = {"__name__": "ernie_video_processing_from_source"}
    exec(compile(ast.Module(body, []), path, "exec"), namespace)  # noqa: S102 - transformers' own code

    def source(file, name):
        nodes = ast.parse(open(f"{folder}/{file}").read()).body
        return ast.dump(next(n for n in nodes if getattr(n, "name", None) == name))

    assert source("image_processing_ernie4_5_vl_moe.py", "smart_resize") == \
        source("image_processing_pil_ernie4_5_vl_moe.py", "smart_resize")

    class WithoutTorchvision(namespace["Ernie4_5_VLMoeVideoProcessor"]):
        def resize(self, video, size, resample=None, **kwargs):
            shape = video.shape
            if tuple(shape[-2:]) == (size.height, size.width):
                return video
            out = torch.nn.functional.interpolate(video.reshape(-1, *shape[-3:]), size=[size.height, size.width],
                                                  mode="bicubic", align_corners=False, antialias=True)
            return out.reshape(*shape[:-2], size.height, size.width)

        def normalize(self, image, mean, std, inplace=False, **kwargs):
            return (image - mean[:, None, None]) / std[:, None, None]

    return WithoutTorchvision


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The records above, prepared with a trained tokenizer, one record per sample."""
    root = tmp_path_factory.mktemp("ernie_data")
    rng = np.random.default_rng(0)
    for name, shape in SHAPES.items():
        Image.fromarray(rng.integers(0, 256, (*shape, 3), dtype=np.uint8)).save(root / f"{name}.png")
    for name, shape in (("v", (16, 24)), ("w", (30, 20))):
        for i in range(7):
            Image.fromarray(rng.integers(0, 256, (*shape, 3), dtype=np.uint8)).save(root / f"{name}{i}.png")
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS * 3))
    config = LlavaConfig(name="llava", path=str(root / "data.jsonl"), cache_dir=str(root / "cache"), seq_length=200,
                         pack=False, valid_fraction=0.2, **GEOMETRY)
    module = LlavaDataModule(config)
    module.prepare()
    module.setup()
    return module


def reference_processor(module: LlavaDataModule, monkeypatch):
    """transformers' ``Ernie4_5_VLMoeProcessor`` with our tokenizer (its vision tokens named as
    ERNIE's processor asks), its PIL image processor and its video processor (from source)."""
    from transformers import PreTrainedTokenizerFast
    from transformers.models.ernie4_5_vl_moe import Ernie4_5_VLMoeImageProcessorPil, Ernie4_5_VLMoeProcessor

    check = Ernie4_5_VLMoeProcessor.check_argument_for_proper_class  # its video class map needs torchvision
    monkeypatch.setattr(Ernie4_5_VLMoeProcessor, "check_argument_for_proper_class",
                        lambda self, name, arg: type(arg) if name == "video_processor" else check(self, name, arg))
    p = module.processor
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(module.data_dir / "tokenizer" / "tokenizer.json"),
                                        extra_special_tokens=TOKENS)
    images = Ernie4_5_VLMoeImageProcessorPil(patch_size=p.patch_size, merge_size=p.merge_size,
                                             size={"shortest_edge": p.min_pixels, "longest_edge": p.max_pixels})
    videos = transformers_video_processor_class()(
        patch_size=p.patch_size, merge_size=p.merge_size, max_frames=p.video_max_frames, draw_on_frames=False,
        size={"shortest_edge": p.video_min_pixels, "longest_edge": p.video_max_pixels})
    return Ernie4_5_VLMoeProcessor(image_processor=images, tokenizer=tokenizer, video_processor=videos)


def test_image_pixels_and_grids_equal_transformers_image_processor():
    """Bit-exact on six shapes under two pixel budgets (upscaled, kept and shrunk images)."""
    from transformers.models.ernie4_5_vl_moe import Ernie4_5_VLMoeImageProcessorPil

    rng = np.random.default_rng(1)
    images = [Image.fromarray(rng.integers(0, 256, (*shape, 3), dtype=np.uint8)) for shape in SHAPES.values()]
    seen = set()
    for patch, low, high in ((4, 64, 1024), (14, 56 * 56, 28 * 28 * 8)):
        config = LlavaConfig(name="llava", patch_size=patch, min_pixels=low, max_pixels=high, image_processing="ernie",
                             video_layout="ernie4_5_vl")
        ours = config.vision_processor()
        theirs = Ernie4_5_VLMoeImageProcessorPil(patch_size=patch, merge_size=2,
                                                 size={"shortest_edge": low, "longest_edge": high})
        reference = theirs(images=images, return_tensors="pt")
        rows, grids = zip(*(ours.image(image) for image in images))
        assert torch.equal(torch.from_numpy(np.concatenate(rows)), reference["pixel_values"])
        assert torch.equal(torch.tensor(grids), reference["image_grid_thw"])
        assert [ours.image_grid(im.height, im.width) for im in images] == [tuple(g) for g in grids]
        seen |= {(patch, *g) for g in grids}
    assert len({g for g in seen if g[0] == 4}) == len(SHAPES)  # at patch 4 every image has a grid of its own


def test_tokens_pixels_and_positions_equal_transformers_processor(data, monkeypatch):
    """Every record (images of six shapes, videos of 7 and 5 frames): token ids and
    ``moe_mm_token_type_ids`` of transformers' processor, its pixel values and grids (bit-exact,
    resized videos included), and ``get_rope_index``'s position ids."""
    from transformers.models.ernie4_5_vl_moe.modeling_ernie4_5_vl_moe import Ernie4_5_VLMoeModel

    from loong_vlm.ernie4_5_vl import testing

    processor = reference_processor(data, monkeypatch)
    rope = Ernie4_5_VLMoeModel(testing.hf_config())
    layout, seen = data.layout, set()
    for record in data.records["train"] + data.records["valid"]:
        seen.add((int(record.where.rsplit(":", 1)[1]) - 1) % len(RECORDS))  # data.jsonl:LINE
        text = data.tokenizer.tokenizer.decode(record.ids.tolist(), skip_special_tokens=False)  # one pad per input
        images = [Image.open(f).convert("RGB") for f in record.images] or None
        videos = [np.stack([np.asarray(Image.open(f).convert("RGB")) for f in v]) for v in record.videos] or None
        reference = processor(text=[text], images=images, videos=videos, return_tensors="pt")
        ids, _ = layout.expanded(record)
        assert ids.tolist() == reference["input_ids"][0].tolist()
        vision = np.isin(ids, [layout.image_token_id, layout.video_token_id, layout.vision_start_id,
                               layout.vision_end_id])
        assert vision.tolist() == reference["moe_mm_token_type_ids"][0].bool().tolist()
        batch = collate_llava([layout.sample([record])], data.processor)
        for pixels, grid in (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw")):
            assert (pixels in batch) == (pixels in reference)
            if pixels in batch:
                assert torch.equal(batch[grid], reference[grid]) and torch.equal(batch[pixels], reference[pixels])
        expected, _ = rope.get_rope_index(reference["input_ids"], reference["mm_token_type_ids"],
                                          reference.get("image_grid_thw"), reference.get("video_grid_thw"))
        n = len(ids) - 1
        assert torch.equal(batch["position_ids"][0, :, :n], expected[:, 0, :n])
    assert seen == set(range(len(RECORDS)))


def test_frame_sampling_and_video_grids_equal_transformers(data):
    """transformers' ``sample_frames`` (no fps given) and the odd-frame repeat, and
    ``get_num_of_video_patches``, for 1 to 60 frames under budgets of 4, 7 and 16 frames. Where
    transformers' float ``arange`` yields one index more than asked for, the extra one is the
    frame count itself (out of range: 7 of 7 frames kept of 17 gives index 17); ours keeps 7."""
    from transformers.video_utils import VideoMetadata

    from loong_vlm.data.ernie import ErnieVisionProcessor

    reference_class = transformers_video_processor_class()
    overshoot = 0
    for budget in (4, 7, 16):
        ours = ErnieVisionProcessor(patch_size=4, temporal_patch_size=2, video_min_pixels=64, video_max_pixels=256,
                                    video_max_frames=budget)
        theirs = reference_class(patch_size=4, merge_size=2, max_frames=budget, draw_on_frames=False,
                                 size={"shortest_edge": 64, "longest_edge": 256})
        for frames in range(1, 61):
            picked = theirs.sample_frames(VideoMetadata(total_num_frames=frames, fps=24.0)).tolist()
            if len(picked) > min(frames, budget):
                assert picked[-1] == frames and len(picked) == budget + 1
                overshoot += 1
                picked = picked[:-1]
            picked += picked[-1:] * (len(picked) % 2)  # _prepare_input_videos repeats the last of an odd count
            assert ours.frame_indices(frames) == picked
            t, h, w = ours.video_grid(frames, 30, 20)
            assert t * h * w == theirs.get_num_of_video_patches(len(picked), 30, 20)
            assert ours.tokens((t, h, w)) == t * h * w // 8  # Ernie4_5_VLMoeProcessor.replace_video_token
    assert overshoot > 0


def test_data_for_another_preprocessing_is_refused():
    from loong_vlm.data.geometry import check_vision_geometry
    from loong_vlm.ernie4_5_vl.config import Ernie45VLConfig

    model = Ernie45VLConfig(name="ernie4_5_vl")
    check_vision_geometry(model, {"image_processing": "ernie", "video_layout": "ernie4_5_vl", "patch_size": 14})
    with pytest.raises(ConfigError, match="data.image_processing=ernie"):
        check_vision_geometry(model, {"image_processing": "dynamic", "patch_size": 14})
    with pytest.raises(ConfigError, match="data.video_layout=ernie4_5_vl"):
        check_vision_geometry(model, {"image_processing": "ernie", "video_layout": "qwen2_5"})
    with pytest.raises(ConfigError, match="data.video_layout=ernie4_5_vl"):
        LlavaConfig(name="llava", image_processing="ernie")
    with pytest.raises(ConfigError, match="data.temporal_patch_size=2"):
        LlavaConfig(name="llava", image_processing="ernie", video_layout="ernie4_5_vl", temporal_patch_size=1)


@pytest.fixture(scope="module")
def debug_data():
    """``ernie4_5_vl_debug``'s config and its prepared LLaVA digits data."""
    from loong_core.config.compose import load_config
    from loong_core.plugins import get_plugin_system

    cfg = load_config(["experiment=ernie4_5_vl_debug", "trainer.global_batch_size=8"])
    module = get_plugin_system().registry().get("dataset", cfg.data.name).load()(cfg.data)
    module.prepare()
    module.setup()
    return cfg, module


class _Decoder(torch.nn.Module):
    """What the composer reads of a foundation chunk when it is not the first stage."""

    model_type, pre_process, post_process = "encoder_or_decoder", False, True
    share_embeddings_and_output_weights = False


def test_vision_start_and_end_tokens_take_the_vision_experts_in_debug_batches(debug_data):
    """The data's overrides give ``model.vision_start_token_ids`` the vision start / end ids; the
    composer built by the provider masks placeholders and those ids on a real micro batch,
    exactly the tokens transformers' processor gives non-zero ``moe_mm_token_type_ids``."""
    from loong_vlm.ernie4_5_vl.provider import Ernie45VLProvider

    cfg, module = debug_data
    provider = Ernie45VLProvider(cfg.model)
    provider.apply_data_overrides(module.model_overrides())
    c, layout = provider.config, module.layout
    assert c.vision_start_token_ids == [layout.vision_start_id, layout.vision_end_id] * 2
    composer = provider.composer_class()(types.SimpleNamespace(context_parallel_size=1, sequence_parallel=False),
                                         _Decoder(), None, None, c.image_token_id, c.video_token_id)
    train, _ = module.build(8, 1, seed=0)
    batch = module.collate([train[i] for i in range(4)])
    assert "pixel_values_videos" in batch and "pixel_values" in batch
    tokens = batch["tokens"]
    mask = composer.vision_mask(tokens).T
    kinds = {"image_token_id": c.image_token_id, "video_token_id": c.video_token_id}
    for i, name in enumerate(("image_start_token_id", "image_end_token_id", "video_start_token_id",
                              "video_end_token_id")):
        kinds[name] = c.vision_start_token_ids[i]
    reference = ernie_package.Ernie4_5_VLMoeProcessor.create_moe_mm_token_type_ids(types.SimpleNamespace(**kinds),
                                                                                   tokens)
    assert torch.equal(mask, reference.bool())
    starts = int((tokens == layout.vision_start_id).sum())
    assert starts == len(batch["image_grid_thw"]) + len(batch["video_grid_thw"])
    placeholders = int(torch.isin(tokens, torch.tensor([c.image_token_id, c.video_token_id])).sum())
    assert int(mask.sum()) == placeholders + 2 * starts


def test_the_balancer_evens_ernie_batches_over_two_data_parallel_ranks(debug_data):
    """ERNIE's packed samples (images of their own sizes, frame-pair videos) differ in cost; with
    the configured balancer at DP2 both ranks get every sample once, and the costlier rank's share
    is never above the contiguous split's, and below it on some steps."""
    from loong_core.plugins import get_plugin_system
    from loong_core.testing import assert_balancer_evens_ranks

    cfg, module = debug_data
    train, _ = module.build(80, 1, seed=0)
    balancer = get_plugin_system().registry().get("balancer", cfg.data.balancer).load()
    assert_balancer_evens_ranks(train, module.sample_cost, balancer)
