"""Shared fixtures: a cache per session, and only core + this plugin loaded in ``loong`` subprocesses."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def loong_env(tmp_path_factory):
    """Results must not depend on what else is installed; prepared data is cached per session."""
    saved = {k: os.environ.get(k) for k in ("LOONG_CACHE", "LOONG_PLUGINS")}
    os.environ["LOONG_CACHE"] = os.environ.get("LOONG_TEST_CACHE") or str(tmp_path_factory.mktemp("cache"))
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
