"""The banner ``loong train`` prints once: versions, device, plugins, parallel layout."""

from __future__ import annotations

import platform


def _version(package: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def _parallel_line(p, layout) -> str:
    if p.engine == "megatron":
        return (f"parallel: engine=megatron TP={p.tensor_model_parallel_size} "
                f"PP={p.pipeline_model_parallel_size} VPP={p.virtual_pipeline_model_parallel_size or 1} "
                f"CP={p.context_parallel_size} EP={p.expert_model_parallel_size} DP={layout.data_parallel_size} "
                f"SP={p.sequence_parallel} dist-opt={p.use_distributed_optimizer}"
                + (f" sequence-chunks={p.sequence_chunks}" if p.sequence_chunks > 1 else ""))
    sharding = getattr(p, "data_parallel_sharding", "ddp")
    ulysses = getattr(p, "ulysses_size", 1)
    return (f"parallel: engine={p.engine} {sharding} over DP={layout.data_parallel_size} "
            + (f"x Ulysses={ulysses} " if ulysses > 1 else "")
            + f"activation-checkpointing={getattr(p, 'activation_checkpointing', False)}")


def _compute_dtype(cfg, device):
    if cfg.parallel.engine == "megatron":
        from loong_core.engines.megatron import precision

        return precision.for_run(cfg, device).params_dtype
    from loong_core.engines.torch_native.parallelize import compute_dtype

    return compute_dtype(cfg.parallel, device)


def _peak_line(cfg, device) -> str:
    """The peak FLOP/s MFU is measured against, and where it comes from."""
    return f"mfu peak: {device.peak_flops_note(_compute_dtype(cfg, device))}"


def _precision_line(cfg, device) -> str:
    """The dtypes of parameters, gradients and optimizer state (``parallel.mixed_precision``)."""
    if cfg.parallel.engine == "megatron":
        from loong_core.engines.megatron import precision

        return precision.for_run(cfg, device).describe(cfg.optim)
    from loong_core.engines.torch_native.parallelize import compute_dtype

    compute = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}.get(
        str(compute_dtype(cfg.parallel, device)), "fp32")
    return (f"precision: compute {compute} (params fp32, grads reduced fp32, "
            f"optimizer state fp32)")


def _optimizer_line(cfg, device) -> str:
    """The optimizer and torch's implementation of it (``optim.implementation``)."""
    from loong_core.engines.optimizer_implementation import planned

    o = cfg.optim
    implementation = planned(o.implementation, device)
    name = "adamw" if o.optimizer == "adam" else "sgd"
    return (f"optimizer: {name} ({implementation}, optim.implementation={o.implementation}) lr {o.lr:g} "
            f"weight-decay {o.weight_decay:g} clip-grad {o.clip_grad:g}")


def kernels_line() -> str:
    """The backend resolved per kernel op (``kernels.<op>``, ``auto`` already resolved)."""
    from loong_core import kernels

    return "kernels: " + " ".join(f"{op}={b}" for op, b in kernels.resolved().items())


def banner(cfg, device, layout, num_params: int, system, run_dir,
           engine_lines: list[str] = ()) -> str:
    """Multi-line description of the run (``engine_lines``: :meth:`Engine.banner_lines`)."""
    p, t = cfg.parallel, cfg.trainer
    plugins = ", ".join(f"{i.name} {i.version}" + (" (FAILED)" if i.error else "") for i in system.infos)
    grad_accum = t.global_batch_size // (t.micro_batch_size * layout.data_parallel_size)
    lines = [
        f"loong {_version('loong-core')} | torch {_version('torch')} | megatron-core "
        f"{_version('megatron-core')} | python {platform.python_version()}",
        f"device: {device.describe()} x {layout.world_size} ranks ({device.dist_backend})",
        f"plugins: {plugins}",
        f"experiment: {cfg.name} | model: {cfg.model.name} ({num_params / 1e6:.2f}M parameters) "
        f"| data: {cfg.data.name} (seq {cfg.data.seq_length})",
        _parallel_line(p, layout),
        kernels_line(),
        _precision_line(cfg, device),
        *engine_lines,
        _optimizer_line(cfg, device),
        _peak_line(cfg, device),
        f"batch: global {t.global_batch_size} = micro {t.micro_batch_size} x grad-accum "
        f"{grad_accum} x DP {layout.data_parallel_size} | steps {t.train_iters}",
        f"run dir: {run_dir}",
    ]
    return "\n".join(lines)
