"""Cross-package tests share one prepared-data cache per session."""

from __future__ import annotations

import os

import pytest

from loong_core.testing import keep_cpu_precision_fp32

keep_cpu_precision_fp32()


@pytest.fixture(scope="session", autouse=True)
def loong_cache(tmp_path_factory):
    """Point LOONG_CACHE at a session directory unless the caller chose one."""
    if os.environ.get("LOONG_CACHE"):
        yield os.environ["LOONG_CACHE"]
        return
    from loong_core.testing import session_cache

    path = session_cache(tmp_path_factory)  # the one the packages' tests use in this session
    os.environ["LOONG_CACHE"] = path
    yield path
    os.environ.pop("LOONG_CACHE", None)


@pytest.fixture(scope="session")
def default_experiment_run(tmp_path_factory):
    """``(cwd, run_dir)``: the README's ``loong train`` (the default experiment), 40 steps with
    validation every 20, run in a fresh folder: one run shared by the default-experiment test and
    the README tests (which resume a copy of it)."""
    from loong_core.testing import run_train

    cwd = tmp_path_factory.mktemp("default_experiment")
    run_train(["trainer.train_iters=40", "trainer.eval_interval=20", "trainer.eval_iters=2",
               "trainer.log_interval=1", "optim.lr_warmup_iters=5"], cwd=cwd)
    (run_dir,) = (cwd / "runs" / "llama_shakespeare").iterdir()
    return cwd, run_dir
