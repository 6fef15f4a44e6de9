"""loong_core's own plugin: it registers the built-in components through the public hooks."""

from __future__ import annotations

from loong_core.hookspecs import hookimpl


@hookimpl
def loong_register_devices(register):
    register("cpu", "loong_core.devices.cpu:CPUBackend", priority=0,
             description="CPU with gloo; makes megatron-core run without CUDA")
    register("cuda", "loong_core.devices.cuda:CUDABackend", priority=100,
             description="NVIDIA GPUs with NCCL")


@hookimpl
def loong_register_engines(register):
    register("megatron", "loong_core.engines.megatron.engine:MegatronEngine",
             description="megatron-core: TP/PP/VPP/SP/EP, its DDP and distributed optimizer")
    register("torch", "loong_core.engines.torch_native.engine:TorchEngine",
             description="PyTorch DDP / FSDP2 / HSDP, activation checkpointing, DCP checkpoints")


@hookimpl
def loong_register_balancers(register):
    register("none", "loong_core.data.balancers:contiguous",
             description="contiguous equal-count split of each global batch")
    register("greedy", "loong_core.data.balancers:greedy",
             description="longest-first into the least loaded rank, equal counts per rank")
    register("kk_swap", "loong_core.data.balancers:kk_swap",
             description="best of Karmarkar-Karp and greedy + swap refinement, equal counts; never worse than greedy")


@hookimpl
def loong_register_cli_commands(register):
    register("train", "loong_core.cli.train_cmd:add_parser", description="train a model")
    register("plugins", "loong_core.cli.plugins_cmd:add_parser", description="list plugins")
    register("config", "loong_core.cli.config_cmd:add_parser", description="show configs")
    register("plot", "loong_core.cli.plot_cmd:add_parser", description="plot run curves to PNG")
    register("doctor", "loong_core.cli.doctor_cmd:add_parser",
             description="versions, devices and kernel availability")
    register("launch slurm", "loong_core.cli.launch_cmd:add_slurm_parser",
             description="sbatch script running loong train on every node (srun, requeue)")
    register("launch k8s", "loong_core.cli.launch_cmd:add_k8s_parser",
             description="Kubernetes PyTorchJob or JobSet manifest running loong train per pod")


@hookimpl
def loong_register_kernels(register):
    from loong_core.kernels.ops import ANY_DEVICE, COMPILE_AUTO_MIN_STEPS_CPU, NO_COMPILE, OPS

    for op in OPS:
        if op == "attention":
            continue
        reference = f"loong_core.kernels.reference:{op}"
        register(f"{op}:torch", reference, reference=reference,
                 available="loong_core.kernels.availability:always",
                 description="torch reference (plain autograd)")
        if op in NO_COMPILE:
            continue
        register(f"{op}:compile", f"loong_core.kernels.compiled:{op}", reference=reference,
                 available="loong_core.kernels.availability:compile_available",
                 auto_on=("cpu",), auto_priority=10, auto_min_steps=COMPILE_AUTO_MIN_STEPS_CPU,
                 description="the torch reference under torch.compile")
    register("rms_norm:analytic", "loong_core.kernels.analytic:rms_norm",
             reference="loong_core.kernels.reference:rms_norm",
             available="loong_core.kernels.availability:always", auto_on=(ANY_DEVICE,), auto_priority=5,
             description="torch ops with a closed-form backward (keeps the input and 1/rms)")
    reference = "loong_core.kernels.reference:attention"
    register("attention:eager", reference, reference=reference,
             available="loong_core.kernels.availability:always",
             description="explicit softmax(QK^T)V with a dense mask (the old path's math)")
    register("attention:sdpa", "loong_core.kernels.attention:sdpa", reference=reference,
             available="loong_core.kernels.availability:always",
             description="torch SDPA (flash/efficient), GQA without repeated K/V, varlen by segments")
    register("attention:flex", "loong_core.kernels.attention:flex", reference=reference,
             available="loong_core.kernels.availability:flex_available",
             description="FlexAttention (compiled) with block-sparse causal/segment masks")


@hookimpl
def loong_config_search_path():
    return "pkg://loong_core.conf"
