"""The torch engine: DDP / FSDP2 / HSDP follow the one-rank loss curve, and resume is exact."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from loong_core.testing import install_plugin, losses, run_train

PLUGIN = '''
from loong_core.hookspecs import hookimpl

@hookimpl
def loong_register_models(register):
    register("toy_mlp", "loong_torch_toy.model:ToyMLPProvider", config="loong_torch_toy.config:ToyMLPConfig",
             engines=("torch",))

@hookimpl
def loong_register_datasets(register):
    register("toy_regression", "loong_torch_toy.data:ToyRegression", config="loong_torch_toy.config:ToyDataConfig")

@hookimpl
def loong_on_log_step(run, step, metrics):
    import os
    if step == int(os.environ.get("CRASH_AT_STEP", "-1")):
        os._exit(17)   # a hard crash: no cleanup, no final checkpoint

@hookimpl
def loong_config_search_path():
    return "pkg://loong_torch_toy.conf"
'''

CONFIG = '''
from dataclasses import dataclass
from loong_core.config.schema import DataConfig, ModelConfig

@dataclass
class ToyMLPConfig(ModelConfig):
    width: int = 32
    depth: int = 3
    dropout: float = 0.0

@dataclass
class ToyDataConfig(DataConfig):
    features: int = 8
'''

MODEL = '''
import torch
from loong_core.engines.model_provider import ModelProvider

class Block(torch.nn.Module):
    def __init__(self, width, dropout):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.fc1, self.fc2 = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)
        self.dropout = torch.nn.Dropout(dropout)

    def forward(self, x):
        return x + self.dropout(self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x)))))

class ToyMLP(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.inp = torch.nn.Linear(8, c.width)
        self.blocks = torch.nn.ModuleList(Block(c.width, c.dropout) for _ in range(c.depth))
        self.out = torch.nn.Linear(c.width, 1)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h).squeeze(-1)

class ToyMLPProvider(ModelProvider):
    engines = ("torch",)

    def build_torch_model(self):
        return ToyMLP(self.config)

    def torch_blocks(self, model):
        return list(model.blocks)

    def torch_forward_step(self, model, batch):
        err = (model(batch["x"]).float() - batch["y"]) ** 2
        loss_sum = err.sum()
        count = torch.tensor(float(err.numel()), device=err.device)
        return loss_sum, count, {"loss": torch.stack([loss_sum.detach(), count])}

    def flops_per_token(self, seq_length):
        return 0.0
'''

DATA = '''
import torch

class Items:
    def __init__(self, n, seed):
        self.n, self.seed = n, seed
        g = torch.Generator().manual_seed(7)
        self.w = torch.randn(8, generator=g)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 100003 + i)
        x = torch.randn(8, generator=g)
        return {"x": x, "y": torch.tanh(x @ self.w) + 0.5 * x[0] * x[1]}

class ToyRegression:
    def __init__(self, config):
        self.config = config
    def prepare(self): pass
    def setup(self): pass
    def model_overrides(self): return {}
    def build(self, n_train, n_valid, seed):
        return Items(n_train, seed), Items(n_valid, seed + 1)
    def sample_cost(self, sample): return 1.0
'''

EXPERIMENT = """# @package _global_
name: toy_torch
model: {name: toy_mlp}
data: {name: toy_regression}
parallel: {engine: torch}
optim: {lr: 1.0e-2, min_lr: 1.0e-3, lr_warmup_iters: 2, clip_grad: 1.0}
trainer: {train_iters: 6, micro_batch_size: 2, global_batch_size: 8, log_interval: 1,
          eval_interval: 3, eval_iters: 1, progress_bar: false, tensorboard: false}
