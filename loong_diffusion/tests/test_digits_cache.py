"""The digits are kept in the data cache, so a machine without scikit-learn trains from it."""

from __future__ import annotations

import builtins

import numpy as np

from loong_diffusion.data.config import DigitsDataConfig
from loong_diffusion.data.digits import DigitsDataModule, cache_file, load_digits_array


def test_prepare_caches_the_digits_exactly_and_setup_needs_no_sklearn_then(tmp_path, monkeypatch):
    config = DigitsDataConfig(name="digits", cache_dir=str(tmp_path))
    DigitsDataModule(config).prepare()
    assert cache_file(str(tmp_path)).is_file()
    images, labels = load_digits_array()

    real_import = builtins.__import__

    def no_sklearn(name, *args, **kwargs):
        if name.startswith("sklearn"):
            raise ImportError("no sklearn here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sklearn)
    module = DigitsDataModule(config)
    module.setup()
    assert module.images.dtype == np.float32 and np.array_equal(module.images, images)
    assert np.array_equal(module.labels, labels)
