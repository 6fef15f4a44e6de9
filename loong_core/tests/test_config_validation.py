"""Configs are validated before anything is built; errors name the path, choices and a fix."""

from __future__ import annotations

import re

import pytest

from loong_core.config.compose import load_config
from loong_core.config.schema import LoongConfig
from loong_core.errors import ConfigError


def test_experiment_composes_into_typed_config(toy_site):
    cfg = load_config(["experiment=toy", "model.hidden_size=64", "trainer.train_iters=7"])
    assert isinstance(cfg, LoongConfig)
    assert type(cfg.model).__name__ == "ToyModelConfig"
    assert cfg.model.hidden_size == 64
    assert cfg.trainer.train_iters == 7
    assert cfg.parallel.tensor_model_parallel_size == 1


@pytest.mark.parametrize("override, expected", [
    ("trainer.trian_iters=3", ["Unknown key 'trainer.trian_iters'", "Did you mean 'train_iters'?"]),
    ("model.hiden_size=3", ["Unknown key 'model.hiden_size'", "Did you mean 'hidden_size'?", "ToyModelConfig"]),
    ("trainer.train_iters=abc", ["'trainer.train_iters' = 'abc'", "expected int"]),
    ("optim.lr_decay_style=cosin", ["'optim.lr_decay_style'", "Did you mean 'cosine'?", "linear"]),
    ("model.name=toy_gtp", ["Unknown model 'toy_gtp'", "Did you mean 'toy_gpt'?", "Installed: toy_gpt"]),
    ("data.balancer=gredy", ["Unknown balancer 'gredy'", "at 'data.balancer'", "Did you mean 'greedy'?"]),
    ("parallel.engine=megatrom", ["Unknown engine 'megatrom'", "Did you mean 'megatron'?"]),
    ("model.dropout=high", ["'model.dropout' = 'high'", "float | null"]),
    ("device=cdua", ["Unknown option 'cdua' for config group 'device'", "Did you mean 'cuda'?"]),
    ("trainer.global_batch_size=6", ["divisible by 'trainer.micro_batch_size'", "global_batch_size=4 or 8"]),
    ("parallel.recompute_granularity=full", ["needs parallel.recompute_method and parallel.recompute_num_layers",
                                             "parallel.recompute_method=uniform parallel.recompute_num_layers=1"]),
])
def test_bad_value_gives_one_clear_error(toy_site, override, expected):
    with pytest.raises(ConfigError) as excinfo:
        load_config(["experiment=toy", override])
    for fragment in expected:
        assert fragment in str(excinfo.value)


def test_missing_model_says_how_to_choose_one(toy_site):
    with pytest.raises(ConfigError, match=r"'model.name' is not set.*Installed: toy_gpt"):
        load_config(["experiment=toy", "~model"])


def test_megatron_names_are_the_parallel_keys():
    from dataclasses import fields

    from loong_core.config.schema import OptimConfig, ParallelConfig, TrainerConfig

    names = {f.name for cls in (ParallelConfig, OptimConfig, TrainerConfig) for f in fields(cls)}
    for megatron_name in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                          "virtual_pipeline_model_parallel_size", "context_parallel_size",
                          "expert_model_parallel_size", "sequence_parallel",
                          "use_distributed_optimizer", "micro_batch_size", "global_batch_size",
                          "lr", "min_lr", "lr_warmup_iters", "lr_decay_style", "train_iters",
                          "clip_grad", "weight_decay", "recompute_granularity"):
        assert megatron_name in names


@pytest.mark.parametrize("key, purpose", [("trainer.run_dir", "run"), ("data.cache_dir", "data cache")])
def test_run_and_cache_folders_must_be_writable(toy_site, tmp_path, key, purpose):
    from loong_core.config.validate import check_writable_paths

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    cfg = load_config(["experiment=toy", f"{key}={blocker / 'sub'}"])  # reading a run: fine
    with pytest.raises(ConfigError, match=rf"'{key}' = .*a_file is a file, so the {purpose} folder cannot be created"):
        check_writable_paths(cfg)


def test_recompute_keys_that_do_not_fit_the_granularity_are_named(toy_site):
    with pytest.raises(ConfigError, match="needs parallel.recompute_num_layers"):
        load_config(["experiment=toy", "parallel.recompute_granularity=full", "parallel.recompute_method=block"])
    with pytest.raises(ConfigError, match="'parallel.recompute_num_layers' applies only with recompute_gran"):
        load_config(["experiment=toy", "parallel.recompute_granularity=selective", "parallel.recompute_num_layers=1"])


@pytest.mark.parametrize("overrides, message", [
    (["trainer.profile_step_start=3", "trainer.profile_step_end=3"], "'trainer.profile_step_end' = 3 must be above"),
    (["trainer.train_iters=6", "trainer.profile_step_start=9", "trainer.profile_step_end=11"],
     "after the last step (trainer.train_iters = 6)"),
    (["trainer.profile_ranks=[]"], "'trainer.profile_ranks' = []"),
    (["trainer.profile_ranks=[-1]"], "'trainer.profile_ranks' = [-1]"),
])
def test_a_profile_that_would_record_nothing_is_named(toy_site, overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(["experiment=toy", "trainer.profile=true", *overrides])
    load_config(["experiment=toy", *overrides])  # only checked when the profile is on


def test_the_profile_keys_keep_megatrons_defaults(toy_site):
    t = load_config(["experiment=toy", "trainer.profile=true", "trainer.train_iters=20"]).trainer
    assert (t.profile_step_start, t.profile_step_end, t.profile_ranks) == (10, 12, [0])
