"""Offline conversion HF <-> loong checkpoint (the work behind ``loong convert``).

``hf-to-loong`` writes an iteration-0 loong checkpoint through the trainer's atomic checkpoint
store. Weights only (the default, for ``trainer.init_from=DST``) at TP1 / PP1 / EP1 it streams: the
model is built on the meta device and every HF tensor is read, transformed and written into the
dist-checkpoint one at a time (:mod:`loong_llm.hf.stream_checkpoint`), in the source's dtype (a
bf16 model stays bf16; an fp32 run loads it as fp32). Other layouts and ``--with-optimizer`` (a
fresh optimizer and LR schedule, for ``trainer.resume=DST``) build the model with the engine, one
process per rank through torchrun when more than one. ``loong-to-hf`` reads any loong checkpoint
tensor by tensor (dist-checkpoint chunks reassembled for a meta TP1 model, so any saved layout
works) and streams safetensors shards out; a LoRA run's checkpoint is loaded into a model to
merge its adapters.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from loong_core.errors import CheckpointError, ConfigError

logger = logging.getLogger(__name__)

HF_FILES = "hf_files"  # tokenizer / generation config of the source, kept inside the checkpoint
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def free_port() -> int:
    """A free TCP port on localhost."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_single_rank():
    """Device backend + a one-rank gloo group (when not launched by torchrun)."""
    import torch

    from loong_core.devices.select import select_device

    if "RANK" not in os.environ:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0",
                          WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    device = select_device("cpu", int(os.environ.get("LOCAL_RANK", 0)), None)
    device.setup()
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(device.dist_backend)
    return device


def _model_entry(family: str):
    from loong_core.plugins import get_plugin_system

    registry = get_plugin_system().registry()
    return registry.get("model", family), registry.get("checkpoint_adapter", family).load()()


def _copy_extra_files(src: Path, dst: Path) -> None:
    """Tokenizer and generation files (everything but weights, their index and config.json)."""
    dst.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.is_file() and not path.name.endswith(_WEIGHT_SUFFIXES) and path.name not in (
                "config.json", "model.safetensors.index.json"):
            shutil.copy2(path, dst / path.name)


def _import_libraries() -> None:
    """Import megatron-core and the engine (seconds of start-up, not of conversion), without
    setting up ``torch.compile`` for megatron-core's fused helpers (a conversion runs none)."""
    from loong_core.engines.megatron.deferred_compile import import_megatron_core

    import_megatron_core("megatron.core.dist_checkpointing", "loong_core.engines.megatron.engine")


# -- HF -> loong ---------------------------------------------------------------------------
def _init_fresh_optimizer_state(optimizer) -> None:
    """Give every parameter the state of an Adam that has not stepped yet (zero moments, step 0),
    so the checkpoint has optimizer state to resume from and resuming equals starting fresh."""
    import torch

    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        init = getattr(opt, "init_state_fn", None)
        if inner is None or init is None or isinstance(inner, torch.optim.SGD):
            continue
        init(inner, getattr(opt, "config", None))
        for state in inner.state.values():
            state.setdefault("step", torch.tensor(0.0))


def schedule_config(overrides: dict | None):
    """``(OptimConfig, TrainerConfig)`` from ``{"optim": {...}, "trainer": {...}}`` (validated)."""
    from loong_core.config.schema import OptimConfig, TrainerConfig
    from loong_core.config.validate import build_dataclass

    overrides = overrides or {}
    unknown = set(overrides) - {"optim", "trainer"}
    if unknown:
        raise ConfigError(f"only optim.* and trainer.* overrides are allowed here, not {sorted(unknown)}.")
    return (build_dataclass(OptimConfig, overrides.get("optim", {}), "optim"),
            build_dataclass(TrainerConfig, overrides.get("trainer", {}), "trainer"))


