"""Prepared caches carry a manifest (sizes and CRC-32) checked on use."""

from __future__ import annotations

import logging

import pytest

from loong_core.data.manifest import DamagedCacheError, check_cache, damage, write_manifest


@pytest.fixture
def cache(tmp_path):
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / "train.bin").write_bytes(bytes(range(256)) * 64)
    (folder / "tokenizer.json").write_text('{"model": {}}')
    write_manifest(folder)
    return folder


def test_an_intact_cache_passes(cache):
    assert damage(cache) is None and check_cache(cache, "text data")


@pytest.mark.parametrize("harm, expected", [
    (lambda d: (d / "train.bin").write_bytes(bytes(100)), "train.bin has 100 bytes, 16384 when it was written"),
    (lambda d: (d / "tokenizer.json").write_text('{"model": []}'), "tokenizer.json changed since it was written"),
    (lambda d: (d / "tokenizer.json").unlink(), "tokenizer.json is missing"),
    (lambda d: (d / "manifest.json").unlink(), "it has no manifest.json"),
])
def test_damage_is_named(cache, harm, expected):
    harm(cache)
    assert expected in damage(cache)


def test_a_damaged_cache_is_removed_for_rebuilding_with_a_warning(cache, caplog):
    (cache / "train.bin").write_bytes(b"")
    with caplog.at_level(logging.WARNING):
        assert check_cache(cache, "text data") is False
    assert not cache.exists()
    assert f"the text data in {cache} is damaged: train.bin has 0 bytes" in caplog.text


def test_a_cache_that_cannot_be_rebuilt_is_one_error_naming_the_folder(cache):
    (cache / "train.bin").write_bytes(b"x")
    with pytest.raises(DamagedCacheError, match=rf"Delete {cache} and recreate it \(loong data encode"):
        check_cache(cache, "latent cache", rebuild_hint="loong data encode-latents ...")
    assert cache.exists()
