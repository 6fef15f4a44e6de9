"""The ``megatron`` engine: megatron-core parallel state, DDP, optimizer, schedules, checkpoints."""

from __future__ import annotations

import logging
import math

import torch

from loong_core import kernels
from loong_core.engines.base import Engine, ParallelLayout, StepResult
from loong_core.engines.megatron import (
    checkpointing,
    context_parallel,
    deferred_compile,
    optim,
    parallel,
    precision,
    sequence_chunks,
)
from loong_core.engines.megatron.deferred_compile import import_megatron_core
from loong_core.engines.megatron.finite import grads_finite
from loong_core.errors import ConfigError

logger = logging.getLogger(__name__)

CUDA_STREAM_OPTIONS = ("moe_shared_expert_overlap",)
"""``TransformerConfig`` options megatron-core runs on a CUDA side stream (turned off elsewhere)."""


class MegatronEngine(Engine):
    """Trains a :class:`~loong_core.engines.model_provider.ModelProvider` with megatron-core."""

    def init_parallel(self) -> ParallelLayout:
        if "megatron" not in self.provider.engines:
            raise ConfigError(
                f"model '{self.config.model.name}' does not support parallel.engine=megatron "
                f"(it supports: {', '.join(self.provider.engines)})."
            )
        if self.config.parallel.context_parallel_size > 1:
            context_parallel.check_provider(self.provider, self.config.model.name)
            context_parallel.check_seq_length(self.config.data.seq_length, self.config.parallel)
        if self.config.parallel.sequence_chunks > 1:
            sequence_chunks.check_provider(self.provider, self.config.model.name)
            self.provider.sequence_chunks = self.config.parallel.sequence_chunks
        import_megatron_core()  # the CPU backend did already; on an accelerator this is the first
        deferred_compile.compile_helpers(deferred_compile.compile_helpers_for_run(
            self.device.device_type, kernels.resolved()))
        self.layout = parallel.initialize(self.config.parallel, self.config.trainer.seed)
        return self.layout

    def _drop_cuda_stream_options(self) -> None:
        """Turn off the megatron-core options it implements with CUDA streams only
        (:data:`CUDA_STREAM_OPTIONS`) on another device, with a warning naming each."""
        if self.device.side_streams:
            return
        for key in CUDA_STREAM_OPTIONS:
            if getattr(self.mcore_config, key, False):
                setattr(self.mcore_config, key, False)
                logger.warning("model.%s=true: megatron-core overlaps it on a CUDA side stream, which device %s "
                               "does not have; this run goes without the overlap (same numbers, in order)",
                               key, self.device.name)

    def setup(self) -> None:
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )

        p = self.config.parallel
        self.precision = precision.for_run(self.config, self.device)
        self.mcore_config = self.provider.megatron_config(
            {**parallel.transformer_kwargs(p), **self.precision.transformer_kwargs()})
        overrides = self.device.megatron_overrides()  # what the device needs, whatever the model asked
        for key, value in overrides.items():
            setattr(self.mcore_config, key, value)
        if overrides:
            logger.info("megatron-core options of device %s: %s", self.device.name,
                        ", ".join(f"{key}={value}" for key, value in overrides.items()))
        self._drop_cuda_stream_options()
        vpp = p.virtual_pipeline_model_parallel_size
        chunks = []
        for vp_stage in range(vpp or 1):
            stage = vp_stage if vpp else None
            chunks.append(self.provider.build_megatron_model(
                self.mcore_config,
                pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage),
                post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage),
                vp_stage=stage,
            ))
        for chunk in chunks:
            chunk.to(self.device.torch_device)
        self.provider.initialize_weights(chunks)
        chunks = [precision.wrap_model(chunk, self.mcore_config, self.precision) for chunk in chunks]
        ddp_config = DistributedDataParallelConfig(
            **self.precision.ddp_kwargs(),
            overlap_grad_reduce=p.overlap_grad_reduce,
            overlap_param_gather=p.overlap_param_gather,
            use_distributed_optimizer=p.use_distributed_optimizer,
        )
        self.model = [
            DistributedDataParallel(config=self.mcore_config, ddp_config=ddp_config, module=chunk,
                                    disable_bucketing=(i > 0))
            for i, chunk in enumerate(chunks)
        ]
        self.mcore_config.finalize_model_grads_func = finalize_model_grads
        if p.overlap_grad_reduce:
            no_sync = [m.no_sync for m in self.model]
            self.mcore_config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
            grad_sync = [m.start_grad_sync for m in self.model]
            self.mcore_config.grad_sync_func = grad_sync[0] if len(grad_sync) == 1 else grad_sync
        if p.overlap_param_gather:
            param_sync = [m.start_param_sync for m in self.model]
            self.mcore_config.param_sync_func = param_sync[0] if len(param_sync) == 1 else param_sync
        self.optimizer, self.scheduler = optim.build(self.config, self.model, self.precision,
                                                     self.device.fused_optimizers)
        if self.precision.name == "fp16":
            # The schedules multiply each micro batch's loss by the optimizer's loss scale.
            self.mcore_config.grad_scale_func = self.optimizer.scale_loss

    # -- accounting ------------------------------------------------------------------------
    @property
    def compute_dtype(self):
        return self.precision.params_dtype

    def num_parameters(self) -> int:
        from megatron.core import parallel_state as ps

        local = 0
        for chunk in self.model:
            for param in chunk.module.parameters():
                is_tp_dup = not getattr(param, "tensor_model_parallel", False)
                if is_tp_dup and ps.get_tensor_model_parallel_rank() != 0:
                    continue
                if getattr(param, "shared_embedding", False) and not ps.is_pipeline_first_stage(ignore_virtual=True):
                    continue
                local += param.numel()
        total = torch.tensor([float(local)])
        # Sum over one data-parallel replica: all TP x PP ranks of DP rank 0 (experts counted per EP rank).
        if ps.get_data_parallel_rank(with_context_parallel=True) != 0:
            total.zero_()
        torch.distributed.all_reduce(total)
        return int(total.item())

    # -- steps -------------------------------------------------------------------------------
    def _run_schedule(self, micro_batches: list[dict], forward_only: bool):
        from megatron.core.pipeline_parallel import get_forward_backward_func

        if not micro_batches:
            raise ValueError("train/eval step needs at least one micro batch")
        first = micro_batches[0]
        seq_length = int(first["tokens"].shape[1])
        micro_batch_size = int(first["tokens"].shape[0])
        device = self.device.torch_device

        def forward_step(data_iterator, model):
            batch = next(data_iterator)
            batch = {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v)
                     for k, v in batch.items()}
            return self.provider.forward_step(model, batch)

        iterators = [iter(micro_batches) for _ in self.model]
        return get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iterators if len(iterators) > 1 else iterators[0],
            model=self.model,
            num_microbatches=len(micro_batches),
            seq_length=seq_length,
            micro_batch_size=micro_batch_size,
            decoder_seq_length=seq_length,
            forward_only=forward_only,
        )

    def _items_processed(self, micro_batches: list[dict]) -> float:
        """This rank's share of the items of the global batch (the provider's ``tokens_in``):
        counted on one rank per data-parallel replica, since the TP, PP and CP ranks of a replica
        read the same (unsliced) micro batches."""
        from megatron.core import parallel_state as ps

        if (ps.get_tensor_model_parallel_rank() or ps.get_pipeline_model_parallel_rank()
                or ps.get_context_parallel_rank()):
            return 0.0
        return float(sum(self.provider.tokens_in(batch) for batch in micro_batches))

    def _reduce_losses(self, outputs: list[dict], items: float = 0.0) -> tuple[float, float, dict, float]:
        """Sum ``[loss_sum, tokens]`` over micro batches and DP x CP ranks (each context-parallel
        rank holds its share of the tokens), and this rank's ``items`` over all ranks, in one
        all-reduce; every rank gets ``(loss, tokens, extra, items)``."""
        from megatron.core import parallel_state as ps

        owner = (ps.is_pipeline_last_stage(ignore_virtual=True)
                 and ps.get_tensor_model_parallel_rank() == 0)
        names = list(getattr(self.provider, "reported_metrics", ("loss",)))
        vec = torch.zeros(2 * len(names) + 1, dtype=torch.float64)
        if owner:
            for i, name in enumerate(names):
                for out in outputs:
                    if name in out:
                        vec[2 * i: 2 * i + 2] += out[name].detach().double().cpu().reshape(2)
        vec[-1] = items
        torch.distributed.all_reduce(vec)
        loss = (vec[0] / vec[1]).item() if vec[1] > 0 else float("nan")
        # a metric no micro batch reported (training-only ones at validation) is left out, not 0
        extra = {name: (vec[2 * i] / vec[2 * i + 1]).item()
                 for i, name in enumerate(names) if i > 0 and vec[2 * i + 1] > 0}
        return loss, vec[1].item(), extra, vec[-1].item()

    def train_step(self, micro_batches: list[dict]) -> StepResult:
        for chunk in self.model:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        outputs = self._run_schedule(micro_batches, forward_only=False)
        # A NaN/inf gradient never reaches the weights: no update (the trainer stops or counts the
        # step). fp16's loss scaler checks by itself and must see the overflow to lower the scale.
        finite = self.precision.name == "fp16" or grads_finite(self.model)
        ok, grad_norm, _ = self.optimizer.step() if finite else (False, math.nan, None)
        lr = self.optimizer.param_groups[0]["lr"]
        if ok:  # as Megatron-LM: a step skipped for an fp16 overflow does not advance the schedule
            self.scheduler.step(increment=1)
        loss, tokens, extra, items = self._reduce_losses(outputs, self._items_processed(micro_batches))
        if self.precision.name == "fp16":
            extra["loss_scale"] = float(self.optimizer.get_loss_scale())
        if not ok and finite:
            logger.warning("fp16 overflow in the gradients: step skipped, loss scale now %g",
                           float(self.optimizer.get_loss_scale()))
        return StepResult(loss=loss, tokens=tokens,
                          grad_norm=float(grad_norm) if grad_norm is not None else math.nan,
                          lr=float(lr), skipped=not ok, nonfinite=not finite, extra=extra,
                          items=items)

    @torch.no_grad()
    def eval_step(self, micro_batches: list[dict]) -> StepResult:
        for chunk in self.model:
            chunk.eval()
        try:
            outputs = self._run_schedule(micro_batches, forward_only=True)
        finally:
            for chunk in self.model:
                chunk.train()
        loss, tokens, extra, _ = self._reduce_losses(outputs)
        return StepResult(loss=loss, tokens=tokens, extra=extra)

    # -- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self, directory: str, common_state: dict) -> None:
        checkpointing.save(self, directory, common_state)

    def save_checkpoint_async(self, directory: str, common_state: dict):
        return checkpointing.save_async(self, directory, common_state)

    def load_checkpoint(self, directory: str) -> dict:
        return checkpointing.load(self, directory)

    def load_model_weights(self, directory: str) -> None:
        checkpointing.load_model_only(self, directory)

    def rng_state(self) -> dict:
        from megatron.core import tensor_parallel

        return {"tracker": tensor_parallel.get_cuda_rng_tracker().get_states()}

    def set_rng_state(self, state: dict) -> None:
        from megatron.core import tensor_parallel

        if "tracker" in state:
            tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])

    def shutdown(self) -> None:
        from megatron.core import parallel_state as ps

        ps.destroy_model_parallel()