class _Streaming:
    """Weights only, never holding the model: a meta-device model gives the checkpoint's
    structure and each parameter is made from the HF files as the writer reaches it."""

    def __init__(self, config, device, provider, dtype):
        self.config, self.device, self.provider, self.dtype = config, device, provider, dtype

    def init_parallel(self):
        from loong_core.engines.megatron import parallel

        parallel.initialize(self.config.parallel, self.config.trainer.seed)

    def setup(self):
        from loong_llm.hf.stream_checkpoint import build_meta_model

        self.chunk = build_meta_model(self.provider, self.config.parallel, self.dtype)
        self.parts = self.provider.hf_parts([self.chunk])

    def save_checkpoint(self, directory, common_state):
        from loong_llm.hf.layout import layout_of, write_layout
        from loong_llm.hf.stream_checkpoint import save_streaming

        hashed = save_streaming(self.chunk, lambda local: self.parts.part((0, local)), directory,
                                common_state)
        write_layout(directory, layout_of(self.chunk))  # loong-to-hf reads it without a model
        logger.info("streamed %.1f MB from %s", self.parts.reader.bytes_read / 1e6,
                    self.parts.hf_dir)
        return hashed

    def rng_state(self):
        from megatron.core import tensor_parallel

        return {"tracker": tensor_parallel.get_cuda_rng_tracker().get_states()}

    def shutdown(self):
        from megatron.core import parallel_state as ps

        ps.destroy_model_parallel()


def can_stream(provider, tp: int, pp: int, ep: int, model_only: bool) -> bool:
    """Whether ``hf-to-loong`` streams (weights only, one rank, a provider with ``hf_parts``)."""
    return model_only and tp * pp * ep == 1 and hasattr(provider, "hf_parts")


class _ModelOnly:
    """Just the model chunks (no DDP buffers, no optimizer), in the source's dtype: a checkpoint
    for ``init_from`` at any layout."""

    def __init__(self, config, device, provider, dtype):
        self.config, self.device, self.provider, self.dtype = config, device, provider, dtype

    def init_parallel(self):
        from loong_core.engines.megatron import parallel

        parallel.initialize(self.config.parallel, self.config.trainer.seed)

    def setup(self):
        from megatron.core import parallel_state as ps

        from loong_core.engines.megatron import parallel

        mcfg = self.provider.megatron_config(parallel.transformer_kwargs(self.config.parallel))
        mcfg.params_dtype = self.dtype
        # perform_initialization stays on: megatron-core marks the TP attributes of a parameter
        # (which the HF loader shards by) only while initialising it
        self.chunk = self.provider.build_megatron_model(
            mcfg, ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage(), None)
        self.provider.initialize_weights([self.chunk])

    def save_checkpoint(self, directory, common_state):
        from megatron.core import dist_checkpointing

        dist_checkpointing.save({"model": self.chunk.sharded_state_dict(), "loong": common_state},
                                directory)

    def rng_state(self):
        from megatron.core import tensor_parallel

        return {"tracker": tensor_parallel.get_cuda_rng_tracker().get_states()}

    def shutdown(self):
        from megatron.core import parallel_state as ps

        ps.destroy_model_parallel()


