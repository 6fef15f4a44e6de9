"""Text data pipeline: Shakespeare corpus -> byte-level BPE -> indexed datasets -> GPT samples.

The real corpus is prepared once per session with a 512-token vocabulary (a few seconds); tests
that damage prepared files work on a copy.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from loong_core.data.module import DataModule
from loong_core.errors import ConfigError, LoongError
from loong_llm.data import corpus as corpus_module
from loong_llm.data.config import TextDataConfig
from loong_llm.data.corpus import CORPORA, clean_play_markdown, load_shakespeare, split_documents
from loong_llm.data.indexed import (
    indexed_dataset_exists,
    tokenize_documents,
    write_indexed_dataset,
)
from loong_llm.data.text_data import TextDataModule
from loong_llm.data.tokenizer import EOD_TOKEN, PAD_TOKEN, TextTokenizer, train_bpe

VOCAB = 512
SEQ = 64
SAMPLE_KEYS = {"tokens", "labels", "loss_mask", "position_ids"}


def make_config(cache: Path, **overrides) -> TextDataConfig:
    return TextDataConfig(**{"cache_dir": str(cache), "vocab_size": VOCAB, "seq_length": SEQ, **overrides})


def file_mtimes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if p.is_file()}


@pytest.fixture(scope="session")
def plays() -> dict[str, str]:
    return dict(load_shakespeare())


@pytest.fixture(scope="session")
def prepared_cache(tmp_path_factory) -> Path:
    """A cache root holding the prepared Shakespeare corpus (vocab 512)."""
    cache = tmp_path_factory.mktemp("cache")
    TextDataModule(make_config(cache)).prepare()
    return cache


@pytest.fixture
def module(prepared_cache) -> TextDataModule:
    m = TextDataModule(make_config(prepared_cache))
    m.setup()
    return m


@pytest.fixture
def cache_copy(prepared_cache, tmp_path) -> Path:
    """A private copy of the prepared cache (without GPTDataset index caches)."""
    shutil.copytree(prepared_cache / "text", tmp_path / "text", ignore=shutil.ignore_patterns("index_cache"))
    return tmp_path


# ----------------------------------------------------------------------------- corpus


def test_shakespeare_has_38_plays_sorted_by_name(plays):
    names = list(plays)
    assert len(names) == 38
    assert names == sorted(names)
    assert "tragedies/hamlet" in names
    assert 4_500_000 < sum(map(len, plays.values())) < 5_500_000


def test_shakespeare_text_keeps_speakers_and_drops_markdown(plays):
    hamlet = plays["tragedies/hamlet"]
    assert hamlet.startswith("Hamlet\n\nACT I\n\nSCENE I. Elsinore.")
    assert "BERNARDO:\nWho's there?\n" in hamlet
    assert "To be, or not to be" in hamlet
    for text in plays.values():
        for markup in ("**", "##", "\\[", "  \n", "\n\n\n"):
            assert markup not in text


def test_clean_play_markdown_turns_markup_into_plain_lines():
    md = "# Play\n\n## ACT I\n\n**KING**  \nHello,  \nworld.\n\n_\\[Aside]_  \n_Exit_\n"
    assert clean_play_markdown(md) == "Play\n\nACT I\n\nKING:\nHello,\nworld.\n\n[Aside]\nExit\n"


def test_validation_plays_are_5_percent_and_disjoint_from_train(plays):
    train, valid = split_documents(list(plays), 0.05)
    assert len(valid) == 2 and len(train) == 36
    assert not set(train) & set(valid)
    assert set(train) | set(valid) == set(plays)
    assert split_documents(list(reversed(list(plays))), 0.05) == (train, valid)


def test_adding_a_document_does_not_reshuffle_the_split(plays):
    _, valid = split_documents(list(plays), 0.25)
    _, valid_more = split_documents([*plays, "zz/new-play"], 0.25)
    assert len(set(valid) - set(valid_more)) <= 1


# ----------------------------------------------------------------------------- tokenizer


@pytest.fixture(scope="session")
def tokenizer(plays) -> TextTokenizer:
    return train_bpe([plays["tragedies/hamlet"], plays["comedies/twelfth-night"]], VOCAB)


@pytest.mark.parametrize(
    "text",
    [
        "To be, or not to be, that is the question:",
        "HAMLET:\nO, that this too too solid flesh would melt\n\n",
        "  leading spaces, tabs\tand — dashes, café, 日本語  ",
    ],
)
def test_tokenizer_round_trips_text(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_eod_and_pad_are_distinct_special_ids(tokenizer):
    assert tokenizer.vocab_size == VOCAB
    assert tokenizer.eod != tokenizer.pad
    assert tokenizer.tokenizer.id_to_token(tokenizer.eod) == EOD_TOKEN
    assert tokenizer.tokenizer.id_to_token(tokenizer.pad) == PAD_TOKEN
    assert tokenizer.decode([tokenizer.eod, *tokenizer.encode("hi"), tokenizer.pad]) == "hi"


def test_bpe_training_is_deterministic(plays, tokenizer):
    again = train_bpe([plays["tragedies/hamlet"], plays["comedies/twelfth-night"]], VOCAB)
    assert again.unique_identifiers == tokenizer.unique_identifiers


def test_tokenizer_save_load_and_pickle_keep_ids(tokenizer, tmp_path):
    tokenizer.save(tmp_path / "tokenizer.json")
    text = "Good night, sweet prince"
    for copy in (TextTokenizer.load(tmp_path / "tokenizer.json"), pickle.loads(pickle.dumps(tokenizer))):
        assert copy.encode(text) == tokenizer.encode(text)
        assert (copy.eod, copy.pad, copy.vocab_size) == (tokenizer.eod, tokenizer.pad, tokenizer.vocab_size)


def test_foreign_tokenizer_gets_missing_special_tokens():
    from tokenizers import Tokenizer, models

    foreign = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    wrapped = TextTokenizer(foreign)
    assert wrapped.vocab_size == 4
    assert {wrapped.eod, wrapped.pad} == {2, 3}
    assert not wrapped.splits_at_whitespace


def test_chunked_tokenization_equals_whole_document_encoding(tokenizer, plays):
    texts = [plays["tragedies/macbeth"], plays["roman/julius-caesar"], "", "x"]
    assert tokenize_documents(tokenizer, texts, chunk_chars=500) == [tokenizer.encode(t) for t in texts]


# ----------------------------------------------------------------------------- indexed files


def test_indexed_dataset_holds_each_document_then_eod(tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    docs = [[5, 6, 7], [8], []]
    assert write_indexed_dataset(tmp_path / "d", docs, vocab_size=VOCAB, eod=0) == 7
    read = IndexedDataset(str(tmp_path / "d"))
    assert [read[i].tolist() for i in range(len(read))] == [[5, 6, 7, 0], [8, 0], [0]]
    assert list(read.document_indices) == [0, 1, 2, 3]
    assert str(read[0].dtype) == "uint16"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.bin", "d.idx"]  # no temp files left


def test_bin_without_idx_is_not_trusted(tmp_path):
    write_indexed_dataset(tmp_path / "d", [[1, 2]], vocab_size=VOCAB, eod=0)
    assert indexed_dataset_exists(tmp_path / "d")
    (tmp_path / "d.idx").unlink()
    assert not indexed_dataset_exists(tmp_path / "d")


# ----------------------------------------------------------------------------- prepare


def test_prepare_writes_tokenizer_indexed_datasets_and_meta(module, plays):
    d = module.data_dir
    assert d.parent.name == "text" and d.name.startswith(f"shakespeare-v{VOCAB}-")
    meta = module.metadata()
    assert meta["vocab_size"] == VOCAB
    assert (meta["train_documents"], meta["valid_documents"]) == split_documents(list(plays), 0.05)
    assert meta["train_tokens"] > 10 * meta["valid_tokens"] > 0
    assert indexed_dataset_exists(d / "train") and indexed_dataset_exists(d / "valid")


def test_second_prepare_rewrites_nothing_and_reads_no_corpus(prepared_cache, monkeypatch):
    m = TextDataModule(make_config(prepared_cache))
    before = file_mtimes(m.data_dir)

    def fail():
        raise AssertionError("corpus loaded although data is prepared")

    monkeypatch.setitem(
        CORPORA, "shakespeare", corpus_module.CorpusSource(fail, CORPORA["shakespeare"].version)
    )
    m.prepare()
    assert file_mtimes(m.data_dir) == before


def test_interrupted_write_is_redone_and_the_rest_kept(cache_copy):
    m = TextDataModule(make_config(cache_copy))
    d = m.data_dir
    (d / "valid.idx").unlink()  # as if killed between the two renames
    (d / "meta.json").unlink()
    before = file_mtimes(d)
    assert not m.is_prepared()
    with pytest.raises(LoongError, match="prepare"):
        m.setup()
    m.prepare()
    after = file_mtimes(d)
    assert m.is_prepared()
    assert after["valid.bin"] != before["valid.bin"]
    for kept in ("tokenizer.json", "train.bin", "train.idx"):
        assert after[kept] == before[kept]
    assert not [p for p in d.iterdir() if ".tmp" in p.name]


def test_damaged_cache_is_rebuilt_with_a_warning(cache_copy, caplog):
    """Token ids above the vocabulary, the file size unchanged (truncated or emptied files: the
    manifest unit tests of loong_core)."""
    import logging

    m = TextDataModule(make_config(cache_copy))
    d = m.data_dir
    original = (d / "train.bin").read_bytes()
    (d / "train.bin").write_bytes(b"\xff" * 64 + original[64:])
    with caplog.at_level(logging.WARNING):
        m.prepare()
    assert f"the text data in {d} is damaged" in caplog.text and "rebuilding it" in caplog.text
    assert (d / "train.bin").read_bytes() == original
    m.setup()
    assert m.metadata()["vocab_size"] == VOCAB


def test_settings_that_change_the_data_get_their_own_folder(tmp_path):
    base = TextDataModule(make_config(tmp_path)).data_dir
    assert TextDataModule(make_config(tmp_path, seq_length=128)).data_dir == base
    assert TextDataModule(make_config(tmp_path, valid_fraction=0.1)).data_dir != base
    assert TextDataModule(make_config(tmp_path, vocab_size=1024)).data_dir != base


def test_cache_dir_defaults_to_loong_cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("LOONG_CACHE", str(tmp_path))
    cfg = TextDataConfig(vocab_size=VOCAB)
    assert TextDataModule(cfg).data_dir.parent == tmp_path / "text"


# ----------------------------------------------------------------------------- build


def test_module_fulfils_the_data_module_protocol(module):
    assert isinstance(module, DataModule)
    assert module.model_overrides() == {"vocab_size": VOCAB}


def test_samples_have_documented_keys_shapes_and_dtypes(module):
    import torch

    train, valid = module.build(100, 10, seed=1234)
    assert len(train) >= 100 and len(valid) >= 10
    for sample in (train[0], train[99], valid[9]):
        assert set(sample) == SAMPLE_KEYS
        assert all(v.shape == (SEQ,) for v in sample.values())
        assert sample["tokens"].dtype == sample["labels"].dtype == torch.int64
        assert sample["position_ids"].dtype == torch.int64
        assert sample["loss_mask"].dtype == torch.float32
        assert torch.equal(sample["labels"][:-1], sample["tokens"][1:])
        assert torch.equal(sample["position_ids"], torch.arange(SEQ))
        assert module.sample_cost(sample) == SEQ


def test_same_index_gives_same_sample_in_fresh_modules(prepared_cache, tmp_path):
    import torch

    first = TextDataModule(make_config(prepared_cache)).build(50, 5, seed=7)
    rebuilt_cache = tmp_path / "fresh"  # prepared again from scratch: tokenizer and indices too
    fresh = TextDataModule(make_config(rebuilt_cache))
    fresh.prepare()
    second = fresh.build(50, 5, seed=7)
    for a, b in zip(first, second):
        for i in (0, 3, 49 % len(a)):
            assert all(torch.equal(a[i][k], b[i][k]) for k in SAMPLE_KEYS)


def test_item_does_not_depend_on_how_many_samples_were_asked(module):
    import torch

    small, _ = module.build(10, 1, seed=3)
    large, _ = module.build(3 * small.epoch_length + 1, 1, seed=3)
    assert len(large.epochs) == 4
    assert torch.equal(small[7]["tokens"], large[7]["tokens"])
    second_epoch = {tuple(large[small.epoch_length + i]["tokens"][:8].tolist()) for i in range(20)}
    first_epoch = {tuple(large[i]["tokens"][:8].tolist()) for i in range(20)}
    assert second_epoch != first_epoch  # each epoch is shuffled anew


def test_other_seed_gives_other_order(module):
    import torch

    a, _ = module.build(10, 1, seed=1)
    b, _ = module.build(10, 1, seed=2)
    assert not all(torch.equal(a[i]["tokens"], b[i]["tokens"]) for i in range(10))


def _segments(module, sample) -> list[str]:
    """Decoded text between end-of-document tokens, partial characters at the edges removed."""
    ids = sample["tokens"].tolist()
    pieces, current = [], []
    for i in ids:
        if i == module.tokenizer.eod:
            pieces.append(current)
            current = []
        else:
            current.append(i)
    pieces.append(current)
    return [module.tokenizer.decode(p).strip("\ufffd") for p in pieces if len(p) > 8]


def test_valid_samples_come_only_from_validation_plays(module, plays):
    train_ds, valid_ds = module.build(40, 40, seed=5)
    meta = module.metadata()
    valid_text = [plays[n] for n in meta["valid_documents"]]
    train_text = [plays[n] for n in meta["train_documents"]]
    for i in range(40):
        for segment in _segments(module, valid_ds[i]):
            assert any(segment in t for t in valid_text)
            assert not any(segment in t for t in train_text)
        for segment in _segments(module, train_ds[i]):
            assert not any(segment in t for t in valid_text)


def test_datasets_survive_pickling_for_loader_workers(module):
    import torch

    train, _ = module.build(10, 1, seed=9)
    copy = pickle.loads(pickle.dumps(train))
    assert torch.equal(copy[4]["tokens"], train[4]["tokens"])


def test_half_written_index_cache_is_rebuilt(module):
    import torch

    expected = module.build(20, 1, seed=11)[0][5]["tokens"]
    shuffles = list((module.data_dir / "index_cache").glob("*-train-shuffle_index.npy"))
    assert shuffles
    for path in shuffles:  # as if a crash cut the write short (new inode: live mmaps keep theirs)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(path.read_bytes()[:100])
        os.replace(tmp, path)
    assert torch.equal(TextDataModule(module.config).build(20, 1, seed=11)[0][5]["tokens"], expected)


def test_seq_length_longer_than_valid_split_is_a_config_error(module):
    module.config.seq_length = module.metadata()["valid_tokens"] + 10
    with pytest.raises(ConfigError, match="seq_length"):
        module.build(1, 1, seed=0)


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"corpus": "shakespear"}, "Did you mean 'shakespeare'"),
        ({"vocab_size": 100}, "at least 258"),
        ({"valid_fraction": 0.0}, "between 0 and 1"),
    ],
)
def test_bad_config_values_are_rejected_with_the_fix(overrides, message):
    with pytest.raises(ConfigError, match=message):
        TextDataConfig(**overrides)


def test_config_module_imports_no_heavy_packages():
    code = (
        "import sys, loong_llm.data.config; "
        "print([m for m in ('torch', 'numpy', 'tokenizers', 'megatron') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ----------------------------------------------------------------------------- two ranks

_WORKER = textwrap.dedent(
    """
    import json, sys, torch.distributed as dist
    from loong_llm.data.config import TextDataConfig
    from loong_llm.data.text_data import TextDataModule
    rank, store, cache, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    m = TextDataModule(TextDataConfig(cache_dir=cache, vocab_size=512, seq_length=64))
    m.setup()
    epoch_length = m.build(1, 1, seed=21)[0].epoch_length
    train, valid = m.build(epoch_length + 1, 10, seed=21)  # two epochs
    items = [train[i]["tokens"].tolist() for i in (0, 1, len(train) - 1)] + [valid[3]["tokens"].tolist()]
    json.dump(items, open(f"{out}/rank{rank}.json", "w"))
    dist.destroy_process_group()
    """
)


@pytest.mark.multirank
def test_two_ranks_build_identical_datasets(cache_copy, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    store = tmp_path / "store"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(r), str(store), str(cache_copy), str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(logs)
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert rank0 == rank1
