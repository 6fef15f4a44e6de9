"""Torch-engine checkpoints of models with parameters that never got a gradient (frozen or unused
parts): they have no optimizer state in the checkpoint, and resuming must still be exact."""

from __future__ import annotations

import subprocess
import sys

from loong_core.testing import free_port

SCRIPT = """
import os, sys, tempfile, types
import torch
import torch.distributed as dist

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
from loong_core.engines.torch_native import checkpointing


class TwoBranches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used = torch.nn.Linear(4, 4)
        self.unused = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.used(x)


def engine():
    torch.manual_seed(0)
    model = TwoBranches()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    return types.SimpleNamespace(model=model, optimizer=optimizer, scheduler=scheduler)


def step(e, x):
    e.model(x).square().sum().backward()
    e.optimizer.step()
    e.optimizer.zero_grad()


torch.manual_seed(1)
xs = [torch.randn(2, 4) for _ in range(2)]
original = engine()
step(original, xs[0])
directory = tempfile.mkdtemp()
checkpointing.save(original, directory)
checkpointing.save_common(directory, original.scheduler, {"iteration": 1})
resumed = engine()
assert checkpointing.load(resumed, directory) == {"iteration": 1}
for e in (original, resumed):
    step(e, xs[1])
a, b = original.model.state_dict(), resumed.model.state_dict()
assert all(torch.equal(a[k], b[k]) for k in a), "weights differ after the resumed step"
assert sorted(resumed.optimizer.state_dict()["state"]) == [0, 1]
print("exact")
"""


def test_resume_is_exact_when_some_parameters_never_had_a_gradient():
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(free_port())], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("exact")
