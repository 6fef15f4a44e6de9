"""Chat SFT data: chat templates, assistant-only loss masks, the `chat` dataset and its packing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loong_core.errors import ConfigError, LoongError
from loong_llm.data.chat import (
    CHATML_TEMPLATE,
    load_chatterbot,
    read_chat_jsonl,
    render_chat,
    tokenize_conversation,
)
from loong_llm.data.chat_data import ChatDataModule, train_chat_tokenizer
from loong_llm.data.config import ChatDataConfig
from loong_llm.data.hf_tokenizer import save_tokenizer_dir

CONVERSATIONS = [
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": f"What is {i} plus {i}?"},
     {"role": "assistant", "content": f"It is {2 * i}."},
     {"role": "user", "content": "Thanks!"},
     {"role": "assistant", "content": "You are welcome."}]
    for i in range(60)
]


@pytest.fixture(scope="module")
def tokenizer():
    return train_chat_tokenizer(CONVERSATIONS, vocab_size=300)


@pytest.fixture(scope="module")
def chat_jsonl(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("chat") / "chat.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CONVERSATIONS))
    return path


def test_loss_mask_covers_exactly_the_assistant_replies(tokenizer):
    ids, mask = tokenize_conversation(tokenizer, CONVERSATIONS[3])
    assert len(ids) == len(mask)
    assert tokenizer.tokenizer.decode(ids, skip_special_tokens=False) == render_chat(tokenizer, CONVERSATIONS[3])
    trained = tokenizer.tokenizer.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False)
    assert trained == "It is 6.<|im_end|>\nYou are welcome.<|im_end|>\n"


def test_template_that_rewrites_history_is_refused(tokenizer):
    import copy

    tok = copy.copy(tokenizer)
    # Renders only the last message: a shorter conversation is not a prefix of the longer one.
    tok.chat_template = "{{ messages[-1]['content'] }}{% if add_generation_prompt %}>{% endif %}"
    with pytest.raises(LoongError, match="prefix-consistently"):
        tokenize_conversation(tok, CONVERSATIONS[0])


def test_bad_jsonl_lines_name_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: the conversation has no assistant message"):
        list(read_chat_jsonl(path))
    path.write_text(json.dumps({"messages": [{"role": "bot", "content": "hi"}]}) + "\n")
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: bad message .*'role' in"):
        list(read_chat_jsonl(path))


def test_chat_module_with_hf_tokenizer_dir_packs_and_masks(tokenizer, chat_jsonl, tmp_path):
    tok_dir = save_tokenizer_dir(tokenizer, tmp_path / "tok")
    cfg = ChatDataConfig(name="chat", path=str(chat_jsonl), tokenizer=str(tok_dir), seq_length=256,
                         valid_fraction=0.1, cache_dir=str(tmp_path / "cache"))
    module = ChatDataModule(cfg)
    module.prepare()
    meta = module.metadata()
    assert meta["train_conversations"] + meta["valid_conversations"] == 60
    assert 0 < meta["train_assistant_tokens"] < meta["train_tokens"]
    train, valid = module.build(20, 2, seed=3)
    s = train[0]
    assert s["segment_ids"].shape == (256,) and "attention_mask" not in s
    assert s["position_ids"][0] == 0 and (s["position_ids"] == 0).sum() >= 2  # >= 2 conversations
    assert train[5]["tokens"].tolist() == ChatDataModule(cfg).build(20, 2, seed=3)[0][5]["tokens"].tolist()
    trained = tokenizer.tokenizer.decode(s["labels"][s["loss_mask"].bool()].tolist(), skip_special_tokens=False)
    assert "You are welcome.<|im_end|>" in trained and "Thanks" not in trained and "Be brief" not in trained


def test_unpacked_samples_hold_one_conversation(tokenizer, chat_jsonl, tmp_path):
    cfg = ChatDataConfig(name="chat", path=str(chat_jsonl), seq_length=64, vocab_size=300,
                         pack=False, cache_dir=str(tmp_path / "cache"))
    module = ChatDataModule(cfg)
    module.prepare()
    train, _ = module.build(10, 1, seed=0)
    s = train[0]
    assert "segment_ids" not in s and (s["position_ids"] == 0).sum() == 1
    assert module.tokenizer.chat_template == CHATML_TEMPLATE


def test_chat_config_errors():
    with pytest.raises(ConfigError, match="Unknown chat corpus 'chaterbot'.*Did you mean 'chatterbot'"):
        ChatDataConfig(name="chat", corpus="chaterbot")
    with pytest.raises(ConfigError, match="Unknown data.pack_algorithm 'best-fit'.*Did you mean 'best_fit'.*next_fit"):
        ChatDataConfig(name="chat", pack_algorithm="best-fit")


def test_chatterbot_corpus_becomes_user_assistant_conversations():
    pytest.importorskip("chatterbot_corpus")
    conversations = load_chatterbot()
    assert len(conversations) > 1500
    assert all(c[0]["role"] == "user" and c[1]["role"] == "assistant" for c in conversations)
