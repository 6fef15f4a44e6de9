"""`loong data preprocess`, Hugging Face tokenizer directories and the `indexed` dataset."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from loong_core.errors import ConfigError
from loong_llm.data.config import IndexedDataConfig
from loong_llm.data.hf_tokenizer import load_tokenizer, save_tokenizer_dir
from loong_llm.data.preprocess import meta_path, preprocess, tokenizer_dir
from loong_llm.data.sources import iter_documents

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

DOCS = [f"Document {i}: " + " ".join(f"word{(i * 7 + j) % 50}" for j in range(20 + i % 13)) for i in range(300)]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    """A tokenizer directory as transformers' save_pretrained writes it (chat template included)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(DOCS, trainer=trainer)
    folder = tmp_path_factory.mktemp("hf_tok")
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    hf.chat_template = CHATML
    hf.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("in") / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(DOCS)))
    return path


def read_docs(prefix) -> list[list[int]]:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(str(prefix))
    return [ds[i].tolist() for i in range(len(ds))]


def test_tokenizer_directory_matches_transformers(hf_dir):
    from transformers import AutoTokenizer

    from loong_llm.data.chat import render_chat

    ours, ref = load_tokenizer(hf_dir), AutoTokenizer.from_pretrained(str(hf_dir))
    assert ours.eod == ref.convert_tokens_to_ids("<|im_end|>")
    assert ours.pad == ref.pad_token_id
    assert ours.vocab_size == len(ref)
    messages = [{"role": "user", "content": "word1 word2"}, {"role": "assistant", "content": "word3"}]
    for gen in (False, True):
        text = render_chat(ours, messages, add_generation_prompt=gen)
        assert text == ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    assert ours.encode("Document 3: word9") == ref.encode("Document 3: word9", add_special_tokens=False)


def test_tokenizer_json_file_and_missing_path(hf_dir, tmp_path):
    tok = load_tokenizer(hf_dir / "tokenizer.json")  # the folder's tokenizer_config.json is read
    assert tok.chat_template is not None and tok.eod == tok.tokenizer.token_to_id("<|im_end|>")
    saved = load_tokenizer(save_tokenizer_dir(tok, tmp_path / "copy"))
    assert (saved.eod, saved.pad, saved.chat_template) == (tok.eod, tok.pad, tok.chat_template)
    with pytest.raises(ConfigError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")


def test_preprocess_jsonl_with_hf_tokenizer(hf_dir, jsonl, tmp_path):
    prefix = tmp_path / "out" / "docs"
    meta = preprocess([jsonl], prefix, tokenizer=hf_dir)
    tok = load_tokenizer(hf_dir)
    docs = read_docs(prefix)
    assert meta["documents"] == len(docs) == 300
    assert docs[5] == tok.encode(DOCS[5]) + [tok.eod]
    assert meta["tokens"] == sum(map(len, docs))
    assert meta_path(prefix).is_file() and (tokenizer_dir(prefix) / "tokenizer.json").is_file()
    assert not [p for p in prefix.parent.iterdir() if p.name.startswith(".")]  # no temp files left


def test_workers_give_identical_files(hf_dir, jsonl, tmp_path):
    preprocess([jsonl], tmp_path / "one", tokenizer=hf_dir, workers=1)
    preprocess([jsonl], tmp_path / "two", tokenizer=hf_dir, workers=2)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"one{ext}").read_bytes() == (tmp_path / f"two{ext}").read_bytes()


def test_parquet_and_text_inputs(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": DOCS[:40], "n": list(range(40))}), tmp_path / "d.parquet")
    (tmp_path / "d.txt").write_text("\n\n".join(DOCS[40:50]) + "\n")
    meta = preprocess([tmp_path / "d.parquet"], tmp_path / "pq", key="body", vocab_size=300)
    assert meta["documents"] == 40 and meta["vocab_size"] == 300
    assert len(list(iter_documents(tmp_path / "d.txt", text_docs="paragraph"))) == 10
    meta = preprocess([tmp_path / "d.txt"], tmp_path / "txt", text_docs="paragraph",
                      tokenizer=tokenizer_dir(tmp_path / "pq"))
    assert meta["documents"] == 10
    with pytest.raises(ConfigError, match="no column 'text'"):
        preprocess([tmp_path / "d.parquet"], tmp_path / "bad", tokenizer=tokenizer_dir(tmp_path / "pq"))


def test_bad_jsonl_key_names_the_line_and_fix(jsonl, tmp_path):
    with pytest.raises(ConfigError, match=r"docs.jsonl:1: no string under key 'body'.*--json-key"):
        preprocess([jsonl], tmp_path / "x", key="body", vocab_size=300)


def test_cli_parser_defaults():
    from loong_core.cli.main import build_parser
    from loong_llm.cli.data_cmd import run_preprocess

    parser = build_parser()  # `preprocess` is an action of core's shared `loong data` command
    args = parser.parse_args(["data", "preprocess", "a.jsonl", "b.parquet", "-o", "out/x", "--workers", "4"])
    assert (args.inputs, args.output_prefix, args.workers, args.json_key) == (
        ["a.jsonl", "b.parquet"], "out/x", 4, "text")
    assert args.func is run_preprocess


def test_cli_module_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, loong_llm.cli.data_cmd; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_indexed_datamodule_trains_on_a_prefix(hf_dir, jsonl, tmp_path):
    from loong_llm.data.indexed_data import IndexedDataModule, held_out_documents

    prefix = tmp_path / "docs"
    preprocess([jsonl], prefix, tokenizer=hf_dir)
    module = IndexedDataModule(IndexedDataConfig(name="indexed", prefix=str(prefix), seq_length=32,
                                                 valid_fraction=0.1, cache_dir=str(tmp_path / "cache")))
    module.prepare()
    assert module.model_overrides() == {"vocab_size": load_tokenizer(hf_dir).vocab_size}
    train, valid = module.build(50, 5, seed=1)
    sample = train[0]
    assert set(sample) == {"tokens", "labels", "loss_mask", "position_ids"}
    assert sample["tokens"].shape == (32,) and len(train) >= 50 and len(valid) >= 5
    held = held_out_documents(300, 0.1)
    assert 20 <= held.sum() <= 40 and np.array_equal(held, held_out_documents(300, 0.1))


def test_indexed_config_errors_name_the_fix(tmp_path):
    from loong_llm.data.indexed_data import IndexedDataModule

    with pytest.raises(ConfigError, match="data.prefix is not set"):
        IndexedDataConfig(name="indexed")
    module = IndexedDataModule(IndexedDataConfig(name="indexed", prefix=str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match="loong data preprocess"):
        module.prepare()
