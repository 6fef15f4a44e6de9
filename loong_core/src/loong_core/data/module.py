"""The contract every registered dataset (data module) fulfils."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class DataModule(Protocol):
    """A registered dataset, constructed as ``DataModule(config)`` with its validated config.

    The trainer calls, in order: ``prepare()`` on global rank 0 only (download-free work such as
    tokenizing a corpus into a cache; it must be idempotent and write atomically), a barrier,
    then ``setup()`` on every rank, then ``build(...)`` on every rank.
    """

    def prepare(self) -> None:
        """Create cached artefacts (rank 0 only; other ranks wait at a barrier)."""

    def setup(self) -> None:
        """Load what ``prepare`` made (every rank)."""

    def model_overrides(self) -> dict[str, Any]:
        """Model config values the data decides (for example ``{"vocab_size": 8192}``)."""

    def build(self, num_train_samples: int, num_valid_samples: int, seed: int) -> tuple[Any, Any]:
        """Return ``(train, valid)`` map-style datasets with at least that many samples.

        Each item is a dict of tensors; for language modelling: ``tokens`` and ``labels``
        (int64, ``[seq_length]``), ``loss_mask`` (float32) and ``position_ids`` (int64).
        Item ``i`` must be a pure function of ``(config, seed, i)`` so that a resumed run sees
        the same samples. A dataset may also define ``sample_size(i)`` returning what
        :meth:`sample_cost` would return for item ``i`` from metadata alone; data balancers then
        do not load samples other ranks train on.
        """

    def sample_cost(self, sample: dict) -> float:
        """Token count of a sample, used by data balancers (``len(tokens)`` for text)."""

    # Optional: ``inference_files() -> {relative name: path}``: files (or folders) a trained model
    # needs outside training, such as its tokenizer (``{"tokenizer": Path(...)}``). Rank 0 copies
    # them into ``RUN_DIR/data/<name>`` at the start, so the run directory alone is enough for
    # ``loong generate`` / ``eval`` / ``convert`` (see :func:`loong_core.runtime.copy_inference_files`).

    # Optional: ``collate(samples) -> batch``. A data module that defines it turns a micro batch
    # of samples into the model's batch itself (for example concatenating variable-size image
    # patches); without it :func:`loong_core.data.loader.collate` stacks every tensor.
