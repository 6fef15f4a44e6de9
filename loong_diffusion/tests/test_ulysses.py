"""Ulysses sequence parallelism (``parallel.ulysses_size=2``) of the three DiT families follows the
one-rank run: losses within 1e-5 and gradient norms within 1e-5 (relative) at every step, fp32,
from the same initial state (the same seed builds the same weights on every layout)."""

from __future__ import annotations

import pytest

from loong_core.testing import read_metrics, run_gloo_workers, run_train

STEPS = 4
COMMON = ["trainer.progress_bar=false", "trainer.tensorboard=false", "trainer.log_interval=1",
          f"trainer.train_iters={STEPS}", "trainer.eval_interval=0", "trainer.save_interval=0",
          "parallel.mixed_precision=fp32"]


def _curve(run_dir) -> dict[int, tuple[float, float]]:
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in read_metrics(run_dir)}


def _max_diff(ref: dict, got: dict) -> float:
    assert sorted(got) == sorted(ref) == list(range(1, STEPS + 1)), (ref, got)
    for step, (_loss, norm) in got.items():
        assert norm == pytest.approx(ref[step][1], rel=1e-5), (step, ref, got)
    return max(abs(got[s][0] - ref[s][0]) for s in ref)


# (experiment, layouts under Ulysses 2 on 2 ranks)
CASES = {
    "dit_digits_debug": [["parallel=ddp"]],
    "wan_debug": [["parallel=fsdp", "parallel.activation_checkpointing=true"]],
    "qwen_image_debug": [["parallel=ddp"], ["parallel=fsdp"]],
}


@pytest.mark.multirank
@pytest.mark.parametrize("experiment", sorted(CASES))
def test_ulysses_2_equals_one_rank(experiment, tmp_path):
    args = [f"experiment={experiment}", *COMMON]
    run_train([*args, f"trainer.run_dir={tmp_path / 'ref'}"])
    ref = _curve(tmp_path / "ref")
    for i, layout in enumerate(CASES[experiment]):
        run_train([*args, *layout, "parallel.ulysses_size=2", f"trainer.run_dir={tmp_path / str(i)}"],
                  nproc=2)
        diff = _max_diff(ref, _curve(tmp_path / str(i)))
        print(f"{experiment} {' '.join(layout)} ulysses 2: max |loss - one rank| = {diff:.2e}")
        assert diff < 1e-5, (experiment, layout, diff)


def test_ulysses_size_not_dividing_the_heads_is_a_config_error(tmp_path):
    # wan_debug has 2 attention heads.
    result = run_train(["experiment=wan_debug", "parallel.ulysses_size=3", *COMMON,
                        f"trainer.run_dir={tmp_path}"], nproc=3, check=False)
    assert result.returncode != 0
    text = result.stdout + result.stderr
    assert "'parallel.ulysses_size' = 3 must divide the attention heads of model 'wan' (2 heads" in text, text
    assert "valid ulysses_size: 1, 2" in text and "Traceback" not in text, text


# Two gloo ranks run the small DiT with a Ulysses group: every block sees half of the tokens, each
# rank's output holds its own tokens only (zeros elsewhere: no gather), their sum and the input
# and parameter gradients (loss over each rank's own tokens) equal one rank's.
DIT_WORKER = r"""
import json, os, sys
import torch
import torch.distributed as dist
from loong_core.engines.torch_native import ulysses
from loong_diffusion.families.dit.config import DiTConfig
from loong_diffusion.families.dit.model import DiT

rank, port = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
torch.manual_seed(0)
model = DiT(DiTConfig(hidden_size=32, num_layers=2, num_attention_heads=2))
for p in model.parameters():  # no zero-initialised layers: every path carries a gradient
    torch.nn.init.normal_(p, std=0.2)
x = torch.randn(2, 1, 8, 8)
t, label = torch.tensor([100.0, 700.0]), torch.tensor([3, 5])


def run():
    xx = x.clone().requires_grad_()
    seen = []
    hook = model.blocks[0].register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[1]))
    out = model(xx, t, label)
    hook.remove()
    model.zero_grad()
    out.square().sum().backward()  # under Ulysses: over this rank's tokens, its share of the loss
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    return out.detach(), xx.grad, grads, seen[0]


ref_out, ref_dx, ref_grads, ref_tokens = run()
ulysses.set_group(dist.group.WORLD)
out, dx, grads, tokens = run()
# Patches (4 x 4 of 2 x 2 pixels, row-major) with a non-zero output on this rank.
own = out.abs().amax(dim=(0, 1)).view(4, 2, 4, 2).permute(0, 2, 1, 3).reshape(16, 4).ne(0).any(1)
dist.all_reduce(out)  # each rank's output holds its own tokens (8 of 16 patches), zeros elsewhere
dist.all_reduce(dx)
dist.all_reduce(grads)  # parameter gradients summed over the group
def rel(a, b):  # largest difference relative to the largest reference value
    return ((a - b).abs().max() / b.abs().max()).item()


print(json.dumps({"tokens": [ref_tokens, tokens], "out": rel(out, ref_out), "dx": rel(dx, ref_dx),
                  "grads": rel(grads, ref_grads), "own": own.tolist(), "rank": rank}), flush=True)
os._exit(0)  # skip interpreter teardown (gloo threads)
"""


@pytest.mark.multirank
def test_dit_blocks_see_half_the_tokens_and_match_one_rank():
    for result in run_gloo_workers(DIT_WORKER):
        assert result["tokens"] == [16, 8], result
        # The non-zero output patches are this rank's contiguous half of the tokens.
        assert result["own"] == [i // 8 == result["rank"] for i in range(16)], result
        for name in ("out", "dx", "grads"):  # fp32 (the timestep embedding is fp32), relative
            assert result[name] < 1e-6, (name, result)
