"""The contract a registered model fulfils so that an engine can build and train it."""

from __future__ import annotations

from typing import Any


class ModelProvider:
    """Builds one registered model for an engine; constructed with the validated model config.

    Attributes:
        engines: Engine names this model supports.
        reported_metrics: Names in the dict that ``loss_func`` returns; each value is a
            ``[sum, count]`` pair summed over micro batches and data-parallel ranks, reported as
            ``sum / count`` (``loss`` is the training loss).
        torch_unused_parameters: Torch engine: some parameters get no gradient in a step (for
            example the text stream of a double-stream DiT's last block); DDP then searches for
            them every step.
        throughput_unit: What :meth:`tokens_in` counts, as the progress line and metrics name
            it: ``tokens`` (``tok/s``), ``samples`` (images, videos) or ``frames`` (robot
            observations); :meth:`flops_per_token` is per item of this unit.
    """

    engines: tuple[str, ...] = ("megatron",)
    throughput_unit: str = "tokens"
    reported_metrics: tuple[str, ...] = ("loss",)
    torch_unused_parameters: bool = False

    def __init__(self, config: Any):
        self.config = config

    def apply_data_overrides(self, overrides: dict[str, Any]) -> None:
        """Take values the data decides (for example the tokenizer's ``vocab_size``)."""
        for key, value in overrides.items():
            if hasattr(self.config, key):
                setattr(self.config, key, value)

    # -- megatron engine ---------------------------------------------------------------------
    def megatron_config(self, parallel_kwargs: dict[str, Any]) -> Any:
        """Return megatron-core's ``TransformerConfig`` with ``parallel_kwargs`` applied."""
        raise NotImplementedError

    def build_megatron_model(self, config: Any, pre_process: bool, post_process: bool,
                             vp_stage: int | None) -> Any:
        """Build the model chunk for one (virtual) pipeline stage."""
        raise NotImplementedError

    def initialize_weights(self, chunks: list[Any]) -> None:
        """Called once after the model chunks are built, before they are wrapped for DDP and the
        optimizer exists: load pretrained weights here (for example ``init_from_hf``). Default:
        keep the random initialisation."""

    def forward_step(self, model: Any, batch: dict) -> tuple[Any, Any]:
        """Run one micro batch: returns ``(output, loss_func)`` as megatron's schedules expect.

        ``loss_func(output)`` returns ``(loss_sum, num_tokens, {"loss": stack([sum, count])})``.
        """
        raise NotImplementedError

    # -- torch engine ------------------------------------------------------------------------
    def build_torch_model(self) -> Any:
        """Build the whole model as a ``torch.nn.Module`` on the CPU in fp32 (torch engine).

        The engine moves it to the device, then wraps it (DDP / FSDP2). Its ``state_dict`` keys
        are what checkpoints store, so a model built from a reference library (transformers,
        diffusers) keeps that library's layout.
        """
        raise NotImplementedError

    def torch_blocks(self, model: Any) -> list[Any]:
        """The repeated blocks of ``model`` (transformer layers): each becomes its own FSDP2 unit
        and, with ``parallel.activation_checkpointing``, is recomputed in the backward. Default:
        none (the whole model is one unit)."""
        return []

    def enable_ulysses(self, model: Any) -> None:
        """Torch engine with ``parallel.ulysses_size > 1``: make ``model`` (built, not yet wrapped)
        keep only this rank's share of the sequence (``loong_core.engines.torch_native.ulysses``:
        shard the tokens, all-to-all around attention, zero-pad the other ranks' output tokens),
        and :meth:`torch_forward_step` return this rank's share of the loss (over its own tokens)
        and count. Default: not supported."""
        from loong_core.errors import ConfigError

        raise ConfigError(f"model '{self.config.name}' does not support parallel.ulysses_size > 1; "
                          "set parallel.ulysses_size=1.")

    def torch_forward_step(self, model: Any, batch: dict) -> tuple[Any, Any, dict]:
        """Run one micro batch on the torch engine.

        Args:
            model: The wrapped model (call it; do not reach into the wrapper).
            batch: The micro batch, tensors already on the device.

        Returns:
            ``(loss_sum, count, metrics)``: the fp32 sum of per-item losses (a scalar tensor with
            grad), the number of items it sums (a tensor or number: tokens, samples...), and
            ``{name: stack([sum, count])}`` for every name in ``reported_metrics`` (detached).
            The engine divides the summed gradient by the total count over micro batches and
            data-parallel ranks, so the step minimises the mean loss of the global batch.
        """
        raise NotImplementedError

    # -- accounting ------------------------------------------------------------------------
    def flops_per_token(self, seq_length: int) -> float:
        """Training FLOPs (forward + backward) per token (per ``throughput_unit`` item), for MFU;
        0 when unknown (then no MFU is shown)."""
        raise NotImplementedError

    def tokens_in(self, batch: dict) -> int:
        """Tokens processed in a micro batch (for tokens/s)."""
        tokens = batch.get("tokens")
        return int(tokens.numel()) if tokens is not None else 0
