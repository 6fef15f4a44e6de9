"""The ``xpu`` plugin: registers names only; nothing heavy (torch, torch_xmlir) is imported here."""

from __future__ import annotations

from loong_core.hookspecs import hookimpl

# The Kunlun runtime presents the card as device type "cuda": ``kernels.<op>=auto`` picks the
# vendor kernels there when the vendor libraries are present (above triton, which Kunlun lacks).
_AUTO = {"auto_on": ("cuda",), "auto_priority": 200}


@hookimpl
def loong_register_devices(register):
    register("xpu", "loong_xpu.backend:XPUBackend", priority=200,
             description="Baidu Kunlun XPU (P800) through torch_xmlir, collectives on BKCL (nccl)")


@hookimpl
def loong_register_kernels(register):
    for op, what in (("rms_norm", "kunlun_ops.rmsnorm"), ("swiglu", "torch_xmlir.nn.swiglu"),
                     ("rope", "torch.ops.custom_ops.rotary_pos_emb")):
        register(f"{op}:xpu", f"loong_xpu.kernels:{op}", reference=f"loong_core.kernels.reference:{op}",
                 available=f"loong_xpu.kernels:{op}_available",
                 description=f"Kunlun vendor kernel ({what})", **_AUTO)


@hookimpl
def loong_config_search_path():
    return "pkg://loong_xpu.conf"