def hf_to_loong_rank(family: str, src: str, dst: str, tp: int, pp: int, ep: int,
                     schedule: dict | None = None, model_only: bool = False) -> None:
    """One rank of ``hf-to-loong`` (every rank of the job calls it). ``schedule`` holds the
    ``optim`` / ``trainer`` settings whose LR schedule the checkpoint stores (a resumed run
    continues that schedule); ``model_only`` skips DDP buffers and optimizer state (less memory;
    the checkpoint then serves ``trainer.init_from`` only)."""
    import numpy as np
    import torch

    from loong_core.checkpoint import store
    from loong_core.config.schema import LoongConfig, ParallelConfig
    from loong_core.engines.megatron.engine import MegatronEngine
    from loong_llm.hf.adapter import read_hf_config
    from loong_llm.hf.io import SafetensorsReader

    device = _init_single_rank()
    entry, _ = _model_entry(family)
    cfg = entry.load_meta("config")(name=family, init_from_hf=str(src))
    provider = entry.load()(cfg)  # reads config.json into cfg
    optim, trainer = schedule_config(schedule)
    config = LoongConfig(name=f"convert_{family}", model=cfg, optim=optim, trainer=trainer,
                         parallel=ParallelConfig(tensor_model_parallel_size=tp,
                                                 pipeline_model_parallel_size=pp,
                                                 expert_model_parallel_size=ep))
    hf_dtype = SafetensorsReader(src).dtype()
    if can_stream(provider, tp, pp, ep, model_only):
        engine = _Streaming(config, device, provider, getattr(torch, hf_dtype))
    else:
        engine = (_ModelOnly(config, device, provider, getattr(torch, hf_dtype)) if model_only
                  else MegatronEngine(config, device, provider))
    engine.init_parallel()
    engine.setup()  # builds the chunks and loads the HF weights into them
    if not model_only:
        _init_fresh_optimizer_state(engine.optimizer)
    rank = torch.distributed.get_rank()
    model = {**dataclasses.asdict(cfg), "init_from_hf": None}
    record = {
        "layout": {"world_size": torch.distributed.get_world_size(), "tp": tp, "pp": pp,
                   "vpp": None, "ep": ep},
        "name": config.name, "model": model, "hf_config": read_hf_config(src),
        "hf_dtype": hf_dtype, "converted_from": str(Path(src).resolve()),
        "model_only": model_only,
    }
    rng = {"python": random.getstate(), "numpy": np.random.get_state(),
           "torch": torch.get_rng_state(), "device": device.rng_state(),
           "engine": engine.rng_state()}
    dst_path = Path(dst)
    staging = dst_path.with_name(dst_path.name + ".converting")
    common = {"iteration": 0, "consumed_samples": 0}
    final = store.save_collective(staging, 0, lambda d: engine.save_checkpoint(d, common),
                                  record, rng)
    if rank == 0:
        _copy_extra_files(Path(src), final / HF_FILES)
        if dst_path.exists():
            shutil.rmtree(dst_path)
        os.replace(final, dst_path)
        shutil.rmtree(staging, ignore_errors=True)
    torch.distributed.barrier()
    engine.shutdown()


def hf_to_loong(family: str, src: str, dst: str, tp: int = 1, pp: int = 1, ep: int = 1,
                schedule: dict | None = None, model_only: bool = False) -> dict:
    """Convert an HF directory into a loong checkpoint at ``dst`` (torchrun for > 1 rank).

    ``schedule``: ``{"optim": {...}, "trainer": {...}}`` settings of the stored LR schedule
    (see :func:`hf_to_loong_rank`).

    Returns:
        ``{"seconds", "bytes", "overrides"}``: wall time, bytes of HF tensors, and the
        ``loong train`` overrides that describe the model.
    """
    from loong_llm.hf.io import SafetensorsReader

    src_path = Path(src)
    entry, adapter = _model_entry(family)
    adapter.check_model_type(json.loads((src_path / "config.json").read_text())
                             if (src_path / "config.json").is_file() else {},
                             str(src_path / "config.json"))
    reader = SafetensorsReader(src_path)
    total = sum(reader.get_size(k) for k in reader.keys())
    schedule_config(schedule)  # fail before spawning
    _import_libraries()
    started = time.perf_counter()  # the conversion itself (the libraries' import is start-up)
    world = tp * pp * ep
    if world == 1:
        hf_to_loong_rank(family, src, dst, 1, 1, 1, schedule, model_only)
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
               "--master-port", str(free_port()), "-m", "loong_llm.hf.convert", "hf-to-loong-rank",
               family, str(src), str(dst), str(tp), str(pp), str(ep),
               "--schedule", json.dumps(schedule or {}), *(["--model-only"] if model_only else [])]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        result = subprocess.run(cmd, env=env)
        if result.returncode:
            raise CheckpointError(f"conversion failed on {world} ranks (exit {result.returncode}): "
                                  f"{' '.join(cmd)}")
    record = json.loads((Path(dst) / "loong_complete.json").read_text())
    return {"seconds": time.perf_counter() - started, "bytes": total,
            "overrides": model_overrides(record["model"], entry.load_meta("config"))}


