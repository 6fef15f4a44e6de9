"""The training loop. It calls interfaces only: engine, data loader, sinks, lifecycle hooks."""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from pathlib import Path

import numpy as np
import torch

from loong_core import kernels
from loong_core.checkpoint import store
from loong_core.checkpoint.async_save import AsyncCheckpointer
from loong_core.errors import CheckpointError, CheckpointSaveError, TrainingError
from loong_core.trainer.metrics import MetricsWriter
from loong_core.trainer.nonfinite import NonFiniteGuard
from loong_core.trainer.preemption import SignalStop
from loong_core.trainer.profiling import StepProfiler
from loong_core.trainer.progress import Progress
from loong_core.trainer.straggler import StragglerMonitor
from loong_core.trainer.throughput import Throughput

logger = logging.getLogger(__name__)


class Trainer:
    """Runs ``train_iters`` optimizer steps with evaluation, logging and checkpoints.

    Args:
        run: The :class:`~loong_core.trainer.run_context.RunContext`.
        engine: A set-up :class:`~loong_core.engines.base.Engine`.
        train_loader: :class:`~loong_core.data.loader.GlobalBatchLoader` over the train split.
        valid_loader: Loader over the validation split, or None.
        hooks: The plugin hook relay.
        device: The device backend.
        flops_per_token: Training FLOPs per token (per item of ``unit``) of the whole model,
            for MFU; 0 when unknown (no MFU shown).
        unit: What the engine's ``tokens`` count: ``tokens``, ``samples`` or ``frames``
            (``ModelProvider.throughput_unit``).
    """

    def __init__(self, run, engine, train_loader, valid_loader, hooks, device, flops_per_token,
                 unit: str = "tokens"):
        self.run, self.engine, self.hooks, self.device = run, engine, hooks, device
        self.train_loader, self.valid_loader = train_loader, valid_loader
        self.cfg = run.config.trainer
        self.flops_per_token = flops_per_token
        self.checkpoint_root = run.run_dir / "checkpoints"
        self.is_logger = run.layout.is_logging_rank
        self.metrics = MetricsWriter(run.run_dir, self.cfg.tensorboard) if self.is_logger else None
        self._last_saved = -1  # the newest step saved, or being saved (trainer.async_save)
        self._committed = -1  # the newest step whose checkpoint is complete
        # Seconds the loop was blocked by the checkpoint being saved, and by the last one completed
        # (for an asynchronous one: taking the snapshot, the checks at later steps, the commit).
        self._stall = self.last_save_stall = 0.0
        # The parts of an asynchronous save's stall (snapshot, checks, waiting for the write, commit)
        self._stall_parts: dict[str, float] = {}
        self._progress: Progress | None = None  # where saves are noted, during fit()
        self.async_saves = AsyncCheckpointer(self.checkpoint_root, device.torch_device) if self.cfg.async_save else None
        # Steps whose update the optimizer skipped (an fp16 overflow, or a non-finite loss when the
        # run continues past it); saved with checkpoints so a resumed run keeps counting.
        self.skipped_steps = 0
        self.save_failures = 0  # checkpoints the storage refused (a full disk): logged, run goes on
        self.nonfinite = NonFiniteGuard(self.cfg.exit_on_nan)
        self.last_eval_metrics: dict[str, float] = {}
        peak = device.peak_flops(engine.compute_dtype)
        self._peak = peak * run.world_size if peak else None  # None: unknown peak, no MFU
        self.throughput = Throughput(unit, flops_per_token, self._peak)
        self.profiler = StepProfiler(self.cfg, run.run_dir, run.rank, run.world_size, device.profiler_activities())
        self.straggler = None
        if run.world_size > 1 and self.cfg.straggler_factor > 0:
            self.straggler = StragglerMonitor(getattr(engine, "model", None), device, self.cfg.straggler_factor,
                                              run.config.parallel.pipeline_model_parallel_size)

    # -- state ---------------------------------------------------------------------------------
    def _rng_state(self) -> dict:
        return {"python": random.getstate(), "numpy": np.random.get_state(),
                "torch": torch.get_rng_state(), "device": self.device.rng_state(),
                "engine": self.engine.rng_state()}

    def _set_rng_state(self, state: dict) -> None:
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        self.device.set_rng_state(state["device"])
        self.engine.set_rng_state(state["engine"])

    def resume(self, path: Path) -> int:
        """Load a checkpoint; returns the iteration to continue from."""
        record = store.read_record(path)
        if record.get("model_only"):
            raise CheckpointError(
                f"{path} holds model weights only (no optimizer or schedule), so it cannot be "
                f"resumed: start from it with trainer.init_from={path} instead."
            )
        from torch.distributed.checkpoint.api import CheckpointException

        try:
            common = self.engine.load_checkpoint(str(path))
        except CheckpointError:
            raise
        except (Exception, CheckpointException) as exc:  # torch's derives from BaseException
            older = [p.name for p in store.list_checkpoints(path.parent) if p != path]
            raise CheckpointError(
                f"could not load checkpoint {path}: {type(exc).__name__}: {exc}. It may be corrupt "
                f"or from another model. Resume from an older one with trainer.resume=<dir> "
                f"(complete ones here: {', '.join(older) or 'none'}) or start fresh with trainer.resume=none."
            ) from exc
        if common.get("iteration") != record["iteration"]:
            raise CheckpointError(f"{path}: completion record and checkpoint state disagree.")
        rng = store.load_rng(path, self.run.rank)
        if rng is not None and record.get("layout") == self._layout_record():
            self._set_rng_state(rng)
        else:
            logger.warning("checkpoint %s was written with another parallel layout; RNG state "
                           "is reseeded instead of restored", path)
        self.skipped_steps = int(common.get("skipped_steps", 0))
        logger.info("resumed from %s at iteration %d", path, record["iteration"])
        self._last_saved = self._committed = int(record["iteration"])
        self.nonfinite.last_good = path
        return int(record["iteration"])

    def _layout_record(self) -> dict:
        p = self.run.config.parallel
        return {"world_size": self.run.world_size, "tp": p.tensor_model_parallel_size,
                "pp": p.pipeline_model_parallel_size, "vpp": p.virtual_pipeline_model_parallel_size,
                "ep": p.expert_model_parallel_size}

    def save(self, iteration: int, last: bool = False) -> Path | None:
        """Write an atomic checkpoint of the state after ``iteration`` steps (finite weights only).

        A save the storage refuses (a full disk, a quota) leaves nothing behind and the earlier
        checkpoints intact (:func:`~loong_core.checkpoint.store.save_collective`); it is logged
        as an error, counted in the ``checkpoint_save_failures`` metric, and training goes on
        with its state in memory. ``last``: the run ends after this save (the final one, or on
        SIGTERM), so the failure is a :class:`TrainingError` instead.

        Returns:
            The checkpoint, or None when the storage refused it.
        """
        if self.async_saves is not None:
            self.finish_async_save(iteration)  # a second save waits for the first
        started = time.perf_counter()
        self.nonfinite.check_weights(iteration, self.engine)
        common = {"iteration": iteration, "consumed_samples": iteration * self.cfg.global_batch_size,
                  "skipped_steps": self.skipped_steps}
        record = {"layout": self._layout_record(), "name": self.run.config.name,
                  "kernels": kernels.resolved(), "device_type": self.device.device_type}
        if self.async_saves is not None and not last:  # the last one is written synchronously
            self._last_saved = iteration
            try:
                self.async_saves.start(iteration, lambda d: self.engine.save_checkpoint_async(d, common),
                                       record, self._rng_state())
            except CheckpointSaveError as exc:
                self._refused(exc, iteration, last)
            self._stall = time.perf_counter() - started
            self._stall_parts = {"snapshot": self._stall}
            return None
        self._last_saved = iteration
        try:
            path = store.save_collective(
                self.checkpoint_root, iteration,
                lambda directory: self.engine.save_checkpoint(directory, common),
                record=record, rng_state=self._rng_state(),
            )
        except CheckpointSaveError as exc:
            self._refused(exc, iteration, last)
            return None
        self._stall = time.perf_counter() - started
        self._saved(iteration, path)
        return path

    def finish_async_save(self, iteration: int, wait: bool = True) -> Path | None:
        """Commit the asynchronous checkpoint in flight (``trainer.async_save``; collective).

        Args:
            iteration: The step the loop is at (for messages).
            wait: Block until it is written; False: commit only if every rank has finished
                writing (the check at the start of a step).

        Returns:
            The committed checkpoint, or None (nothing in flight, still writing, or refused).
        """
        if self.async_saves is None or self.async_saves.in_flight is None:
            return None
        saving, started = self.async_saves.in_flight, time.perf_counter()
        self.async_saves.last_write_wait_s = 0.0
        try:
            path = self.async_saves.wait() if wait else self.async_saves.poll()
        except CheckpointSaveError as exc:
            self._refused(exc, iteration, last=False)
            return None
        finally:
            spent = time.perf_counter() - started
            self._stall += spent
            waited = self.async_saves.last_write_wait_s
            parts = self._stall_parts
            if self.async_saves.in_flight is None:  # this call committed (or failed) the save
                parts["waiting for the write"] = parts.get("waiting for the write", 0.0) + waited
                parts["commit"] = parts.get("commit", 0.0) + spent - waited
            else:
                parts["checks"] = parts.get("checks", 0.0) + spent
        if path is not None:
            self._saved(saving, path)
        return path

    def _saved(self, iteration: int, path: Path) -> None:
        self.last_save_stall, self._stall = self._stall, 0.0
        parts, self._stall_parts = self._stall_parts, {}
        self._committed = iteration
        self.nonfinite.last_good = path
        self.hooks.loong_on_checkpoint_saved(run=self.run, step=iteration, path=str(path))
        if self._progress is not None:
            detail = "".join(f", {name} {seconds:.2f}" for name, seconds in parts.items())
            self._progress.note(f"saved checkpoint {path} (training blocked {self.last_save_stall:.2f} s"
                                f"{': ' + detail[2:] if detail else ''})")

    def _refused(self, exc: CheckpointSaveError, iteration: int, last: bool) -> None:
        """A save the storage refused: the run stops (``last``) or logs it and goes on."""
        self.save_failures += 1
        self._last_saved = self._committed
        if last:
            raise TrainingError(f"{exc} The run stopped without its last checkpoint; trainer.resume=auto "
                                "continues from the newest complete one.") from None
        if self.is_logger:
            logger.error("%s Training continues%s.", exc, self._next_save_note(iteration))

    def _next_save_note(self, iteration: int) -> str:
        interval = self.cfg.save_interval
        nxt = (iteration // interval + 1) * interval if interval else self.cfg.train_iters
        return f"; the next save is at step {min(nxt, self.cfg.train_iters)}" if nxt > iteration else ""

    # -- loop ----------------------------------------------------------------------------------
    def evaluate(self, step: int) -> float:
        """Mean validation loss over ``eval_iters`` global batches.

        Further metrics the model reports (``ModelProvider.reported_metrics``, for example
        accuracy) are averaged over the batches weighted by their loss tokens and written with it.
        """
        total, tokens = 0.0, 0.0
        extra: dict[str, float] = {}
        for k in range(self.cfg.eval_iters):
            result = self.engine.eval_step(self.valid_loader.micro_batches(k))
            total += result.loss * result.tokens
            tokens += result.tokens
            for name, value in (result.extra or {}).items():
                extra[name] = extra.get(name, 0.0) + value * result.tokens
        loss = total / tokens if tokens else float("nan")
        extra = {name: value / tokens for name, value in extra.items()} if tokens else {}
        self.last_eval_metrics = extra
        if self.metrics is not None:
            self.metrics.write(step, {"loss": loss, "ppl": math.exp(min(loss, 50)), **extra}, split="valid")
        if tokens:
            self.nonfinite.check_validation(step, loss)
        return loss

    def _load_ahead(self, iteration: int):
        """While the step runs, load the batches of ``iteration`` (``data.prefetch``): a
        :class:`~loong_core.data.prefetch.PrefetchingLoader` train loader, not the last step."""
        if not hasattr(self.train_loader, "overlap") or iteration >= self.cfg.train_iters:
            return contextlib.nullcontext()
        return self.train_loader.overlap(iteration)

    def _extra_note(self) -> str:
        return "".join(f", {name} {value:.4f}" for name, value in self.last_eval_metrics.items())

    def fit(self, start_iteration: int = 0) -> dict:
        """Train from ``start_iteration`` to ``train_iters``; returns the last metrics."""
        cfg = self.cfg
        self.run.iteration = start_iteration
        progress = Progress(cfg.train_iters, start_iteration, self.is_logger, cfg.progress_bar,
                            unit=self.throughput.unit, show_mfu=self.throughput.reports_mfu)
        self._progress = progress
        if self.metrics is not None:
            self.metrics.start(start_iteration)
        self.hooks.loong_on_train_start(run=self.run)
        metrics: dict = {}
        signals, stopped = SignalStop(cfg.save_on_signal), None
        signals.install()
        try:
            if self.valid_loader is not None and cfg.eval_at_start and start_iteration == 0:
                progress.note(f"step 0: validation loss {self.evaluate(0):.4f}{self._extra_note()}")
            for iteration in range(start_iteration, cfg.train_iters):
                step = iteration + 1
                log_now = step % cfg.log_interval == 0 or step == cfg.train_iters
                self.finish_async_save(iteration, wait=False)
                self.profiler.before_step(step)
                if self.straggler is not None:
                    self.straggler.start(measure=log_now)
                asked = time.perf_counter()
                with self.profiler.step_scope(step, "data"):
                    micro_batches = self.train_loader.micro_batches(iteration)
                data_wait = time.perf_counter() - asked
                if self.straggler is not None:
                    self.straggler.batch_loaded()
                self.device.synchronize()
                with self._load_ahead(step), self.profiler.step_scope(step, "train_step"):
                    started = time.perf_counter()
                    result = self.engine.train_step(micro_batches)
                    self.device.synchronize()
                    elapsed = time.perf_counter() - started
                data_wait += time.perf_counter() - started - elapsed  # the next batch not loaded yet
                self.nonfinite.check_step(step, result)
                self.run.iteration = step
                if result.skipped:
                    self.skipped_steps += 1
                self.throughput.add(result.tokens if result.items is None else result.items, elapsed)
                metrics = {
                    "loss": result.loss, "lr": result.lr, "grad_norm": result.grad_norm,
                    **self.throughput.averages(), "step_time": elapsed, "data_wait": data_wait,
                    "skipped_steps": self.skipped_steps,
                    **({"checkpoint_save_failures": self.save_failures} if self.save_failures else {}),
                    **(result.extra or {}), **self.device.memory_stats(),
                }
                stats = getattr(self.train_loader, "last_balance_stats", None)
                if stats is not None:
                    metrics.update(stats.metrics())
                if self.straggler is not None and log_now:
                    metrics.update(self.straggler.report(step))
                progress.update(step, metrics, log_line=log_now)
                self.profiler.after_step(step)
                if log_now:
                    if self.metrics is not None:
                        self.metrics.write(step, metrics)
                    self.hooks.loong_on_log_step(run=self.run, step=step, metrics=metrics)
                    self.throughput.reset()
                if self.valid_loader is not None and cfg.eval_interval and step % cfg.eval_interval == 0:
                    valid = self.evaluate(step)
                    metrics["valid_loss"] = valid
                    progress.note(f"step {step}: validation loss {valid:.4f}{self._extra_note()}")
                if cfg.save_interval and step % cfg.save_interval == 0 and step != cfg.train_iters:
                    self.save(step)
                if signals.requested(self.device):  # trainer.save_on_signal: every rank, same step
                    path = self.finish_async_save(step)
                    path = self.save(step, last=True) if self._last_saved != step else path
                    progress.note(f"SIGTERM: stopped after step {step}"
                                  + (f", saved checkpoint {path}" if path else "")
                                  + "; continue with trainer.resume=auto")
                    stopped = step
                    break
            if stopped is None and self.valid_loader is not None and cfg.eval_interval and "valid_loss" not in metrics:
                metrics["valid_loss"] = self.evaluate(cfg.train_iters)
                progress.note(f"final validation loss {metrics['valid_loss']:.4f}{self._extra_note()}")
            self.finish_async_save(cfg.train_iters)  # the checkpoint in flight is complete before the end
            if stopped is None and (cfg.save_at_end or cfg.save_interval):
                if self._last_saved != cfg.train_iters:
                    self.save(cfg.train_iters, last=True)
        finally:
            self.profiler.finish()  # a run shorter than the recorded steps, or one that failed
            if self.async_saves is not None:
                self.async_saves.abort()  # only when failing: no commit, its writers ended
            signals.uninstall()
            progress.close()
            self._progress = None
            if self.metrics is not None:
                self.metrics.close()
        self.hooks.loong_on_train_end(run=self.run, metrics=metrics)
        return metrics