"""

STEPS = 6


@pytest.fixture(scope="module")
def toy_env(tmp_path_factory):
    site = tmp_path_factory.mktemp("torch_site")
    install_plugin(site, "loong-torch-toy", "torch_toy", {
        "loong_torch_toy.plugin": PLUGIN, "loong_torch_toy.config": CONFIG,
        "loong_torch_toy.model": MODEL, "loong_torch_toy.data": DATA})
    conf = site / "loong_torch_toy" / "conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "__init__.py").write_text("")
    (conf / "experiment" / "toy_torch.yaml").write_text(EXPERIMENT)
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "LOONG_PLUGINS": "torch_toy"}


@pytest.fixture(scope="module")
def reference(toy_env, tmp_path_factory):
    root = tmp_path_factory.mktemp("torch_engine")
    run_train(["experiment=toy_torch", f"trainer.run_dir={root / 'ref'}"], env=toy_env)
    return losses(root / "ref"), root


LAYOUTS = {
    "ddp2": (2, ["parallel=ddp"]),
    "fsdp2": (2, ["parallel=fsdp"]),
    "hsdp2": (2, ["parallel=hsdp", "parallel.data_parallel_shard_size=1"]),
    "fsdp2_activation_checkpointing": (2, ["parallel=fsdp", "parallel.activation_checkpointing=true"]),
}


@pytest.mark.multirank
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_loss_curve_matches_one_rank(toy_env, reference, layout):
    ref, root = reference
    nproc, overrides = LAYOUTS[layout]
    run_train(["experiment=toy_torch", *overrides, f"trainer.run_dir={root / layout}"], nproc=nproc, env=toy_env)
    got = losses(root / layout)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert got[step] == pytest.approx(ref[step], abs=1e-5, rel=1e-5), (layout, step, got, ref)
    assert ref[STEPS] < ref[1]  # it learns, so a frozen model could not pass


def test_activation_checkpointing_is_exact_on_one_rank(toy_env, reference):
    ref, root = reference
    run_dir = root / "ac1"
    run_train(["experiment=toy_torch", "parallel.activation_checkpointing=true", f"trainer.run_dir={run_dir}"],
              env=toy_env)
    assert losses(run_dir) == ref


@pytest.mark.multirank
@pytest.mark.parametrize("layout", ["ddp", "fsdp"])
def test_resume_after_crash_reproduces_losses_bit_for_bit(toy_env, tmp_path, layout):
    common = ["experiment=toy_torch", f"parallel={layout}", "model.dropout=0.2", "trainer.save_interval=3"]
    run_train([*common, f"trainer.run_dir={tmp_path / 'full'}"], nproc=2, env=toy_env)
    reference = losses(tmp_path / "full")
    crashed = tmp_path / "crashed"
    proc = run_train([*common, f"trainer.run_dir={crashed}"], nproc=2, env={**toy_env, "CRASH_AT_STEP": "5"},
                     check=False)
    assert proc.returncode != 0
    assert sorted(p.name for p in (crashed / "checkpoints").iterdir()) == ["iter_0000003"]
    run_train([*common, f"trainer.run_dir={crashed}", "trainer.resume=auto"], nproc=2, env=toy_env)
    resumed = losses(crashed)
    assert [resumed[s] for s in range(1, STEPS + 1)] == [reference[s] for s in range(1, STEPS + 1)]
    assert losses(crashed, "valid") == losses(tmp_path / "full", "valid")


@pytest.mark.multirank
def test_ddp_checkpoint_initialises_an_fsdp2_run(toy_env, reference):
    _, root = reference
    init = root / "ref" / "checkpoints" / "iter_0000006"
    run_dir = root / "init_fsdp"
    run_train(["experiment=toy_torch", "parallel=fsdp", f"trainer.init_from={init}", "trainer.train_iters=1",
               "trainer.eval_at_start=true", f"trainer.run_dir={run_dir}"], nproc=2, env=toy_env)
    # validation before any step evaluates the loaded weights on the same batch as the end of ref
    assert losses(run_dir, "valid")[0] == pytest.approx(losses(root / "ref", "valid")[6], abs=1e-6)


@pytest.mark.parametrize("style, warmup", [("cosine", 3), ("linear", 0), ("constant", 2)])
def test_lr_schedule_equals_megatrons(style, warmup):
    import torch
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    from loong_core.config.schema import LoongConfig
    from loong_core.engines.torch_native.optim import LRSchedule

    cfg = LoongConfig()
    cfg.optim.lr, cfg.optim.min_lr, cfg.optim.lr_warmup_iters, cfg.optim.lr_decay_style = 1e-3, 1e-4, warmup, style
    cfg.trainer.train_iters = 12
    ours = LRSchedule(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), cfg)
    ref_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    ref = OptimizerParamScheduler(ref_opt, init_lr=0.0 if warmup else 1e-3, max_lr=1e-3, min_lr=1e-4,
                                  lr_warmup_steps=warmup, lr_decay_steps=12, lr_decay_style=style, start_wd=0.0,
                                  end_wd=0.0, wd_incr_steps=12, wd_incr_style="constant")
    for _ in range(15):
        assert ours.optimizer.param_groups[0]["lr"] == pytest.approx(ref_opt.param_groups[0]["lr"], rel=1e-12)
        ours.step()
        ref.step(increment=1)


class _MegatronOnly:
    engines = ("megatron",)


def test_torch_engine_rejects_megatron_only_models_and_model_parallel_sizes():
    from loong_core.config.schema import LoongConfig
    from loong_core.engines.torch_native.engine import TorchEngine
    from loong_core.errors import ConfigError

    cfg = LoongConfig()
    cfg.model.name = "llama"
    with pytest.raises(ConfigError, match="does not support parallel.engine=torch"):
        TorchEngine(cfg, None, _MegatronOnly()).init_parallel()
    cfg.parallel.tensor_model_parallel_size = 2
    provider = type("P", (), {"engines": ("torch",)})()
    with pytest.raises(ConfigError, match="tensor_model_parallel_size"):
        TorchEngine(cfg, None, provider).init_parallel()


def _trace_events(trace: Path) -> list[dict]:
    return json.loads(trace.read_text())["traceEvents"]


@pytest.mark.multirank
def test_profile_records_the_chosen_steps_on_the_chosen_ranks(toy_env, reference, tmp_path):
    """trainer.profile on DDP2: each listed rank writes a trace of steps 2-3 only (Megatron's
    step_start up to, not including, step_end) with the gradient all-reduce in it, and an ops table;
    the losses are those of the run without the profiler."""
    ref, _ = reference
    run_dir = tmp_path / "profiled"
    run_train(["experiment=toy_torch", "parallel=ddp", "trainer.profile=true", "trainer.profile_step_start=2",
               "trainer.profile_step_end=4", "trainer.profile_ranks=[0,1]", f"trainer.run_dir={run_dir}"],
              nproc=2, env=toy_env)
    profile = run_dir / "profile"
    for rank in (0, 1):
        traces = list(profile.glob(f"rank{rank}.*.pt.trace.json"))
        assert len(traces) == 1, sorted(p.name for p in profile.iterdir())
        names = {event.get("name", "") for event in _trace_events(traces[0])}
        steps = {name.split(".")[1] for name in names if name.startswith("loong.step_")}
        assert steps == {"step_2", "step_3"}, steps
        assert {"loong.step_2.data", "loong.step_3.train_step"} <= names
        assert any("allreduce" in name for name in names), "the DDP gradient all-reduce is not in the trace"
        table = (profile / f"rank{rank}.ops.txt").read_text()
        assert table.startswith("steps 2..3") and "aten::" in table
    got = losses(run_dir)
    for step in range(1, STEPS + 1):
        assert got[step] == pytest.approx(ref[step], abs=1e-5, rel=1e-5), (step, got, ref)

