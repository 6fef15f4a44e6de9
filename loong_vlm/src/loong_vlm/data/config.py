"""Config of the multimodal datasets (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass

from loong_core.config.schema import DataConfig, registered
from loong_core.errors import ConfigError


@dataclass
class DigitsVQAConfig(DataConfig):
    """scikit-learn's 1,797 handwritten 8x8 digits as ``Which digit is this?`` conversations.

    A fixed random subset (seed 0, independent of ``trainer.seed``) is held out for validation;
    training samples cycle through the rest in a new order every epoch.

    Attributes:
        image_size: Side the 8x8 images are resized to (bilinear).
        image_tokens: Placeholder tokens each image expands into; must equal the tokens the
            model's encoder + projector output per image (the model checks it).
        valid_size: Held-out digits (validation split).
        question: The user's question after the image.
        vocab_size: Target size of the byte-level BPE trained on the prompts (special tokens
            included); 285 learns every merge of the default prompt, so each word is one token.
        train_end_of_turn: Also train on the reply's end-of-turn tokens (``<|im_end|>\n``). They
            are predictable without the image, and with encoder and foundation both learning from
            scratch their gradient teaches the model to flatten the image features before it
            learns to read them (measured: held-out accuracy stays at chance), so by default only
            the digit is trained on.
        balancer: Data balancer (on by default for VLM runs).
    """

    seq_length: int = 64
    image_size: int = 16
    image_tokens: int = 16
    valid_size: int = 384
    question: str = "Which digit is this?"
    vocab_size: int = 285
    train_end_of_turn: bool = False
    balancer: str = registered("balancer", default="kk_swap")

    def __post_init__(self):
        if not 0 < self.valid_size < 1797:
            raise ConfigError(f"data.valid_size = {self.valid_size} must be in 1..1796.")
        if self.image_size < 1 or self.image_tokens < 1:
            raise ConfigError("data.image_size and data.image_tokens must be positive.")