def model_overrides(model: dict, config_class) -> list[str]:
    """``model=NAME model.key=value ...`` for the fields that differ from the class defaults."""
    defaults = dataclasses.asdict(config_class())
    out = [f"model={model['name']}"]

    def walk(prefix, value, default):
        if isinstance(value, dict):
            for key, sub in value.items():
                walk(f"{prefix}.{key}", sub, (default or {}).get(key))
        elif value != default and prefix != "model.name":
            out.append(f"{prefix}={json.dumps(value, separators=(',', ':')) if isinstance(value, list) else value}")

    walk("model", model, defaults)
    return out


# -- loong -> HF ---------------------------------------------------------------------------
def _model_config_of(src: Path, record: dict | None = None
                     ) -> tuple[dict, dict | None, str | None, Path | None]:
    """``(model config, HF config.json base, HF dtype, source HF files)`` of a checkpoint.

    Args:
        src: The checkpoint directory.
        record: Its completion record, when the caller verifies the files itself; None: every
            file's size and checksum is verified here first.
    """
    if record is None:
        from loong_core.checkpoint import store

        record = store.verify_checkpoint(src)
    if "model" in record:
        files = src / HF_FILES
        return (record["model"], record.get("hf_config"), record.get("hf_dtype"),
                files if files.is_dir() else None)
    run_config = src.parent.parent / "config.yaml"
    if not run_config.is_file():
        raise ConfigError(f"{src} does not say which model it holds: neither its completion record "
                          f"nor {run_config} (the run's config) has a model section.")
    import yaml

    model = yaml.safe_load(run_config.read_text())["model"]
    hf_dir = model.get("init_from_hf")
    if hf_dir and (Path(hf_dir) / "config.json").is_file():
        from loong_llm.hf.io import SafetensorsReader

        base = json.loads((Path(hf_dir) / "config.json").read_text())
        return model, base, SafetensorsReader(hf_dir).dtype(), Path(hf_dir)
    return model, None, None, None


