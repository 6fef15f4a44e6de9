"""One training process: config -> device -> process groups -> engine -> data -> trainer."""

from __future__ import annotations

import datetime
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _init_process_group(backend: str, device) -> None:
    """Join the process group through the rendezvous in ``MASTER_ADDR:MASTER_PORT``.

    Reaching the rendezvous and meeting every other rank there is bounded by
    ``$LOONG_INIT_TIMEOUT`` seconds (default 300): a missing rank or an unreachable head node is a
    :class:`TrainingError` naming the address, not a 30-minute hang (collectives keep 30 minutes).
    """
    import torch

    if torch.distributed.is_initialized():
        return
    kwargs = {}
    if backend == "nccl":
        kwargs["device_id"] = device.torch_device
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    store = _rendezvous(rank, world)
    torch.distributed.init_process_group(backend=backend, store=store, rank=rank, world_size=world,
                                         timeout=datetime.timedelta(minutes=30), **kwargs)


def _rendezvous(rank: int, world: int):
    """The TCP store of ``env://`` (torchrun's agent's when it hosts one), after every rank met."""
    import time

    import torch

    from loong_core.errors import TrainingError

    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), _env_int("MASTER_PORT", 29500)
    seconds = float(os.environ.get("LOONG_INIT_TIMEOUT", "300"))
    server = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    fix = (f"Check that all {world} ranks were started, that {host}:{port} is the address of node 0 "
           "and reachable from this node (firewall), and that node 0 is up; LOONG_INIT_TIMEOUT=SECONDS "
           "changes the wait.")
    deadline = time.monotonic() + seconds
    try:
        store = torch.distributed.TCPStore(host, port, world if server else None, server,
                                           timeout=datetime.timedelta(seconds=seconds), multi_tenant=True)
        key = f"loong/joined/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        store.add(key, 1)
        while store.add(key, 0) < world:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{store.add(key, 0)} of {world} ranks arrived")
            time.sleep(0.05)
    except (RuntimeError, TimeoutError, OSError) as exc:  # torch's DistError is a RuntimeError
        raise TrainingError(f"rank {rank} of {world}: no process group after {seconds:.0f} s at the "
                            f"rendezvous {host}:{port} ({type(exc).__name__}: {str(exc).splitlines()[0]}). "
                            f"{fix}") from None
    return store


def _broadcast_object(value):
    import torch

    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def _runs_root() -> Path:
    return Path(os.environ.get("LOONG_RUNS", "runs"))


def pick_run_dir(cfg) -> Path:
    """The run directory ``cfg`` names (``trainer.run_dir``), or the newest one of the experiment
    (``trainer.resume=auto``), or a new ``runs/<name>/<time>``."""
    t = cfg.trainer
    experiment_root = _runs_root() / cfg.name
    if t.run_dir:
        run_dir = Path(t.run_dir)
    elif t.resume == "auto" and experiment_root.is_dir():
        previous = sorted(p for p in experiment_root.iterdir() if p.is_dir())
        run_dir = previous[-1] if previous else None
    else:
        run_dir = None
    if run_dir is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        run_dir = experiment_root / stamp
        suffix = 1
        while run_dir.exists():
            run_dir = experiment_root / f"{stamp}-{suffix}"
            suffix += 1
    return run_dir


def choose_run_dir(cfg) -> tuple[Path, Path | None]:
    """Return ``(run_dir, checkpoint_to_resume)`` on rank 0 (see ``TrainerConfig.resume``)."""
    from loong_core.checkpoint import store

    t = cfg.trainer
    run_dir = pick_run_dir(cfg)
    resume_from = None
    if t.resume == "auto":
        resume_from = store.find_latest_intact(run_dir / "checkpoints")  # damaged ones passed over
    elif t.resume not in ("none", ""):
        resume_from = store.resolve_checkpoint(t.resume)  # clear error before anything is built
        store.verify_checkpoint(resume_from)
    return run_dir, resume_from


