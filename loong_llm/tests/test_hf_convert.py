"""``loong convert``: HF -> loong -> HF is bit-exact (any layout in between), the result loads in
transformers, a converted checkpoint trains exactly like online ``model.init_from_hf``, and the
streaming converter keeps a bf16 source bf16 (an fp32 run loads it upcast)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loong_core.testing import losses, run_train
from loong_llm.hf.testing import add_mtp_layers, write_hf_model


def loong(*args: str, timeout: float = 600) -> str:
    """Run the ``loong`` CLI; returns stdout (fails the test with stderr on error)."""
    cmd = [sys.executable, "-m", "loong_core.cli.main", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result.stdout


def tensors(directory):
    from safetensors import safe_open

    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


def assert_same_model(a, b):
    ta, tb = tensors(a), tensors(b)
    assert sorted(ta) == sorted(tb)
    for name in ta:
        assert ta[name].dtype == tb[name].dtype, name
        assert ta[name].shape == tb[name].shape, name
        import torch

        assert ta[name].view(torch.uint8).equal(tb[name].view(torch.uint8)), name  # bitwise
    ca, cb = (json.loads((d / "config.json").read_text()) for d in (a, b))
    ca.pop("transformers_version", None)
    cb.pop("transformers_version", None)
    assert ca == cb


CASES = {  # name: (family, hf-to-loong flags, source dtype, config overrides)
    # Published checkpoints are bf16: every family round-trips bit-exact in bf16 (the dtype
    # recorded at import is written back); fp32 sources are covered by the other cases.
    "llama_bf16": ("llama", [], "bfloat16", {}),
    "qwen2_bf16": ("qwen2", [], "bfloat16", {}),
    "qwen2_with_optimizer": ("qwen2", ["--with-optimizer"], None, {}),
    "qwen3_bf16": ("qwen3", [], "bfloat16", {}),
    "qwen3_moe_bf16": ("qwen3_moe", [], "bfloat16", {}),
    "deepseek_v3_bf16": ("deepseek_v3", [], "bfloat16", {}),
    "deepseek_v3_half_split_rope": ("deepseek_v3", [], None, {"rope_interleave": False}),
    "deepseek_v3_yarn": ("deepseek_v3", [], "bfloat16", {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
        "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
        "mscale_all_dim": 1.0}, "max_position_embeddings": 163840}),
    "deepseek_v2_bf16": ("deepseek_v2", [], "bfloat16", {}),
    "deepseek_v2_lite": ("deepseek_v2", [], None, {"q_lora_rank": None}),
    "qwen3_yarn": ("qwen3", [], None, {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
        "original_max_position_embeddings": 32768}, "max_position_embeddings": 131072}),
    "glm4_moe_bf16": ("glm4_moe", [], "bfloat16", {}),
    "minimax_m2_bf16": ("minimax_m2", [], "bfloat16", {}),
    "qwen3_next_bf16": ("qwen3_next", [], "bfloat16", {}),
    "qwen3_5_bf16": ("qwen3_5", [], "bfloat16", {}),
    "qwen3_5_moe_bf16": ("qwen3_5_moe", [], "bfloat16", {}),
}
SHARDED = {
    "qwen2_tp2": ("qwen2", ["--tp", "2"], None, {}),
    "llama_pp2": ("llama", ["--pp", "2"], None, {}),
    "qwen3_moe_ep2": ("qwen3_moe", ["--ep", "2"], None, {}),
    "deepseek_v3_tp2": ("deepseek_v3", ["--tp", "2"], None, {}),
    "glm4_moe_tp2_ep2": ("glm4_moe", ["--tp", "2", "--ep", "2"], None, {}),
    "minimax_m2_tp2": ("minimax_m2", ["--tp", "2"], None, {}),
    "qwen3_next_tp2_ep2": ("qwen3_next", ["--tp", "2", "--ep", "2"], None, {}),
    "qwen3_5_moe_tp2_ep2": ("qwen3_5_moe", ["--tp", "2", "--ep", "2"], None, {}),
}


# Multi-token prediction layers stored with the model (DeepSeek-V3 / V3.2, GLM-4.5: the copies
# of the embedding and output head in each MTP layer are written back too): case -> (family,
# flags, source dtype, depth, config overrides).
MTP_CASES = {
    "deepseek_v3_mtp_bf16": ("deepseek_v3", [], "bfloat16", 1, {}),
    # DeepSeek-V3.2 as published: YaRN (factor 40), an MTP layer with its own indexer, bf16
    "deepseek_v32_yarn_mtp_bf16": ("deepseek_v32", [], "bfloat16", 1, {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
        "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
        "mscale_all_dim": 1.0}, "max_position_embeddings": 163840}),
    "glm4_moe_mtp2_tp2_ep2": ("glm4_moe", ["--tp", "2", "--ep", "2"], None, 2, {}),
}


def _write_source(directory, family, dtype, overrides, mtp_depth=0):
    import torch

    src = write_hf_model(family, directory / "src", seed=3,
                         dtype=getattr(torch, dtype) if dtype else None, **overrides)
    if mtp_depth:
        add_mtp_layers(src, mtp_depth)
    return src


# Every round trip: case -> (family, flags, source dtype, config overrides, MTP depth).
ROUND_TRIPS = {**{case: (*spec, 0) for case, spec in {**CASES, **SHARDED}.items()},
               **{case: (family, flags, dtype, overrides, depth)
                  for case, (family, flags, dtype, depth, overrides) in MTP_CASES.items()}}
LAYOUT_FLAGS = ("--tp", "--pp", "--ep")
ONE_RANK = [c for c, spec in ROUND_TRIPS.items() if not set(spec[1]) & set(LAYOUT_FLAGS)]
MULTI_RANK = [c for c in ROUND_TRIPS if c not in ONE_RANK]
# The sharded case whose export test_exported_moe_model_loads_in_transformers loads.
MOE_EXPORT = "qwen3_moe_ep2"


def _convert_in_one_process(request, root, cases):
    """Round trips of the ``cases`` this session selected, with few process start-ups
    (``round_trip_driver.py``: ``loong convert``'s CLI in one process for the one-rank cases and
    every export; one torchrun job per world size for the sharded cases' ranks).

    Returns:
        ``case -> (source, exported, failure or None)``.
    """
    users = [item for item in request.session.items if request.fixturename in getattr(item, "fixturenames", ())]
    selected = {getattr(item, "callspec", None) and item.callspec.params.get("case") or MOE_EXPORT for item in users}
    jobs, sources = {}, {}
    for case in [c for c in cases if c in selected]:
        family, flags, dtype, overrides, depth = ROUND_TRIPS[case]
        sources[case] = _write_source(root / case, family, dtype, overrides, depth)
        jobs[case] = [str(root / case), ["--family", family, *flags, str(sources[case])]]
    (root / "jobs.json").write_text(json.dumps(jobs))
    driver = Path(__file__).with_name("round_trip_driver.py")
    result = subprocess.run([sys.executable, str(driver), str(root / "jobs.json"), str(root / "results.json")],
                            capture_output=True, text=True, timeout=1800, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    failures = json.loads((root / "results.json").read_text())
    return {case: (sources[case], root / case / "out", failures[case]) for case in jobs}


@pytest.fixture(scope="module")
def one_rank_round_trips(request, tmp_path_factory):
    return _convert_in_one_process(request, tmp_path_factory.mktemp("one_rank"), ONE_RANK)


@pytest.fixture(scope="module")
def sharded_round_trips(request, tmp_path_factory):
    return _convert_in_one_process(request, tmp_path_factory.mktemp("sharded"), MULTI_RANK)


@pytest.mark.parametrize("case", ONE_RANK)
def test_round_trip_is_bit_exact(one_rank_round_trips, case):
    src, out, failure = one_rank_round_trips[case]
    assert failure is None, failure
    assert_same_model(src, out)


@pytest.mark.multirank
@pytest.mark.parametrize("case", MULTI_RANK)
def test_round_trip_through_sharded_checkpoint_is_bit_exact(sharded_round_trips, case):
    src, out, failure = sharded_round_trips[case]
    assert failure is None, failure
    assert_same_model(src, out)


@pytest.mark.multirank
def test_exported_moe_model_loads_in_transformers(sharded_round_trips):
    import torch
    import transformers as tf

    # the fp32 qwen3_moe source (seed 3) exported from its EP2 checkpoint, bit-exact to the source
    src, out, failure = sharded_round_trips[MOE_EXPORT]
    assert failure is None, failure
    tokens = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = tf.AutoModelForCausalLM.from_pretrained(src).eval()(tokens).logits
        got = tf.AutoModelForCausalLM.from_pretrained(out).eval()(tokens).logits
    assert torch.equal(expected, got)


def test_unknown_family_is_refused_with_the_choices(tmp_path):
    cmd = [sys.executable, "-m", "loong_core.cli.main", "convert", "hf-to-loong", "--family",
           "qwen", str(tmp_path), str(tmp_path / "x")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "Unknown family 'qwen'" in result.stderr and "qwen2" in result.stderr


def test_converted_checkpoint_trains_like_online_hf_loading(tmp_path):
    """init_from=converted == model.init_from_hf=source, and resuming the converted checkpoint
    (which stores the run's LR schedule) == starting fresh: same losses step by step."""
    src = write_hf_model("qwen3", tmp_path / "src", seed=5, vocab_size=512)
    # the schedule of experiment=qwen3_debug with train_iters=2, stored for the resumed run
    schedule = ["optim.lr=3.0e-3", "optim.min_lr=3.0e-4", "optim.lr_warmup_iters=2",
                "trainer.train_iters=2"]
    out = loong("convert", "hf-to-loong", "--family", "qwen3", str(src), str(tmp_path / "ckpt"),
                "--with-optimizer", *schedule)
    line = next(x for x in out.splitlines() if x.startswith("train from it:"))
    model_overrides = [o for o in line.split()[4:] if o.startswith("model.")]
    common = ["experiment=qwen3_debug", "trainer.train_iters=2", "trainer.log_interval=1",
              "trainer.eval_interval=0", "trainer.progress_bar=false", "trainer.tensorboard=false",
              "trainer.save_at_end=false"]
    run_train([*common, f"model.init_from_hf={src}", f"trainer.run_dir={tmp_path / 'online'}"])
    run_train([*common, *model_overrides, f"trainer.init_from={tmp_path / 'ckpt'}",
               f"trainer.run_dir={tmp_path / 'offline'}"])
    run_train([*common, *model_overrides, f"trainer.resume={tmp_path / 'ckpt'}",
               f"trainer.run_dir={tmp_path / 'resumed'}"])
    online, offline, resumed = (losses(tmp_path / d) for d in ("online", "offline", "resumed"))
    assert sorted(online) == sorted(offline) == sorted(resumed) == [1, 2]
    for step in (1, 2):  # same weights, and a resumed fresh optimizer steps like a new one
        assert offline[step] == pytest.approx(online[step], abs=1e-6)
        assert resumed[step] == pytest.approx(online[step], abs=1e-6)


def test_bf16_source_stays_bf16_and_an_fp32_run_trains_from_it_like_from_the_hf_dir(tmp_path):
    import torch

    from loong_core.checkpoint.restricted import read_metadata_file

    src = write_hf_model("qwen3", tmp_path / "src", seed=5, dtype=torch.bfloat16, vocab_size=512)
    loong("convert", "hf-to-loong", "--family", "qwen3", str(src), str(tmp_path / "ckpt"))
    record = json.loads((tmp_path / "ckpt" / "loong_complete.json").read_text())
    assert record["hf_dtype"] == "bfloat16" and record["model_only"]
    stored = read_metadata_file(tmp_path / "ckpt" / ".metadata").state_dict_metadata
    dtypes = {k: m.properties.dtype for k, m in stored.items() if hasattr(m, "properties")}
    # the matrices keep the source's dtype (the norms are fp32 parameters in the model; their
    # bf16 values are exact in fp32)
    for key in ("embedding.word_embeddings.weight", "decoder.layers.self_attention.linear_qkv.weight",
                "decoder.layers.mlp.linear_fc1.weight", "decoder.layers.mlp.linear_fc2.weight"):
        assert dtypes[key] == torch.bfloat16, (key, dtypes[key])
    # the checkpoint's tensors weigh what the source's do, not twice that (fp32)
    distcp = sum(p.stat().st_size for p in (tmp_path / "ckpt").glob("*.distcp"))
    source = (src / "model.safetensors").stat().st_size
    assert distcp < 1.5 * source, (distcp, source)

    common = ["experiment=qwen3_debug", "model.ffn_hidden_size=96", "model.vocab_size=512",
              "model.max_position_embeddings=128", "model.rotary_base=10000.0", "data.seq_length=128",
              "trainer.train_iters=2", "trainer.log_interval=1", "trainer.eval_interval=0",
              "trainer.progress_bar=false", "trainer.tensorboard=false", "trainer.save_at_end=false",
              "parallel.mixed_precision=fp32"]
    run_train([*common, f"trainer.init_from={tmp_path / 'ckpt'}", f"trainer.run_dir={tmp_path / 'converted'}"])
    run_train([*common, f"model.init_from_hf={src}", f"trainer.run_dir={tmp_path / 'online'}"])
    converted, online = losses(tmp_path / "converted"), losses(tmp_path / "online")
    assert sorted(converted) == sorted(online) == [1, 2]
    for step in (1, 2):  # the bf16 values upcast on load are the values the online path loads
        assert converted[step] == pytest.approx(online[step], abs=1e-6)


def test_shard_writer_streams_planned_shards_with_an_index(tmp_path):
    import torch
    from safetensors.torch import load_file

    from loong_core.errors import CheckpointError
    from loong_llm.hf.io import SafetensorsReader, ShardWriter

    generator = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randn(8, 4, generator=generator).to(torch.bfloat16),
               "b": torch.randn(16, generator=generator), "c": torch.arange(6).reshape(2, 3),
               "d": torch.randn(5, 4, generator=generator).to(torch.bfloat16)}
    writer = ShardWriter(tmp_path, [(k, tuple(v.shape), v.dtype) for k, v in tensors.items()],
                         max_bytes=100)
    with pytest.raises(CheckpointError, match="expected a"):
        writer.add("b", tensors["b"])
    for name, tensor in tensors.items():
        writer.add(name, tensor)
    writer.close()
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == [f"model-0000{k}-of-00003.safetensors"
                                                         for k in (1, 2, 3)]
    read = {}
    for path in tmp_path.glob("*.safetensors"):
        read.update(load_file(path))  # safetensors itself reads the streamed files
    reader = SafetensorsReader(tmp_path)
    for name, tensor in tensors.items():
        assert read[name].dtype == tensor.dtype and torch.equal(read[name], tensor), name
        assert torch.equal(reader.get(name), tensor) and reader.get_size(name) == tensor.nbytes


def test_the_cli_process_prints_everything_before_it_ends(tmp_path):
    """``loong convert`` skips the interpreter's teardown after success; piped output is
    block-buffered, and what it printed and logged still arrives."""
    src = write_hf_model("llama", tmp_path / "hf")
    out = subprocess.run([sys.executable, "-m", "loong_core.cli.main", "convert", "hf-to-loong",
                          "--family", "llama", str(src), str(tmp_path / "ckpt")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-1].startswith("train from it: loong train ")
    assert "streamed" in out.stderr  # the log line, flushed
