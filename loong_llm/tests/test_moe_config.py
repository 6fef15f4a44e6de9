"""MoE config rules, checked when the config is loaded (before any process starts)."""

from __future__ import annotations

import pytest

from loong_core.config.compose import load_config
from loong_core.errors import ConfigError

MOE_TP2 = ["experiment=qwen3_moe_debug", "parallel.tensor_model_parallel_size=2"]


def test_moe_under_tensor_parallelism_without_sequence_parallelism_is_a_config_error():
    # megatron-core would raise a ValueError in the first training forward of an MoE layer.
    with pytest.raises(ConfigError, match=r"'parallel.sequence_parallel' = false with "
                       r"parallel.tensor_model_parallel_size = 2: .* set parallel.sequence_parallel=true"):
        load_config([*MOE_TP2, "parallel.sequence_parallel=false"])
    assert load_config([*MOE_TP2, "parallel.sequence_parallel=true"]).parallel.sequence_parallel


def test_tensor_parallelism_without_sequence_parallelism_is_allowed_without_moe_layers():
    load_config([*MOE_TP2, "parallel.sequence_parallel=false", "model.moe_layer_freq=[0,0]"])
    load_config(["experiment=llama_debug", "parallel.tensor_model_parallel_size=2",
                 "parallel.sequence_parallel=false"])


OVERLAP = ["experiment=deepseek_v3_debug", "model.moe_shared_expert_overlap=true"]


@pytest.mark.parametrize("override, message", [
    ("model.moe_shared_expert_intermediate_size=0",
     "needs a shared expert (model.moe_shared_expert_intermediate_size > 0)"),
    ("model.moe_token_dispatcher_type=allgather", "works with the alltoall dispatcher only"),
    ("parallel.recompute_modules=[shared_experts]", "cannot recompute the shared expert"),
])
def test_shared_expert_overlap_without_what_it_overlaps_is_named(override, message):
    extra = ["parallel.recompute_granularity=selective"] if "recompute" in override else []
    with pytest.raises(ConfigError, match=r"'model.moe_shared_expert_overlap' = true " + message.replace("(", r"\(")
                       .replace(")", r"\)")):
        load_config([*OVERLAP, *extra, override])
    assert load_config(OVERLAP).model.moe_shared_expert_overlap


def test_shared_expert_overlap_is_turned_off_with_a_warning_where_there_are_no_cuda_streams(tmp_path):
    """On a CPU megatron-core's side stream does not exist: the run trains without the overlap,
    says so, and its losses are those of the run without the option."""
    from loong_core.testing import losses, run_train

    common = ["experiment=deepseek_v3_debug", "trainer.train_iters=2", "trainer.eval_interval=0",
              "trainer.save_at_end=false", "trainer.log_interval=1"]
    run_train([*common, f"trainer.run_dir={tmp_path / 'plain'}"])
    proc = run_train([*common, "model.moe_shared_expert_overlap=true", f"trainer.run_dir={tmp_path / 'overlap'}"])
    assert "model.moe_shared_expert_overlap=true: megatron-core overlaps it on a CUDA side stream" in proc.stderr
    assert losses(tmp_path / "overlap") == losses(tmp_path / "plain")
