"""Digits conversations: expanded image placeholders, loss on the reply, a fixed held-out split."""

from __future__ import annotations

import pytest
import torch

from loong_core.errors import ConfigError
from loong_vlm.data.config import DigitsVQAConfig
from loong_vlm.data.digits import DigitsVQADataModule


@pytest.fixture(scope="module")
def digits():
    module = DigitsVQADataModule(DigitsVQAConfig(name="digits_vqa", seq_length=32, image_tokens=16))
    module.setup()
    return module


def test_sample_has_one_image_expanded_into_its_tokens(digits):
    sample = digits.sample(7)
    image_id = digits.model_overrides()["image_token_id"]
    assert int((sample["tokens"] == image_id).sum()) == 16
    assert sample["images"].shape == (1, 1, 16, 16)
    assert float(sample["images"].min()) >= -1.0 and float(sample["images"].max()) <= 1.0


def test_loss_and_accuracy_are_on_the_digit_by_default(digits):
    sample = digits.sample(7)
    answer = sample["labels"][sample["answer_mask"] > 0].tolist()
    assert digits.tokenizer.decode(answer) == str(digits.labels[7])
    assert torch.equal(sample["loss_mask"], sample["answer_mask"])


def test_loss_can_cover_the_whole_assistant_reply():
    module = DigitsVQADataModule(DigitsVQAConfig(name="digits_vqa", seq_length=32, train_end_of_turn=True))
    module.setup()
    sample = module.sample(7)
    reply = sample["labels"][sample["loss_mask"] > 0].tolist()
    assert module.tokenizer.tokenizer.decode(reply, skip_special_tokens=False) == f"{module.labels[7]}<|im_end|>\n"


def test_held_out_digits_never_appear_in_training(digits):
    train, valid = digits.build(5000, 10, seed=3)
    train_digits = {train.digit(i) for i in range(len(train))}
    valid_digits = {valid.digit(i) for i in range(len(valid))}
    assert len(valid_digits) == 384 and not train_digits & valid_digits
    assert len(train_digits) == 1797 - 384


def test_too_short_sequence_is_a_clear_error():
    module = DigitsVQADataModule(DigitsVQAConfig(name="digits_vqa", seq_length=20))
    module.setup()
    with pytest.raises(ConfigError, match="needs 32 positions but data.seq_length is 20"):
        module.sample(0)


def test_balancer_cost_counts_real_tokens(digits):
    sample = digits.sample(0)
    assert digits.sample_cost(sample) == 32.0
    padded = DigitsVQADataModule(DigitsVQAConfig(name="digits_vqa", seq_length=40))
    padded.setup()
    assert padded.sample_cost(padded.sample(0)) == 32.0
