"""Ulysses sequence parallelism pieces: the config rules, and the all-to-all attention of two gloo
ranks (image tokens sharded, text tokens replicated) against one-rank attention, forward and
backward."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from loong_core.config.ulysses_rules import check_ulysses, check_ulysses_world
from loong_core.errors import ConfigError
from loong_core.testing import run_gloo_workers


class _Heads(SimpleNamespace):
    def ulysses_heads(self):
        return self.num_attention_heads


def _cfg(n, heads=None, engine="torch"):
    model = _Heads(name="wan", num_attention_heads=heads) if heads else SimpleNamespace(name="llama_debug")
    return SimpleNamespace(parallel=SimpleNamespace(ulysses_size=n, engine=engine), model=model)


def test_ulysses_size_must_divide_the_heads_and_the_world():
    check_ulysses(_cfg(2, heads=12))
    check_ulysses(_cfg(1))  # off: nothing to check
    with pytest.raises(ConfigError, match=r"ulysses_size' = 5 must divide the attention heads of model "
                                          r"'wan' \(12 heads.*valid ulysses_size: 1, 2, 3, 4, 6, 12"):
        check_ulysses(_cfg(5, heads=12))
    with pytest.raises(ConfigError, match="model 'llama_debug' does not support parallel.ulysses_size"):
        check_ulysses(_cfg(2))
    with pytest.raises(ConfigError, match="torch engine.*context_parallel_size"):
        check_ulysses(_cfg(2, heads=12, engine="megatron"))
    assert check_ulysses_world(SimpleNamespace(ulysses_size=2), 4) == 2
    with pytest.raises(ConfigError, match=r"world size 3 is not divisible by parallel.ulysses_size=2"):
        check_ulysses_world(SimpleNamespace(ulysses_size=2), 3)


WORKER = r"""
import json, os, sys
import torch
import torch.distributed as dist
from loong_core.engines.torch_native import ulysses

rank, port = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
ulysses.set_group(dist.group.WORLD)


def attend(q, k, v, key_mask):  # [b, s, h, d], key_mask [b, s_k] True = attend
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)


torch.manual_seed(0)
b, text, s, heads, d = 2, 3, 8, 4, 5
q, k, v, grad_out = (torch.randn(b, text + s, heads, d, dtype=torch.float64) for _ in range(4))
key_mask = torch.ones(b, text + s, dtype=torch.bool)
key_mask[0, 2] = False  # a padded text token
errors = {}
for name, t in (("self", 0), ("joint", text)):
    n_tok = t + s
    full = [x[:, :n_tok].clone().requires_grad_() for x in (q, k, v)]
    ref = attend(*full, key_mask[:, :n_tok])
    ref.backward(grad_out[:, :n_tok])
    mine = list(range(t)) + [t + i for i in range(rank * s // 2, (rank + 1) * s // 2)]
    local = [x[:, mine].clone().requires_grad_() for x in (q, k, v)]
    local_mask = ulysses.gather_key_mask(key_mask[:, mine], t)
    out = ulysses.attention(*local, lambda a, b_, c: attend(a, b_, c, local_mask), t)
    # Replicated (text) outputs: each rank back-propagates its 1/N share of their gradient.
    share = grad_out[:, mine].clone()
    share[:, :t] /= 2
    out.backward(share)
    err = (out - ref[:, mine]).abs().max().item()
    for a, f in zip(local, full):
        g = a.grad.clone()
        text_grad = g[:, :t].contiguous()
        dist.all_reduce(text_grad)  # replicated inputs: the group's sum is the one-rank gradient
        err = max(err, (text_grad - f.grad[:, :t]).abs().max().item() if t else 0.0,
                  (g[:, t:] - f.grad[:, mine[t:]]).abs().max().item())
    errors[name] = err
x = torch.arange(2 * 4 * 6, dtype=torch.float64).view(2, 4, 6).requires_grad_()
gathered = ulysses.gather(ulysses.shard(x, 1), 1)
gathered.backward(torch.ones_like(gathered))
# Backward: the reduce-scatter sums both ranks' ones on this rank's tokens, zero elsewhere.
expected = 2.0 * (torch.arange(4)[None, :, None] // 2 == rank)
errors["shard_gather"] = max((gathered - x).abs().max().item(), (x.grad - expected).abs().max().item())
dist.destroy_process_group()
print(json.dumps(errors), flush=True)
os._exit(0)  # skip interpreter teardown (gloo threads)
"""


@pytest.mark.multirank
def test_all_to_all_attention_equals_one_rank_forward_and_backward():
    for errors in run_gloo_workers(WORKER):
        assert set(errors) == {"self", "joint", "shard_gather"}
        for name, value in errors.items():
            assert value < 1e-12, (name, value)
