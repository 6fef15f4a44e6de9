"""Hook specifications: the whole contract between loong's core and its plugins.

A plugin is a module named by an entry point in the group ``loong`` (for example
``llm = "loong_llm.plugin"``). It implements any of the hooks below with the ``hookimpl`` marker::

    from loong_core.hookspecs import hookimpl

    @hookimpl
    def loong_register_models(register):
        register("llama", "my_pkg.model:LlamaProvider", config="my_pkg.config:LlamaConfig")

Registration hooks receive a ``register`` callable and record *names* with lazy
``"module:attr"`` references. Nothing heavy (torch, megatron-core, transformers) may be imported
while a registration hook runs: the referenced object is imported only when something is built.
Every registration hook is called once per process, when the plugin manager is created; the
registered names of all plugins together form the registries (see :mod:`loong_core.plugins`).
A name registered twice in one kind is an error naming both distributions.

Lifecycle hooks are called by the trainer on every rank; they must not change the training
state. Their return values are ignored.
"""

from __future__ import annotations

from typing import Any

import pluggy

PROJECT_NAME = "loong"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# --------------------------------------------------------------------------------------------
# Registration hooks. ``register(name, target, **meta)``: ``name`` is what users write in YAML,
# ``target`` a ``"module:attr"`` string imported on first use, ``meta`` free keyword metadata
# (for example ``config="module:ConfigClass"`` or ``description="..."``).
# --------------------------------------------------------------------------------------------


@hookspec
def loong_register_models(register: Any) -> None:
    """Register model components (kind ``model``).

    Called once when plugins load. ``target`` is a model provider class: it is constructed with
    the validated model config and builds the module for the engine (see
    :class:`loong_core.engines.model_provider.ModelProvider`). ``meta``: ``config`` is the
    ``"module:Class"`` of the component's config dataclass (validated before anything is built),
    ``engines`` a tuple of engine names the model supports, ``description`` one line of text.

    Args:
        register: Callable ``register(name, target, **meta)``.
    """


@hookspec
def loong_register_engines(register: Any) -> None:
    """Register engines / parallel strategies (kind ``engine``), for example ``megatron``.

    ``target`` is an engine class constructed as ``Engine(config, device, model_provider,
    data_module)`` by the trainer; it owns process groups, model wrapping, optimizer,
    scheduler, forward/backward and checkpoint I/O (see :class:`loong_core.engines.base.Engine`).

    Args:
        register: Callable ``register(name, target, **meta)``.
    """


@hookspec
def loong_register_balancers(register: Any) -> None:
    """Register data balancers (kind ``balancer``).

    ``target`` is a pure function ``balance(costs: Sequence[float], num_ranks: int) ->
    list[list[int]]`` that assigns the sample indices of one global batch to data-parallel
    ranks: every index appears exactly once and every rank gets the same number of samples
    (pipeline schedules need equal micro-batch counts); balancing chooses which samples share a
    rank. See ``docs/balancers.md``.

    Args:
        register: Callable ``register(name, target, **meta)``.
    """


@hookspec
def loong_register_datasets(register: Any) -> None:
    """Register datasets (kind ``dataset``).

    ``target`` is a data-module class constructed with its validated config (``meta['config']``
    names its dataclass); see :class:`loong_core.data.module.DataModule` for its methods.

    Args:
        register: Callable ``register(name, target, **meta)``.
    """


@hookspec
def loong_register_devices(register: Any) -> None:
    """Register device backends (kind ``device``), for example ``cpu`` and ``cuda``.

    ``target`` is a :class:`loong_core.devices.base.DeviceBackend` subclass meeting the device
    contract of ``docs/devices.md`` (check it with :mod:`loong_core.testing_devices`).
    ``meta['priority']`` (int, higher wins) orders backends when the device is chosen
    automatically; the backend's ``is_available()`` decides whether it can be chosen.

    Args:
        register: Callable ``register(name, target, **meta)``.
    """


