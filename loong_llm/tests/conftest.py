"""Shared fixtures: one data cache per test session, and a tiny Llama experiment."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def loong_cache(tmp_path_factory):
    """Prepared corpora are cached once per session (subprocesses inherit the variable)."""
    path = os.environ.get("LOONG_TEST_CACHE") or str(tmp_path_factory.mktemp("loong_cache"))
    old = os.environ.get("LOONG_CACHE")
    os.environ["LOONG_CACHE"] = path
    yield path
    if old is None:
        os.environ.pop("LOONG_CACHE", None)
    else:
        os.environ["LOONG_CACHE"] = old


# Small enough that a 4-rank run takes seconds; 4 layers so PP2 x VPP2 has a layer per chunk.
TINY_OVERRIDES = [
    "experiment=llama_debug",
    "model.num_layers=4",
    "trainer.log_interval=1",
    "trainer.eval_interval=0",
    "trainer.progress_bar=false",
    "trainer.tensorboard=false",
]


@pytest.fixture(scope="session")
def tiny():
    """Overrides of a seconds-long Llama run that logs every step."""
    return list(TINY_OVERRIDES)


@pytest.fixture(scope="session")
def reference_run(tiny, tmp_path_factory):
    """One uninterrupted 8-step tiny run with a checkpoint every 2 steps, shared by the
    checkpoint-safety and crash-safety tests (copied by each test that damages it)."""
    from loong_core.testing import run_train

    run_dir = tmp_path_factory.mktemp("reference") / "run"
    run_train([*tiny, "trainer.train_iters=8", "trainer.save_interval=2", f"trainer.run_dir={run_dir}"])
    return run_dir
