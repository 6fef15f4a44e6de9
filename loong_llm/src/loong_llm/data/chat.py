"""Chat conversations: sources, the tokenizer's chat template, and assistant-only loss masks.

A conversation is a list of ``{"role": ..., "content": ...}`` messages. It is rendered with the
tokenizer's Jinja chat template (sandboxed, as ``transformers`` renders it) and tokenized once;
a token is trained on when it starts inside an assistant turn, where an assistant turn is the
text between ``render(messages[:k], add_generation_prompt=True)`` and ``render(messages[:k+1])``
(the reply and the template's end-of-turn marker).
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from loong_core.errors import ConfigError, LoongError, MissingDependencyError

logger = logging.getLogger(__name__)

Message = dict[str, str]
Conversation = list[Message]
ROLES = ("system", "user", "assistant", "tool")

#: ChatML: the template given to tokenizers trained here (and to tokenizers without one).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")


@functools.lru_cache(maxsize=16)
def _compile(template: str):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ConfigError(f"The chat template refused the conversation: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def render_chat(tokenizer, messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
    """Render ``messages`` with the tokenizer's chat template.

    Args:
        tokenizer: A :class:`~loong_llm.data.tokenizer.TextTokenizer` with ``chat_template``.
        messages: The conversation.
        add_generation_prompt: Append the header that opens an assistant reply.

    Returns:
        The text the model sees.
    """
    if not tokenizer.chat_template:
        raise ConfigError(
            "The tokenizer has no chat template; use a tokenizer directory whose "
            "tokenizer_config.json (or chat_template.jinja) defines one, or data.tokenizer=null "
            "to train a ChatML tokenizer."
        )
    return _compile(tokenizer.chat_template).render(
        messages=list(messages), add_generation_prompt=add_generation_prompt,
        **tokenizer.template_tokens,
    )


def check_conversation(messages: Any, where: str) -> Conversation:
    """Validate one conversation; errors name ``where`` (file and line)."""
    if not isinstance(messages, list) or not messages:
        raise ConfigError(f"{where}: 'messages' must be a non-empty list of {{role, content}}.")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ConfigError(
                f"{where}: bad message {m!r}; each needs 'role' in {list(ROLES)} and a string 'content'."
            )
    if not any(m["role"] == "assistant" for m in messages):
        raise ConfigError(f"{where}: the conversation has no assistant message to train on.")
    return messages


def tokenize_conversation(tokenizer, messages: Sequence[Message]) -> tuple[list[int], list[int]]:
    """Token ids of a rendered conversation and a 0/1 mask of the assistant tokens.

    Args:
        tokenizer: A :class:`~loong_llm.data.tokenizer.TextTokenizer` with a chat template.
        messages: The conversation.

    Returns:
        ``(ids, assistant)``: equal-length lists; ``assistant[i]`` is 1 when token ``i`` belongs
        to an assistant reply (including the template's end-of-turn marker).

    Raises:
        LoongError: The template renders a shorter conversation as something that is not a
            prefix of the whole (assistant spans cannot be located).
    """
    full = render_chat(tokenizer, messages)
    spans = []
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        head = render_chat(tokenizer, messages[:k], add_generation_prompt=True)
        turn = render_chat(tokenizer, messages[: k + 1])
        if not (full.startswith(head) and full.startswith(turn) and len(turn) >= len(head)):
            raise LoongError(
                "The chat template does not render conversations prefix-consistently, so the "
                f"assistant turn {k} cannot be located; use a template without history rewriting."
            )
        spans.append((len(head), len(turn)))
    encoding = tokenizer.tokenizer.encode(full, add_special_tokens=False)
    mask = []
    for start, end in encoding.offsets:
        mask.append(int(any(a <= start < b for a, b in spans) and end > start))
    return list(encoding.ids), mask


def read_chat_jsonl(path: str | os.PathLike, key: str = "messages") -> Iterator[Conversation]:
    """Conversations of a JSON-lines file: one object per line with a ``key`` list of messages."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{where}: not JSON ({exc.msg}).") from exc
            if not isinstance(record, dict) or key not in record:
                raise ConfigError(f"{where}: no {key!r} key; set data.messages_key / --json-key.")
            yield check_conversation(record[key], where)


def _chatterbot_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("chatterbot_corpus")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError("chatterbot_corpus", "chatterbot-corpus", "The 'chatterbot' chat corpus")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "english"


def load_chatterbot() -> list[Conversation]:
    """English conversations of PyPI ``chatterbot-corpus`` (about 2,000), as chat messages.

    Each YAML conversation is a list of utterances; they alternate user / assistant starting
    with the user. The order is files sorted by name, then the file's order.
    """
    import yaml

    out = []
    for path in sorted(_chatterbot_dir().glob("*.yml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for turns in data.get("conversations", []):
            turns = [str(t).strip() for t in turns if str(t).strip()]
            if len(turns) < 2:
                continue
            out.append([{"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(turns)])
    return out


def chatterbot_version() -> str:
    """Version string of the installed chatterbot-corpus (part of cache keys)."""
    import importlib.metadata

    try:
        return "chatterbot-corpus-" + importlib.metadata.version("chatterbot-corpus")
    except importlib.metadata.PackageNotFoundError:
        return "chatterbot-corpus-unknown"


#: Built-in chat corpora: name -> (loader, version).
CHAT_CORPORA = {"chatterbot": (load_chatterbot, chatterbot_version)}
