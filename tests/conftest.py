"""Cross-package tests share one prepared-data cache per session."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def loong_cache(tmp_path_factory):
    """Point LOONG_CACHE at a session directory unless the caller chose one."""
    if os.environ.get("LOONG_CACHE"):
        yield os.environ["LOONG_CACHE"]
        return
    path = str(tmp_path_factory.mktemp("loong_cache"))
    os.environ["LOONG_CACHE"] = path
    yield path
    os.environ.pop("LOONG_CACHE", None)
