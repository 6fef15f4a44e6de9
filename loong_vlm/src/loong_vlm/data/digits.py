"""The ``digits_vqa`` dataset: scikit-learn's bundled handwritten digits as visual questions."""

from __future__ import annotations

import logging

import numpy as np
import torch

from loong_core.errors import ConfigError, MissingDependencyError
from loong_llm.data.packing import packed_sample
from loong_vlm.data.config import DigitsVQAConfig
from loong_vlm.data.conversation import IMAGE_TOKEN, encode_conversation, train_vlm_tokenizer

logger = logging.getLogger(__name__)

#: Seed of the held-out split: the same digits are held out whatever the run's seed.
SPLIT_SEED = 0


def load_digit_images(image_size: int) -> tuple[torch.Tensor, np.ndarray]:
    """All 1,797 digits as ``[N, 1, S, S]`` float images in [-1, 1] and their labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise MissingDependencyError("sklearn", "scikit-learn", "The 'digits_vqa' dataset") from exc
    digits = load_digits()
    images = torch.from_numpy(digits.images.astype(np.float32) / 16.0).unsqueeze(1)
    if image_size != images.shape[-1]:
        images = torch.nn.functional.interpolate(images, size=(image_size, image_size), mode="bilinear",
                                                 align_corners=False)
    return (images * 2.0 - 1.0).contiguous(), digits.target.astype(np.int64)


class DigitsSplit:
    """Map-style samples of one split: item ``i`` is digit ``order(i)``, reshuffled every epoch.

    Args:
        module: The data module (tokenizer, images, config).
        indices: Digit indices of this split.
        length: Number of items (whole epochs are reshuffled from ``seed``).
        seed: Shuffle seed; None keeps the order (validation).
    """

    def __init__(self, module: DigitsVQADataModule, indices: np.ndarray, length: int, seed: int | None):
        self.module, self.indices, self.length, self.seed = module, indices, length, seed

    def __len__(self) -> int:
        return self.length

    def digit(self, i: int) -> int:
        """Index into the digits of item ``i``."""
        epoch, j = divmod(int(i), len(self.indices))
        if self.seed is None:
            return int(self.indices[j])
        order = np.random.default_rng([self.seed % 2**63, epoch]).permutation(len(self.indices))
        return int(self.indices[order[j]])

    def __getitem__(self, i: int) -> dict:
        return self.module.sample(self.digit(i))


class DigitsVQADataModule:
    """``Which digit is this?`` -> the digit, loss on the assistant reply (implements
    ``loong_core``'s ``DataModule``).

    Args:
        config: The validated dataset config.
    """

    config_class = DigitsVQAConfig

    def __init__(self, config: DigitsVQAConfig):
        self.config = config
        self.tokenizer = None
        self.images: torch.Tensor | None = None
        self.labels: np.ndarray | None = None

    def prepare(self) -> None:
        """Nothing to cache: the digits ship with scikit-learn and the tokenizer trains in ms."""

    def setup(self) -> None:
        cfg = self.config
        texts = [cfg.question, "user\n", "assistant\n", *map(str, range(10))] * 4
        self.tokenizer = train_vlm_tokenizer(texts, cfg.vocab_size)
        self.image_token_id = self.tokenizer.tokenizer.token_to_id(IMAGE_TOKEN)
        self.digit_ids = {self.tokenizer.tokenizer.token_to_id(str(d)) for d in range(10)}
        self.images, self.labels = load_digit_images(cfg.image_size)
        order = np.random.default_rng(SPLIT_SEED).permutation(len(self.labels))
        self.valid_indices, self.train_indices = order[: cfg.valid_size], order[cfg.valid_size:]

    def model_overrides(self) -> dict:
        return {"vocab_size": self.tokenizer.vocab_size, "image_token_id": self.image_token_id,
                "image_tokens": self.config.image_tokens, "image_size": self.config.image_size,
                "num_channels": 1}

    def build(self, num_train_samples: int, num_valid_samples: int, seed: int):
        train = DigitsSplit(self, self.train_indices, max(num_train_samples, len(self.train_indices)), seed)
        valid = DigitsSplit(self, self.valid_indices, len(self.valid_indices), None)
        if num_valid_samples > len(self.valid_indices):
            logger.warning("validation asks for %d samples but %d digits are held out; some repeat",
                           num_valid_samples, len(self.valid_indices))
        return train, valid

    def sample(self, digit: int) -> dict:
        """The conversation about digit ``digit`` as model inputs."""
        cfg = self.config
        messages = [{"role": "user", "content": f"{IMAGE_TOKEN}\n{cfg.question}"},
                    {"role": "assistant", "content": str(int(self.labels[digit]))}]
        ids, mask = encode_conversation(self.tokenizer, messages, cfg.image_tokens)
        if len(ids) - 1 > cfg.seq_length:
            raise ConfigError(f"a digits conversation needs {len(ids) - 1} positions but data.seq_length "
                              f"is {cfg.seq_length}; set data.seq_length={len(ids) - 1} or more.")
        item = packed_sample([(ids, mask.astype(np.float32))], cfg.seq_length, self.tokenizer.pad,
                             with_mask=False)
        is_digit = torch.tensor([int(t) in self.digit_ids for t in item["labels"].tolist()])
        item["answer_mask"] = item["loss_mask"] * is_digit
        if not cfg.train_end_of_turn:
            item["loss_mask"] = item["answer_mask"].clone()
        item["images"] = self.images[digit].unsqueeze(0)  # one image: [1, 1, S, S]
        return item

    def sample_cost(self, sample: dict) -> float:
        """Non-padding positions of the sample."""
        return float((sample["tokens"] != self.tokenizer.pad).sum())
