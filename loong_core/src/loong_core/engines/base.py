"""The engine contract the trainer loop talks to; engines never see the modality."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ParallelLayout:
    """Where this rank sits. Filled by the engine once process groups exist.

    Attributes:
        world_size: All ranks.
        rank: Global rank.
        data_parallel_size: DP replicas (micro batches are split over these).
        data_parallel_rank: This rank's DP index.
        is_logging_rank: Global rank 0 (prints, writes metrics).
    """

    world_size: int
    rank: int
    data_parallel_size: int
    data_parallel_rank: int
    is_logging_rank: bool


@dataclass
class StepResult:
    """What one optimizer step reports (identical on every rank).

    Attributes:
        loss: Mean loss over the tokens of the global batch.
        tokens: Loss tokens in the global batch.
        items: Items the model processed in the global batch, as the provider's ``tokens_in``
            counts them (every token of a sequence, not only those with a loss: prompts, image
            placeholders and padding of SFT / VLM batches included), for tokens/s and MFU;
            None when the engine counts none (then ``tokens`` is used).
        grad_norm: Global gradient norm before clipping (NaN when not computed).
        lr: Learning rate used for the step.
        skipped: Whether the optimizer skipped the update.
        nonfinite: The loss or a gradient was NaN/inf, so the update was skipped (the trainer
            stops or counts the step, see ``trainer.exit_on_nan``).
        extra: Further scalars the model reported (summed over micro batches and ranks).
    """

    loss: float
    tokens: float
    grad_norm: float = float("nan")
    lr: float = float("nan")
    skipped: bool = False
    nonfinite: bool = False
    extra: dict | None = None
    items: float | None = None


class Engine:
    """Owns process groups, the wrapped model, optimizer, scheduler and checkpoint I/O.

    Constructed as ``Engine(config, device, model_provider)`` after ``torch.distributed`` is
    initialised. The trainer then calls :meth:`setup`, and per step :meth:`train_step` with the
    micro batches of this data-parallel rank.
    """

    def __init__(self, config: Any, device: Any, model_provider: Any):
        self.config, self.device, self.provider = config, device, model_provider

    @property
    def compute_dtype(self) -> Any:
        """Dtype of the model's matmuls after :meth:`setup` (the device's peak FLOP/s for MFU
        is taken for it); fp32 unless the engine trains in mixed precision."""
        import torch

        return torch.float32

    def banner_lines(self) -> list[str]:
        """Lines this engine adds to the run's banner after :meth:`setup` (choices made on the
        built model, e.g. which layers run in FP8); none by default."""
        return []

    def init_parallel(self) -> ParallelLayout:
        """Create the parallel groups; returns this rank's layout."""
        raise NotImplementedError

    def setup(self) -> None:
        """Build the model, optimizer and scheduler."""
        raise NotImplementedError

    def num_parameters(self) -> int:
        """Parameters of the whole model (all ranks' shards together, counted once)."""
        raise NotImplementedError

    def train_step(self, micro_batches: list[dict]) -> StepResult:
        """Forward, backward and optimizer step over this rank's micro batches."""
        raise NotImplementedError

    def eval_step(self, micro_batches: list[dict]) -> StepResult:
        """Forward only; mean loss over the tokens of all ranks' micro batches."""
        raise NotImplementedError

    def save_checkpoint(self, directory: str, common_state: dict) -> None:
        """Write model, optimizer, scheduler and ``common_state`` into ``directory`` (collective)."""
        raise NotImplementedError

    def save_checkpoint_async(self, directory: str, common_state: dict):
        """Start what :meth:`save_checkpoint` does and return once the state to write is taken
        (``trainer.async_save``): training may change the model from then on (collective).

        Returns:
            An :class:`~loong_core.checkpoint.async_save.AsyncWrite`. This default writes
            synchronously; engines with a background writer override it.
        """
        from loong_core.checkpoint.async_save import WrittenAlready

        return WrittenAlready(self.save_checkpoint(directory, common_state))

    def load_checkpoint(self, directory: str) -> dict:
        """Restore what :meth:`save_checkpoint` wrote; returns its ``common_state``."""
        raise NotImplementedError

    def load_model_weights(self, directory: str) -> None:
        """Initialise the model from a checkpoint's weights only (fine-tuning start)."""
        raise NotImplementedError

    def weights_finite(self) -> bool:
        """Whether every parameter of the model is finite on every rank (collective).

        The trainer asks before each save, so that no checkpoint holds NaN/inf weights. Works on
        ``self.model`` as a module or a list of modules (model chunks), sharded (DTensor) or not.
        """
        import torch

        chunks = self.model if isinstance(self.model, (list, tuple)) else [self.model]
        bad = torch.zeros(1, device=self.device.torch_device)
        for chunk in chunks:
            for param in chunk.parameters():
                local = param.to_local() if hasattr(param, "to_local") else param
                if local.numel() and not bool(torch.isfinite(local).all()):
                    bad.fill_(1.0)
                    break
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
        return bad.item() == 0

    def rng_state(self) -> dict:
        """Engine-held RNG state (for example megatron's model-parallel RNG tracker)."""
        return {}

    def set_rng_state(self, state: dict) -> None:
        """Restore :meth:`rng_state`."""

    def shutdown(self) -> None:
        """Release process groups."""
