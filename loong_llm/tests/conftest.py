"""Shared fixtures: one data cache per test session, and a tiny Llama experiment."""

from __future__ import annotations

import os

import pytest

from loong_core.testing import keep_cpu_precision_fp32

keep_cpu_precision_fp32()


@pytest.fixture(scope="session", autouse=True)
def loong_cache(tmp_path_factory):
    """Prepared corpora are cached once per session (subprocesses inherit the variable)."""
    from loong_core.testing import session_cache

    path = session_cache(tmp_path_factory)  # shared with the other packages' tests
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
def tiny_init(tiny, tmp_path_factory):
    """A checkpoint of the tiny model after one step, the common starting weights of the tests
    that compare layouts initialising weights differently (TP, EP, PP) or precisions."""
    from loong_core.testing import run_train

    run_dir = tmp_path_factory.mktemp("tiny_init") / "init"
    run_train([*tiny, f"trainer.run_dir={run_dir}", "trainer.train_iters=1"])
    return run_dir


#: Steps of the one-rank curve ``tiny_curve`` (and of the layouts compared with it).
CURVE_STEPS = 5


@pytest.fixture(scope="session")
def tiny_curve(tiny, tiny_init, tmp_path_factory):
    """``(overrides, losses)``: the one-rank curve of 5 steps from ``tiny_init``, shared by the
    parallel-equivalence and context-parallel tests (a layout adds its overrides and run_dir)."""
    from loong_core.testing import losses, run_train

    common = [*tiny, f"trainer.train_iters={CURVE_STEPS}",
              f"trainer.init_from={tiny_init / 'checkpoints' / 'iter_0000001'}", "optim.lr_decay_iters=20"]
    ref_dir = tmp_path_factory.mktemp("tiny_curve") / "ref"
    run_train([*common, f"trainer.run_dir={ref_dir}"])
    return common, losses(ref_dir)


@pytest.fixture(scope="session")
def reference_run(tiny, tmp_path_factory):
    """One uninterrupted 8-step tiny run with a checkpoint every 2 steps, shared by the
    checkpoint-safety and crash-safety tests (copied by each test that damages it)."""
    from loong_core.testing import run_train

    run_dir = tmp_path_factory.mktemp("reference") / "run"
    run_train([*tiny, "trainer.train_iters=8", "trainer.save_interval=2", f"trainer.run_dir={run_dir}"])
    return run_dir


@pytest.fixture(scope="session")
def family_curve(tmp_path_factory):
    """``(family, *extra overrides) -> (overrides, losses)``: the one-rank 5-step curve of
    ``experiment=<family>_debug`` from a saved one-step checkpoint (layouts that initialise
    weights differently start from it), built once per family, overrides and session."""
    from loong_core.testing import losses, run_train

    logging = list(TINY_OVERRIDES[-4:])
    done: dict[tuple, tuple[list[str], dict]] = {}

    def get(family: str, *extra: str):
        key = (family, *extra)
        if key not in done:
            root = tmp_path_factory.mktemp(f"{family}_curve")
            base = [f"experiment={family}_debug", *logging, *extra]
            run_train([*base, f"trainer.run_dir={root / 'init'}", "trainer.train_iters=1"])
            common = [*base, f"trainer.train_iters={CURVE_STEPS}", "optim.lr_decay_iters=20",
                      f"trainer.init_from={root / 'init' / 'checkpoints' / 'iter_0000001'}"]
            run_train([*common, f"trainer.run_dir={root / 'ref'}"])
            done[key] = (common, losses(root / "ref"))
        return done[key]

    return get