@hookspec
def loong_register_kernels(register: Any) -> None:
    """Register kernels (kind ``kernel``), named ``"<op>:<backend>"``.

    ``target`` is the kernel callable; ``meta['reference']`` names its torch reference and
    ``meta['available']`` a ``"module:attr"`` predicate telling whether it runs on this machine.
    The op names and signatures are those of ``loong_core.kernels.reference`` (``attention``:
    ``loong_core.kernels.attention``); the backend is what ``kernels.<op>=<backend>`` selects.
    Optional ``meta['auto_on']`` (device types, for example ``("cuda",)``) and
    ``meta['auto_priority']`` (int, highest wins) let ``kernels.<op>=auto`` pick the backend on
    those devices; without them only ``triton`` is preferred, on ``cuda``. See ``docs/kernels.md``.

    Args:
        register: Callable ``register(name, target, **meta)``.
    """


@hookspec
def loong_register_checkpoint_adapters(register: Any) -> None:
    """Register checkpoint adapters between Hugging Face and loong (kind ``checkpoint_adapter``).

    The name is a model family (for example ``llama``); ``target`` is an adapter class with
    ``hf_to_loong`` and ``loong_to_hf`` conversions.

    Args:
        register: Callable ``register(name, target, **meta)``.
    """


@hookspec
def loong_register_cli_commands(register: Any) -> None:
    """Register ``loong`` subcommands (kind ``cli_command``).

    ``target`` is a ``"module:attr"`` of a function ``add_parser(subparsers) -> None`` that adds
    the subcommand to the argument parser and sets ``func`` as the parser's default. It is
    imported when the CLI builds its parser, so its module must be light. A name with a space,
    ``"group action"`` (for example ``"data preprocess"``), adds an action under a command that
    core creates once and several plugins share: ``add_parser`` then receives that command's
    subparsers.

    Args:
        register: Callable ``register(name, target, **meta)``.
    """


@hookspec
def loong_register_default_experiments(register: Any) -> None:
    """Offer an experiment that ``loong train`` runs when none is named (kind ``default_experiment``).

    ``name`` is an experiment in the ``experiment`` config group; ``meta['priority']`` (int,
    higher wins) picks one when several plugins offer one.

    Args:
        register: Callable ``register(name, target, **meta)``; ``target`` may be ``""``.
    """


@hookspec
def loong_config_search_path() -> list[str] | str | None:
    """Return config search-path entries (``pkg://pkg.conf`` or ``file://dir``) of this plugin.

    Each entry is a folder holding Hydra config groups (``model/``, ``data/``, ``experiment/``...).
    All results are appended to core's ``pkg://loong_core.conf``.
    """


# --------------------------------------------------------------------------------------------
# Run lifecycle hooks, called by the trainer on every rank.
# --------------------------------------------------------------------------------------------


@hookspec
def loong_on_train_start(run: Any) -> None:
    """Called once after the model, data and optimizer are built, before the first step.

    Args:
        run: The :class:`loong_core.trainer.run_context.RunContext` (config, run dir, rank,
            iteration).
    """


@hookspec
def loong_on_log_step(run: Any, step: int, metrics: dict) -> None:
    """Called at every log interval with the metrics of that step (loss, lr, tokens/s, MFU...).

    Args:
        run: The run context.
        step: The iteration just finished (1-based).
        metrics: Name -> float.
    """


@hookspec
def loong_on_checkpoint_saved(run: Any, step: int, path: str) -> None:
    """Called after a checkpoint is complete and visible on disk.

    Args:
        run: The run context.
        step: The iteration the checkpoint holds.
        path: Directory of the finished checkpoint.
    """


@hookspec
def loong_on_train_end(run: Any, metrics: dict) -> None:
    """Called once when training stops normally, with the last metrics.

    Args:
        run: The run context.
        metrics: The final metrics (name -> float).
    """