def _start_plan(cfg, device_type: str):
    """Rank 0: ``(run_dir, checkpoint to resume, checkpoint to initialise from, kernels to keep)``,
    every file of the checkpoint verified, or the :class:`LoongError` that stops the run
    (broadcast, so that every rank raises it instead of waiting for rank 0). The kernels to keep
    are the backends the resumed checkpoint was trained with on this device type (None otherwise)."""
    from loong_core.checkpoint import store
    from loong_core.errors import LoongError

    try:
        run_dir, resume_from = choose_run_dir(cfg)
        init_source, kept = None, None
        if resume_from is None and cfg.trainer.init_from:
            init_source = store.resolve_checkpoint(cfg.trainer.init_from)
            store.verify_checkpoint(init_source)
        if resume_from is not None:
            record = store.read_record(resume_from)
            if record.get("device_type") == device_type and isinstance(record.get("kernels"), dict):
                kept = {str(op): str(backend) for op, backend in record["kernels"].items()}
        return run_dir, resume_from, init_source, kept
    except LoongError as exc:
        return exc


def _configure_kernels(cfg, device_type: str, registry, kept: dict | None) -> None:
    """Resolve the kernel seam for this run; ops left at ``auto`` keep the backends of the
    checkpoint it resumes (``kept``), so that the continuation runs the kernels it started on."""
    from loong_core import kernels

    fresh = kernels.configure(cfg.kernels, device_type, registry, train_steps=cfg.trainer.train_iters)
    if not kept:
        return
    choices = kernels.configure(cfg.kernels, device_type, registry, train_steps=cfg.trainer.train_iters,
                                keep=kept)
    moved = {op: (fresh[op].backend, c.backend) for op, c in choices.items() if c.backend != fresh[op].backend}
    if moved:
        logger.info("kernels: resuming on the checkpoint's backends for ops left at auto (%s); pin "
                    "kernels.<op> to choose otherwise",
                    ", ".join(f"{op}={new} instead of {old}" for op, (old, new) in moved.items()))


def copy_inference_files(data_module, run_dir: Path) -> None:
    """Copy the data module's ``inference_files()`` (its tokenizer...) into ``run_dir/data``."""
    import shutil

    files = getattr(data_module, "inference_files", None)
    for name, source in (files() if files else {}).items():
        target = run_dir / "data" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if Path(source).is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        elif Path(source).is_file():
            shutil.copyfile(source, target)


