"""Typed configuration of a run. Parallel and training keys keep Megatron-LM's names and meaning.

Every YAML is checked against these dataclasses (see :mod:`loong_core.config.validate`) before
anything is built. ``model`` and ``data`` are validated against the config class that the
registered component declares; those classes derive from :class:`ModelConfig` and
:class:`DataConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from loong_core.config.rules import bounded, non_negative, positive


def registered(kind: str, default=None, **kwargs):
    """A field whose value must be a name registered in ``kind``."""
    return field(default=default, metadata={"registry": kind}, **kwargs)


def component(kind: str = "model", base: type | None = None, **kwargs):
    """A nested component config whose class is chosen by its ``name`` key.

    The nested mapping is validated against the config class that the registered entry
    ``<kind>/<name>`` declares (its ``config`` metadata), as ``model`` itself is; for example
    a VLM's ``foundation`` is a :class:`ModelConfig` subclass picked by ``foundation.name``.

    Args:
        kind: Registry kind of the name.
        base: Class the chosen config must derive from (default :class:`ModelConfig`).
        **kwargs: Passed to :func:`dataclasses.field`.
    """
    kwargs.setdefault("default_factory", base or ModelConfig)
    return field(metadata={"component": kind, "component_base": base}, **kwargs)


@dataclass
class ModelConfig:
    """Base of every model component config.

    Attributes:
        name: Registered model name (``loong plugins`` lists them).
    """

    name: str = registered("model", default="")

    def check(self, run: LoongConfig, path: str) -> None:
        """Rules between this component's keys and the rest of the run (divisibility by the
        parallel sizes, sequence length against positions), checked before anything is built.

        Args:
            run: The whole validated config.
            path: Config path of this component (``model``, ``model.foundation``).

        Raises:
            ConfigError: naming the keys, the rule and the nearest valid values.
        """


@dataclass
class DataConfig:
    """Base of every dataset config.

    Attributes:
        name: Registered dataset name.
        seq_length: Tokens per sample (Megatron ``--seq-length``).
        balancer: Registered data balancer spreading each global batch over DP ranks.
        cache_dir: Where prepared data (tokenizers, indexed datasets) is cached; None picks
            ``$LOONG_CACHE`` or ``~/.cache/loong``.
        shared_cache: The cache directory is on a filesystem every node sees, so global rank 0
            prepares the data once; false for node-local disks: the first process of every node
            prepares its node's copy (preparation is deterministic, so the copies are equal).
        prefetch: Load the next training batch in a background thread while the current step
            runs (video decoding, image reads and batch balancing overlap the step); the batches
            are the same either way.
    """

    name: str = registered("dataset", default="")
    seq_length: int = positive(256)
    balancer: str = registered("balancer", default="none")
    cache_dir: Optional[str] = None
    shared_cache: bool = True
    prefetch: bool = True


@dataclass
class ParallelConfig:
    """Parallel layout (Megatron names).

    Attributes:
        engine: Registered engine (``megatron`` or ``torch``).
        tensor_model_parallel_size: TP size.
        pipeline_model_parallel_size: PP size.
        virtual_pipeline_model_parallel_size: Model chunks per pipeline rank (interleaved 1F1B).
        sequence_parallel: Shard activations along the sequence in TP regions.
        context_parallel_size: CP size: every sequence sharded over this many ranks (megatron
            engine, LLM families; ``data.seq_length`` a multiple of 2 x CP; docs/long_context.md).
        expert_model_parallel_size: EP size.
        sequence_chunks: Megatron engine, LLM families: run every micro batch's sequence through
            the model in this many chunks (causal order; each attention layer keeps the K/V of
            earlier chunks), backward in reverse chunk order. Same loss and gradients; with full
            recompute, a recomputed layer's activations and the logits exist for one chunk at a
            time. ``data.seq_length`` a multiple of it (x 2 x CP under context parallelism);
            not with pipeline parallelism or ``overlap_grad_reduce`` (docs/long_context.md).
        ulysses_size: Torch engine only: Ulysses sequence parallelism (not Megatron's
            ``sequence_parallel``): the image / video tokens of every sample are sharded over this
            many ranks, which read the same batch, with an all-to-all between sequence and heads
            around each attention. Must divide the world size and the model's attention heads;
            models that support it: the DiT families of loong-diffusion (docs/long_context.md).
        use_distributed_optimizer: Shard optimizer state over DP (ZeRO-1).
        overlap_grad_reduce: Overlap gradient reduce-scatter/all-reduce with backward.
        overlap_param_gather: Overlap the distributed optimizer's parameter all-gather.
        recompute_granularity: None, ``full`` or ``selective`` activation recompute.
        recompute_method: ``uniform`` or ``block`` (full recompute only).
        recompute_num_layers: Layers per recompute unit (full recompute only).
        recompute_modules: Modules recomputed in selective mode (``core_attn``, ``layernorm``...).
        data_parallel_sharding: Torch engine only: ``ddp`` (replicate parameters, all-reduce
            gradients), ``fsdp`` (FSDP2 ``fully_shard`` over all data-parallel ranks) or ``hsdp``
            (2-D mesh: shard within groups of ``data_parallel_shard_size`` ranks, replicate
            across groups).
        data_parallel_shard_size: Ranks per sharding group with ``hsdp`` (must divide the world
            size); None means all ranks (then ``hsdp`` equals ``fsdp``).
        activation_checkpointing: Torch engine only: recompute each block the model declares
            (``ModelProvider.torch_blocks``) in the backward instead of keeping its activations.
        mixed_precision: Training precision. ``auto`` is ``bf16`` where the device backend says
            bf16 is fast (``DeviceBackend.fast_bf16``: CUDA, and CPUs with a bf16 matrix unit,
            AMX or AVX512-BF16, unless ``$LOONG_CPU_BF16=0``) and ``fp32`` elsewhere.
            megatron engine: ``bf16`` / ``fp16`` keep the model's parameters in that dtype and
            fp32 main parameters, main gradients and optimizer state in megatron-core's
            mixed-precision (or distributed) optimizer (Megatron ``--bf16`` / ``--fp16``); ``fp16``
            uses loss scaling (``optim.loss_scale`` ...). torch engine: the compute dtype
            (autocast / FSDP2 ``param_dtype``); parameters, gradient reduction and optimizer
            state stay fp32; ``fp16`` is megatron-engine only.
        accumulate_allreduce_grads_in_fp32: megatron engine with bf16 / fp16: accumulate and
            reduce gradients in fp32 buffers (megatron-core DDP's ``grad_reduce_in_fp32``);
            false keeps them in the parameter dtype. fp32 runs reduce in fp32 anyway.
        fp8_format: FP8 training (Megatron ``--fp8-format``): None (off), ``e4m3`` (every
            FP8 tensor e4m3) or ``hybrid`` (activations and weights e4m3, gradients e5m2). torch
            engine: torchao's float8 training swaps the chosen ``nn.Linear`` layers; megatron
            engine: needs TransformerEngine (docs/mixed_precision.md).
        fp8_recipe: How FP8 tensors are scaled (Megatron ``--fp8-recipe``): ``tensorwise`` (one
            dynamic scale per tensor) or ``rowwise`` (one per row, powers of two; ``e4m3`` only).
        first_last_layers_bf16: Adaptive FP8 (Megatron ``--first-last-layers-bf16``): keep the
            first ``num_layers_at_start_in_bf16`` and last ``num_layers_at_end_in_bf16`` blocks
            of the model out of FP8 (in the compute dtype).
        num_layers_at_start_in_bf16: Blocks at the start kept out of FP8 (with the above).
        num_layers_at_end_in_bf16: Blocks at the end kept out of FP8 (with the above).
        fp8_min_gemm_dim: Adaptive FP8: a Linear whose ``in_features`` or ``out_features`` is
            below this stays out of FP8 (its GEMM is too small to gain from it); 0 keeps only
            the rule FP8 matmuls impose (both dimensions multiples of 16).
    """

    engine: str = registered("engine", default="megatron")
    tensor_model_parallel_size: int = positive(1)
    pipeline_model_parallel_size: int = positive(1)
    virtual_pipeline_model_parallel_size: Optional[int] = positive(None)
    sequence_parallel: bool = False
    context_parallel_size: int = positive(1)
    expert_model_parallel_size: int = positive(1)
    sequence_chunks: int = positive(1)
    ulysses_size: int = positive(1)
    use_distributed_optimizer: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    recompute_granularity: Optional[Literal["full", "selective"]] = None
    recompute_method: Optional[Literal["uniform", "block"]] = None
    recompute_num_layers: Optional[int] = positive(None)
    recompute_modules: Optional[list[str]] = None
    data_parallel_sharding: Literal["ddp", "fsdp", "hsdp"] = "ddp"
    data_parallel_shard_size: Optional[int] = positive(None)
    activation_checkpointing: bool = False
    mixed_precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    accumulate_allreduce_grads_in_fp32: bool = True
    fp8_format: Optional[Literal["e4m3", "hybrid"]] = None
    fp8_recipe: Literal["tensorwise", "rowwise"] = "tensorwise"
    first_last_layers_bf16: bool = False
    num_layers_at_start_in_bf16: int = non_negative(1)
    num_layers_at_end_in_bf16: int = non_negative(1)
    fp8_min_gemm_dim: int = non_negative(0)


@dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule (Megatron names).

    Attributes:
        optimizer: ``adam`` (AdamW-style decoupled weight decay) or ``sgd``.
        lr: Peak learning rate.
        min_lr: Learning rate at the end of the decay.
        weight_decay: Decoupled weight decay.
        adam_beta1: Adam beta1.
        adam_beta2: Adam beta2.
        adam_eps: Adam epsilon.
        sgd_momentum: SGD momentum.
        clip_grad: Global gradient-norm clip (0 disables).
        lr_warmup_iters: Linear warmup iterations.
        lr_decay_style: ``cosine``, ``linear`` or ``constant``.
        lr_decay_iters: Iterations of decay; None means ``trainer.train_iters``.
        loss_scale: fp16 only: a static loss scale; None scales dynamically (below).
        initial_loss_scale: fp16 dynamic loss scaling: the first scale.
        min_loss_scale: fp16 dynamic loss scaling: the scale never drops below this.
        loss_scale_window: fp16 dynamic loss scaling: steps without overflow before the scale
            doubles.
        hysteresis: fp16 dynamic loss scaling: overflows tolerated before the scale halves.
        implementation: torch's optimizer implementation (as torchtitan's
            ``optimizer.implementation``): ``auto`` (the fused kernel wherever torch has one for the
            parameters' device, as transformers' Trainer defaults to; torch's own choice
            elsewhere), ``fused``, ``foreach`` or ``for-loop``. Apex / TransformerEngine optimizers,
            which megatron-core prefers when installed, are not affected.
    """

    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float = non_negative(3.0e-4)
    min_lr: float = non_negative(0.0)
    weight_decay: float = non_negative(0.01)
    adam_beta1: float = bounded(0.9, ge=0, lt=1)
    adam_beta2: float = bounded(0.95, ge=0, lt=1)
    adam_eps: float = positive(1.0e-8)
    sgd_momentum: float = bounded(0.9, ge=0, lt=1)
    clip_grad: float = non_negative(1.0)
    lr_warmup_iters: int = non_negative(0)
    lr_decay_style: Literal["cosine", "linear", "constant"] = "cosine"
    lr_decay_iters: Optional[int] = positive(None)
    loss_scale: Optional[float] = None
    initial_loss_scale: float = 4294967296.0
    min_loss_scale: float = 1.0
    loss_scale_window: int = 1000
    hysteresis: int = 2
    implementation: Literal["auto", "fused", "foreach", "for-loop"] = "auto"


@dataclass
class TrainerConfig:
    """The training loop.

    Attributes:
        train_iters: Optimizer steps.
        micro_batch_size: Samples per micro batch per DP rank.
        global_batch_size: Samples per step over all DP ranks; must be a multiple of
            ``micro_batch_size * data_parallel_size`` (the quotient is grad accumulation).
        seed: Random seed.
        log_interval: Steps between metric lines / JSONL records.
        eval_interval: Steps between validation passes (0 disables).
        eval_iters: Validation global batches per pass.
        eval_at_start: Also evaluate before the first step (a baseline for the curve).
        save_interval: Steps between checkpoints (0: only at the end).
        save_at_end: Save a checkpoint after the last step.
        run_dir: Directory of this run (checkpoints, metrics); None: ``runs/<name>/<time>``.
        resume: ``none``, ``auto`` (newest complete checkpoint of the run dir, or of the newest
            run of this experiment when run_dir is unset), a checkpoint directory (``iter_N``) or a
            run directory (its newest complete checkpoint).
        init_from: Checkpoint (or run) directory whose model weights initialise a fresh run (any
            parallel layout; optimizer, schedule and iteration start anew; tensor shapes must match
            the model's). Ignored when resuming.
        progress_bar: Show a progress bar on local rank 0 when stderr is a terminal.
        tensorboard: Write TensorBoard event files.
        exit_on_nan: Stop with an error (naming the step and the last good checkpoint) when the
            training loss, gradient norm or validation loss becomes NaN/inf; false: skip that
            step's update and count it in ``skipped_steps``. A checkpoint with NaN/inf weights is
            never written either way.
        save_on_signal: On SIGTERM (what a scheduler sends before preemption) every rank stops
            after its current step, a checkpoint is written, and the run exits cleanly (code 0).
        async_save: Write the checkpoints of ``save_interval`` in the background: the loop is
            blocked only while the state is taken (a forked writer on the megatron engine, a
            copy to host memory and a writer thread on the torch engine), and the checkpoint
            becomes visible (record, rename) once every rank has finished writing, checked at
            the start of each later step. A second save waits for the first; the last save (end
            of training, ``save_on_signal``) is written synchronously, so every checkpoint is
            complete before the run exits. A crash meanwhile leaves only a ``.partial`` folder,
            never loaded. Costs host memory for the snapshot (copy-on-write pages of the forked
            writer, or a copy of model and optimizer state).
        straggler_factor: Name a straggler: on the last step of each logging interval every rank
            times the work it does on its own (loading its batch, its forward), and rank 0 logs a
            WARNING naming a rank (and its host) whose time exceeds this multiple of the median
            of the other ranks of its pipeline stage; 0 turns the check off (no timing, no
            collective). Runs of several ranks only.
        profile: Record a torch.profiler trace of the steps ``profile_step_start`` up to, not
            including, ``profile_step_end`` (Megatron's ``--profile`` with
            ``--use-pytorch-profiler``): a TensorBoard / Perfetto trace and an ops table per
            recorded rank under ``<run_dir>/profile/`` (``docs/performance.md``).
        profile_step_start: First recorded step (1-based, as the logs count).
        profile_step_end: The step after the last recorded one.
        profile_ranks: Global ranks that record.
        profile_record_shapes: Also record each op's input shapes (the ops table then has a row
            per op and shape); costs some overhead.
        profile_with_stack: Also record the Python call stack of each op (the trace then nests
            ops under the functions and modules that ran them); costs more overhead.
    """

    train_iters: int = positive(100)
    micro_batch_size: int = positive(4)
    global_batch_size: int = positive(4)
    seed: int = bounded(1234, ge=0, lt=2 ** 32)
    log_interval: int = positive(10)
    eval_interval: int = non_negative(50)
    eval_iters: int = non_negative(4)
    eval_at_start: bool = False
    save_interval: int = non_negative(0)
    save_at_end: bool = True
    run_dir: Optional[str] = None
    resume: str = "none"
    init_from: Optional[str] = None
    progress_bar: bool = True
    tensorboard: bool = True
    exit_on_nan: bool = True
    save_on_signal: bool = False
    async_save: bool = False
    straggler_factor: float = non_negative(1.5)
    profile: bool = False
    profile_step_start: int = positive(10)
    profile_step_end: int = positive(12)
    profile_ranks: list[int] = field(default_factory=lambda: [0])
    profile_record_shapes: bool = False
    profile_with_stack: bool = False


@dataclass
class DeviceConfig:
    """Device backend.

    Attributes:
        name: Registered backend (``cpu``, ``cuda``, ...) or ``auto`` (``$LOONG_DEVICE``, else
            the best available).
        num_threads: CPU threads per rank for intra-op parallelism (None: torch's default
            divided by local ranks).
        peak_tflops: Peak dense TFLOP/s of one device for the run's compute dtype, for MFU; it
            wins over the backend's own (cpu: derived from the CPU, cuda: datasheet table, xpu:
            none known, also ``$LOONG_PEAK_TFLOPS``). None: the backend's own peak, or no MFU
            (``n/a``) where it has none.
    """

    name: str = "auto"
    num_threads: Optional[int] = positive(None)
    peak_tflops: Optional[float] = None


@dataclass
class KernelsConfig:
    """Implementation of each op of the kernel seam (``loong_core.kernels``; ``docs/kernels.md``).

    Each key is ``auto`` or a backend registered for that op as ``"<op>:<backend>"``
    (``loong doctor`` lists them with their availability here). ``auto`` picks the preferred
    available backend of the device (``triton`` on CUDA when ``loong-kernels`` is installed) and
    else the plain one. A backend unknown, or unavailable on the run's device, is a ConfigError.

    Attributes:
        rms_norm: RMSNorm (``torch``, ``compile``, ``triton``).
        swiglu: SwiGLU activation of gated MLPs.
        rope: Rotary embedding (standard, llama3-scaled, MRoPE).
        layer_norm_modulate: LayerNorm + adaLN shift/scale of DiTs and GR00T's head.
        cross_entropy: The loss over logits (vocab-parallel under TP).
        linear_cross_entropy: The loss fused with the output layer; any backend but ``torch``
            makes the megatron engine compute the loss from hidden states and the output
            weight, never holding all ``[tokens, vocab]`` logits (``chunked`` runs on CPU).
        sparse_attention: DeepSeek sparse attention over the indexer's selected keys
            (``deepseek_v32``): ``torch`` (chunked) or ``triton``.
        indexer_topk: The lightning indexer's scores and causal top-k (``deepseek_v32``).
        gated_delta_rule: Gated DeltaNet linear attention (Qwen3-Next / Qwen3.5): ``torch``
            (chunked) or ``fla`` (flash-linear-attention, CUDA).
        attention: Core attention: ``sdpa`` (the plain backend: torch SDPA, GQA without
            repeated K/V, packed documents / vision windows per segment), ``flex``
            (FlexAttention block masks, compiled) or ``eager`` (explicit scores and a dense
            mask, the pre-seam math).
    """

    rms_norm: str = "auto"
    swiglu: str = "auto"
    rope: str = "auto"
    layer_norm_modulate: str = "auto"
    cross_entropy: str = "auto"
    linear_cross_entropy: str = "auto"
    sparse_attention: str = "auto"
    indexer_topk: str = "auto"
    gated_delta_rule: str = "auto"
    attention: str = "auto"


@dataclass
class LoongConfig:
    """A whole run.

    Attributes:
        name: Experiment name (names the run directory).
        model: Model component config; validated against the registered model's class.
        data: Dataset config; validated against the registered dataset's class.
        parallel: Parallel layout.
        optim: Optimizer and schedule.
        trainer: Training loop.
        device: Device backend.
        kernels: Backend of each kernel op.
    """

    name: str = "run"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    kernels: KernelsConfig = field(default_factory=KernelsConfig)