def loong_to_hf(src: str, dst: str, dtype: str | None = None) -> dict:
    """Write the loong checkpoint ``src`` as an HF directory ``dst`` (one process). Every file
    of ``src`` is checked against its completion record while the export runs; the files
    appear in ``dst`` only once the check passed. A checkpoint that stores its tensor layout
    (:mod:`loong_llm.hf.layout`, written by ``hf-to-loong``) is read without megatron-core.

    Returns:
        ``{"seconds", "bytes"}``.
    """
    from loong_core.checkpoint import integrity, store
    from loong_core.config.validate import build_dataclass
    from loong_core.plugins import get_plugin_system
    from loong_llm.hf.layout import read_layout

    src_path = store.resolve_checkpoint(src)  # a run directory: its newest checkpoint
    record = store.read_record(src_path)
    model_dict, hf_base, hf_dtype, extra = _model_config_of(src_path, record)
    entry, adapter = _model_entry(model_dict["name"])
    # the registry resolves nested components (a VLM's encoder / projector / foundation)
    cfg = build_dataclass(entry.load_meta("config"), {**model_dict, "init_from_hf": None}, "model",
                          get_plugin_system().registry())
    lora = getattr(cfg, "lora", None) or getattr(getattr(cfg, "foundation", None), "lora", None)
    merge = lora is not None and lora.enabled  # a VLM's LoRA lives in its foundation's config
    layout = None if merge else read_layout(src_path)
    if layout is None:
        _import_libraries()
    else:  # the checkpoint's tensor index is torch.distributed.checkpoint's metadata
        import torch.distributed.checkpoint.metadata  # noqa: F401
    started = time.perf_counter()  # the conversion itself (the libraries' import is start-up)
    # every file's size and checksum, checked while the export reads (nothing is published
    # before the check passed; the readers never run code from a file, damaged or not)
    verifying = integrity.BackgroundVerify(src_path, record)
    staging = Path(dst).with_name(Path(dst).name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    out_dtype = dtype or hf_dtype or "bfloat16"
    try:
        written = _export(entry, adapter, cfg, src_path, staging, out_dtype, hf_base, layout, merge)
        verifying.wait()
        Path(dst).mkdir(parents=True, exist_ok=True)
        for path in staging.iterdir():
            os.replace(path, Path(dst) / path.name)
    except Exception:
        verifying.wait()  # a damaged file fails here too: its checksum error names it plainly
        raise
    finally:
        verifying.join()
        shutil.rmtree(staging, ignore_errors=True)
    from loong_llm.hf.export_files import apply_umask, run_tokenizer_dir, write_support_files

    write_support_files(Path(dst), [extra, run_tokenizer_dir(src_path)],
                        getattr(cfg, "max_position_embeddings", None))
    apply_umask(Path(dst))
    return {"seconds": time.perf_counter() - started, "bytes": written}


def _export(entry, adapter, cfg, src_path: Path, out: Path, dtype: str, hf_base: dict | None,
            layout: dict | None, merge: bool) -> int:
    """Weights + config.json of the checkpoint ``src_path`` into ``out``; returns bytes written.
    With ``layout`` nothing of megatron-core is used; without, a meta model (or, to merge LoRA
    adapters, a real one) gives the structure."""
    from loong_llm.hf.export import export_state
    from loong_llm.hf.stream_checkpoint import StreamedState

    if layout is None:
        import torch

        from loong_core.config.schema import ParallelConfig
        from loong_core.engines.megatron import parallel
        from loong_llm.hf.layout import layout_of
        from loong_llm.hf.stream_checkpoint import build_meta_model

        _init_single_rank()
        provider = entry.load()(cfg)
        p = ParallelConfig()
        parallel.initialize(p, seed=0)
        try:
            if merge:
                return _export_merged_lora(provider, p, adapter, cfg, src_path, out, dtype, hf_base)
            layout = layout_of(build_meta_model(provider, p, torch.float32))
        finally:
            parallel_state_destroy()
    state = StreamedState(layout, src_path)
    try:
        return export_state(adapter, cfg, state, out, dtype, hf_base)
    finally:
        state.close()


def parallel_state_destroy() -> None:
    """Drop megatron-core's process groups (a later conversion in this process starts clean)."""
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()


def _export_merged_lora(provider, p, adapter, cfg, src_path: Path, dst: str, dtype: str,
                        hf_base: dict | None) -> int:
    """A LoRA run's checkpoint: load it into a real one-rank model, merge ``W + alpha/r * B A``
    and export that (the adapters exist only in a built model)."""
    import torch

    from loong_core.checkpoint.restricted import mcore_load
    from loong_core.engines.megatron import parallel
    from loong_llm.hf.export import export_state
    from loong_llm.lora import merge_lora

    model = provider.build_megatron_model(provider.megatron_config(parallel.transformer_kwargs(p)),
                                          pre_process=True, post_process=True, vp_stage=None)
    provider.attach_adapters([model])
    loaded = mcore_load({"model": model.sharded_state_dict()}, src_path)
    model.load_state_dict(loaded["model"], strict=True)
    merge_lora(model)
    with torch.no_grad():
        return export_state(adapter, cfg, model.state_dict(), dst, dtype, hf_base)


def main(argv: list[str] | None = None) -> int:
    """``python -m loong_llm.hf.convert hf-to-loong-rank FAMILY SRC DST TP PP EP`` (torchrun)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["hf-to-loong-rank"])
    parser.add_argument("family")
    parser.add_argument("src")
    parser.add_argument("dst")
    parser.add_argument("tp", type=int)
    parser.add_argument("pp", type=int)
    parser.add_argument("ep", type=int)
    parser.add_argument("--schedule", default="{}", help="JSON of optim / trainer settings")
    parser.add_argument("--model-only", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if os.environ.get("RANK", "0") == "0" else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    hf_to_loong_rank(args.family, args.src, args.dst, args.tp, args.pp, args.ep,
                     json.loads(args.schedule), args.model_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