def _save_config(cfg, run_dir: Path, overrides: list[str]) -> None:
    import dataclasses

    import yaml

    (run_dir / "config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
    (run_dir / "overrides.txt").write_text("\n".join(overrides) + "\n")


def train(overrides: list[str]) -> dict:
    """Run training in this process (one rank of a torchrun job, or the only rank).

    A :class:`~loong_core.reaper.Reaper` watches the process meanwhile: if it dies without
    cleaning up, the helper processes it started die with it.

    Returns:
        The final metrics (on every rank).
    """
    from loong_core.reaper import Reaper

    with Reaper():
        return _train(overrides)


def _train(overrides: list[str]) -> dict:
    import torch

    from loong_core.config.compose import load_config
    from loong_core.data.loader import GlobalBatchLoader
    from loong_core.data.prefetch import PrefetchingLoader
    from loong_core.devices.select import select_device
    from loong_core.plugins import get_plugin_system
    from loong_core.trainer.banner import banner
    from loong_core.trainer.loop import Trainer
    from loong_core.trainer.run_context import RunContext

    cfg = load_config(overrides)
    system = get_plugin_system()
    registry = system.registry()
    local_rank = _env_int("LOCAL_RANK", 0)
    device = select_device(cfg.device.name, local_rank, cfg.device.num_threads, cfg.device.peak_tflops)
    device.setup()
    _init_process_group(device.dist_backend, device)
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    if rank != 0:
        logging.getLogger().setLevel(logging.WARNING)
    plan = _broadcast_object(_start_plan(cfg, device.device_type) if rank == 0 else None)
    if isinstance(plan, Exception):
        raise plan
    run_dir, resume_from, init_source, kept_kernels = plan
    _configure_kernels(cfg, device.device_type, registry, kept_kernels)

    data_module = registry.get("dataset", cfg.data.name).load()(cfg.data)
    provider = registry.get("model", cfg.model.name).load()(cfg.model)
    engine_cls = registry.get("engine", cfg.parallel.engine).load()
    balancer = registry.get("balancer", cfg.data.balancer).load()

    device.manual_seed(cfg.trainer.seed)
    if rank == 0 if cfg.data.shared_cache else local_rank == 0:
        logger.info("preparing data '%s' (the first run builds its cache, later runs reuse it)",
                    cfg.data.name)
        data_module.prepare()
    torch.distributed.barrier()
    data_module.setup()
    provider.apply_data_overrides(data_module.model_overrides())

    if rank == 0:
        logger.info("building model '%s' on the %s engine", cfg.model.name, cfg.parallel.engine)
    engine = engine_cls(cfg, device, provider)
    layout = engine.init_parallel()
    engine.setup()

    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        _save_config(cfg, run_dir, overrides)
        copy_inference_files(data_module, run_dir)
    torch.distributed.barrier()

    t = cfg.trainer
    eval_samples = t.eval_iters * t.global_batch_size if t.eval_interval else 0
    train_set, valid_set = data_module.build(t.train_iters * t.global_batch_size,
                                             max(eval_samples, 1), t.seed)
    cost = data_module.sample_cost if cfg.data.balancer != "none" else None

    def loader(dataset):
        return GlobalBatchLoader(dataset, t.global_batch_size, t.micro_batch_size,
                                 layout.data_parallel_rank, layout.data_parallel_size, balancer, cost,
                                 collate_fn=getattr(data_module, "collate", None))

    run = RunContext(cfg, run_dir, rank, world, layout=layout)
    num_params = engine.num_parameters()
    seq_length = cfg.data.seq_length
    if rank == 0:
        logger.info("%s", banner(cfg, device, layout, num_params, system, run_dir, engine.banner_lines()))
    train_loader = loader(train_set)
    if cfg.data.prefetch:
        train_loader = PrefetchingLoader(train_loader)
    trainer = Trainer(run, engine, train_loader, loader(valid_set) if eval_samples else None,
                      system.hook, device, provider.flops_per_token(seq_length),
                      unit=provider.throughput_unit)
    start = 0
    if resume_from is not None:
        start = trainer.resume(resume_from)
    elif init_source is not None:
        engine.load_model_weights(str(init_source))
        if rank == 0:
            logger.info("initialised model weights from %s", init_source)
    elif t.resume == "auto" and rank == 0:
        logger.info("trainer.resume=auto: no checkpoint in %s, starting fresh", run_dir)
    try:
        metrics = trainer.fit(start)
    finally:
        engine.shutdown()
    metrics["run_dir"] = str(run_dir)
    metrics["num_parameters"] = num_params
    if rank == 0:
        logger.info("done: run directory %s", run_dir)
    return metrics


def train_or_explain(overrides: list[str]) -> dict:
    """:func:`train`, with running out of memory turned into one :class:`TrainingError` that says
    what to shrink (instead of an allocator traceback from deep inside torch)."""
    import re

    from loong_core.errors import TrainingError

    try:
        return train(overrides)
    except (MemoryError, RuntimeError) as exc:
        text = str(exc)
        if not (isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"
                or "can't allocate memory" in text):
            raise
        match = re.search(r"allocate (\d+) bytes", text)
        size = f" (one allocation of {int(match.group(1)) / 2 ** 30:,.1f} GiB)" if match else ""
        raise TrainingError(
            f"out of memory{size}: the model or batch does not fit on this device. Lower the model "
            "sizes (model.hidden_size, model.num_layers, model.ffn_hidden_size, vocabulary and "
            "model.make_vocab_size_divisible_by), trainer.micro_batch_size or data.seq_length, "
            "or shard the model over more ranks."
        ) from None


def check_layout(cfg, world_size: int) -> None:
    """Fail early (before spawning) when the parallel layout cannot fit ``world_size`` ranks."""
    from loong_core.config.rules import check_batch_layout
    from loong_core.engines.megatron.parallel import check_world

    dp = check_world(cfg.parallel, world_size)
    p, t = cfg.parallel, cfg.trainer
    if p.ulysses_size > 1:
        from loong_core.config.ulysses_rules import check_ulysses_world

        dp = check_ulysses_world(p, world_size)
    if p.context_parallel_size > 1:
        from loong_core.engines.megatron.context_parallel import check_seq_length

        check_seq_length(cfg.data.seq_length, p)
    how = (f"{world_size} ranks / (TP {p.tensor_model_parallel_size} x PP "
           f"{p.pipeline_model_parallel_size} x CP {p.context_parallel_size}"
           + (f" x Ulysses {p.ulysses_size})" if p.ulysses_size > 1 else ")"))
    check_batch_layout(t.global_batch_size, t.micro_batch_size, dp, how)
