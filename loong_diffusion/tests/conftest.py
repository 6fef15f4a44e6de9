"""Shared fixtures: a cache per session, and only core + this plugin loaded in ``loong`` subprocesses."""

from __future__ import annotations

import os

import pytest

from loong_core.testing import keep_cpu_precision_fp32

keep_cpu_precision_fp32()


@pytest.fixture(scope="session")
def diffusion_cache(tmp_path_factory):
    """One prepared-data cache for the whole session."""
    from loong_core.testing import session_cache

    return session_cache(tmp_path_factory)  # shared with the other packages' tests


@pytest.fixture(scope="module", autouse=True)
def loong_env(diffusion_cache):
    """Results must not depend on what else is installed: only core + this plugin load in
    ``loong`` subprocesses. Set per module and restored, so other packages' tests are unaffected."""
    saved = {k: os.environ.get(k) for k in ("LOONG_CACHE", "LOONG_PLUGINS")}
    os.environ["LOONG_CACHE"] = diffusion_cache
    os.environ["LOONG_PLUGINS"] = "diffusion"
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


QUIET = ["trainer.progress_bar=false", "trainer.tensorboard=false", "trainer.log_interval=1"]


@pytest.fixture(scope="session")
def quiet():
    """Overrides that log every step without a progress bar or TensorBoard files."""
    return list(QUIET)
