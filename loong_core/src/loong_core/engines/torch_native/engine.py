"""The ``torch`` engine: a model from ``ModelProvider.build_torch_model`` under DDP / FSDP2 / HSDP."""

from __future__ import annotations

import contextlib
import logging
import math

import torch

from loong_core.engines.base import Engine, ParallelLayout, StepResult
from loong_core.engines.torch_native import checkpointing, optim, parallelize
from loong_core.errors import ConfigError

logger = logging.getLogger(__name__)

_UNSUPPORTED = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                "expert_model_parallel_size")


class TorchEngine(Engine):
    """Trains a :class:`~loong_core.engines.model_provider.ModelProvider` with plain PyTorch.

    Every rank is a data-parallel rank, or with ``parallel.ulysses_size=N`` every group of ``N``
    ranks is (Ulysses sequence parallelism, :mod:`.ulysses`: the group shares a batch and each
    rank returns its share of the loss and count, so the reduction over all ranks below is the
    one-rank result). ``parallel.data_parallel_sharding`` picks DDP, FSDP2 or HSDP (over all
    ranks: parameters are replicated over the Ulysses group too); gradients of the micro batches
    accumulate locally and are reduced once per step.
    """

    def init_parallel(self) -> ParallelLayout:
        if "torch" not in self.provider.engines:
            raise ConfigError(
                f"model '{self.config.model.name}' does not support parallel.engine=torch "
                f"(it supports: {', '.join(self.provider.engines)})."
            )
        p = self.config.parallel
        for name in _UNSUPPORTED:
            if getattr(p, name) != 1:
                raise ConfigError(f"'parallel.{name}' = {getattr(p, name)}: the torch engine is data "
                                  f"parallel only; set it to 1 or use parallel.engine=megatron.")
        if p.virtual_pipeline_model_parallel_size or p.recompute_granularity:
            raise ConfigError("the torch engine has no virtual pipeline or megatron recompute; use "
                              "parallel.activation_checkpointing=true instead of recompute_granularity.")
        if p.mixed_precision == "fp16":
            raise ConfigError("'parallel.mixed_precision' = 'fp16' needs loss scaling, which only the "
                              "megatron engine has; use bf16 (or fp32) with parallel.engine=torch.")
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        dp, dp_rank = world, rank
        if p.ulysses_size > 1:
            dp, dp_rank = self._init_ulysses(p.ulysses_size, rank, world)
        self.layout = ParallelLayout(world_size=world, rank=rank, data_parallel_size=dp,
                                     data_parallel_rank=dp_rank, is_logging_rank=rank == 0)
        return self.layout

    def _init_ulysses(self, n: int, rank: int, world: int) -> tuple[int, int]:
        """A ``("data", "ulysses")`` mesh: ranks ``[k n, (k + 1) n)`` form Ulysses group ``k``,
        which is data-parallel rank ``k`` (they read the same batch)."""
        from torch.distributed.device_mesh import init_device_mesh

        from loong_core.config.ulysses_rules import check_ulysses_world
        from loong_core.engines.torch_native import ulysses

        dp = check_ulysses_world(self.config.parallel, world)
        self.sequence_mesh = init_device_mesh(self.device.device_type, (dp, n),
                                              mesh_dim_names=("data", "ulysses"))
        ulysses.set_group(self.sequence_mesh["ulysses"].get_group())
        return dp, rank // n

    def setup(self) -> None:
        p = self.config.parallel
        self.dtype = parallelize.compute_dtype(p, self.device)
        module = self.provider.build_torch_model().to(self.device.torch_device)
        self.provider.initialize_weights([module])
        from loong_core.kernels.torch_modules import swap_modules

        swap_modules(module)  # transformers / diffusers RMSNorms through kernels.rms_norm
        if p.ulysses_size > 1:
            self.provider.enable_ulysses(module)
        blocks = list(self.provider.torch_blocks(module))
        self.fp8_plan = None
        if p.fp8_format is not None:
            from loong_core.engines.torch_native import fp8

            self.fp8_plan = fp8.plan(module, blocks, p)
            fp8.convert(module, self.fp8_plan, p, self.device)
        self.model = parallelize.wrap(module, blocks, p, self.device, self.layout.world_size, self.dtype,
                                      getattr(self.provider, "torch_unused_parameters", False))
        self.optimizer = optim.build_optimizer(self.config, self.model, self.device.fused_optimizers)
        self.scheduler = optim.LRSchedule(self.optimizer, self.config)
        self.metric_names = list(getattr(self.provider, "reported_metrics", ("loss",)))
        # DDP: autocast is the mixed precision. FSDP2 casts the parameters (param_dtype), and
        # autocast also covers what a model makes in fp32 itself (timestep sinusoids, state
        # features) meeting those bf16 weights.
        self._autocast = self.dtype != torch.float32
        logger.info("torch engine: %s over %d ranks (Ulysses %d), compute %s, activation checkpointing %s",
                    p.data_parallel_sharding, self.layout.world_size, p.ulysses_size,
                    str(self.dtype).replace("torch.", ""), "on" if p.activation_checkpointing else "off")

    @property
    def compute_dtype(self):
        return self.dtype

    def banner_lines(self) -> list[str]:
        """The FP8 recipe and which Linear layers run in FP8 (``parallel.fp8_format``)."""
        if self.fp8_plan is None:
            return []
        from loong_core.engines.torch_native import fp8

        return [fp8.describe_run(self.config.parallel, self.device), self.fp8_plan.describe()]

    def num_parameters(self) -> int:
        return int(sum(param.numel() for param in self.model.parameters()))  # DTensor: global size

    # -- steps -------------------------------------------------------------------------------
    def _grad_sync(self, enabled: bool):
        if isinstance(self.model, torch.nn.parallel.DistributedDataParallel):
            return contextlib.nullcontext() if enabled else self.model.no_sync()
        setter = getattr(self.model, "set_requires_gradient_sync", None)
        if setter is not None:
            setter(enabled)
        return contextlib.nullcontext()

    def _forward(self, batch: dict):
        device = self.device.torch_device
        batch = {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()}
        autocast = (torch.autocast(device.type, dtype=self.dtype) if self._autocast
                    else contextlib.nullcontext())
        with autocast:
            return self.provider.torch_forward_step(self.model, batch)

    def _accumulate(self, stats: torch.Tensor, count, metrics: dict) -> None:
        stats[0] += torch.as_tensor(count, dtype=torch.float64, device=stats.device).detach()
        for i, name in enumerate(self.metric_names):
            if name in metrics:
                stats[1 + 2 * i: 3 + 2 * i] += metrics[name].detach().to(stats.device, torch.float64).reshape(2)

    def _result(self, stats: torch.Tensor) -> tuple[float, float, dict]:
        torch.distributed.all_reduce(stats)
        values = stats.tolist()  # the step's only host synchronisation
        loss = values[1] / values[2] if values[2] > 0 else math.nan
        # a metric no micro batch reported (training-only ones at validation) is left out, not 0
        extra = {name: values[1 + 2 * i] / values[2 + 2 * i]
                 for i, name in enumerate(self.metric_names) if i > 0 and values[2 + 2 * i] > 0}
        return loss, values[0], extra

    def _stats(self) -> torch.Tensor:
        return torch.zeros(1 + 2 * len(self.metric_names), dtype=torch.float64, device=self.device.torch_device)

    def train_step(self, micro_batches: list[dict]) -> StepResult:
        if not micro_batches:
            raise ValueError("train step needs at least one micro batch")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        stats = self._stats()
        last = len(micro_batches) - 1
        for i, batch in enumerate(micro_batches):
            with self._grad_sync(i == last):
                loss_sum, count, metrics = self._forward(batch)
                loss_sum.backward()
            self._accumulate(stats, count, metrics)
        loss, count, extra = self._result(stats)
        # Reduction averaged the per-rank gradient sums; turn that into the global-batch mean.
        scale = self.layout.world_size / count if count > 0 else 0.0
        params = [param for param in self.model.parameters() if param.grad is not None]
        for param in params:
            param.grad.mul_(scale)
        clip = self.config.optim.clip_grad
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        lr = self.optimizer.param_groups[0]["lr"]
        # A NaN/inf loss or gradient never reaches the weights (the trainer stops or counts the step).
        finite = math.isfinite(float(norm)) and math.isfinite(loss)
        if finite:
            self.optimizer.step()
            self.scheduler.step()
        return StepResult(loss=loss, tokens=count, grad_norm=float(norm), lr=float(lr), extra=extra,
                          skipped=not finite, nonfinite=not finite)

    @torch.no_grad()
    def eval_step(self, micro_batches: list[dict]) -> StepResult:
        self.model.eval()
        stats = self._stats()
        try:
            for batch in micro_batches:
                _, count, metrics = self._forward(batch)
                self._accumulate(stats, count, metrics)
        finally:
            self.model.train()
        loss, count, extra = self._result(stats)
        return StepResult(loss=loss, tokens=count, extra=extra)

    # -- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self, directory: str, common_state: dict) -> None:
        checkpointing.save(self, directory)
        checkpointing.save_common(directory, self.scheduler, common_state)

    def save_checkpoint_async(self, directory: str, common_state: dict):
        write = checkpointing.save_async(self, directory)
        checkpointing.save_common(directory, self.scheduler, common_state)
        return write

    def load_checkpoint(self, directory: str) -> dict:
        return checkpointing.load(self, directory)

    def load_model_weights(self, directory: str) -> None:
        checkpointing.load_model_only(self.model, directory)

    def shutdown(self) -> None:
        """Process groups belong to the runtime; forget the Ulysses group."""
        if self.config.parallel.ulysses_size > 1:
            from loong_core.engines.torch_native import ulysses

            ulysses.set_group(None)
