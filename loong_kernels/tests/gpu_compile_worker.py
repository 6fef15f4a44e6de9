"""Compile every Triton kernel for an sm_90 GPU without one (worker of test_gpu_compile.py).

The interpreter accepts code the compiler rejects; this lowers each kernel, fp32 and bf16, through
Triton's real pipeline to a cubin (ptxas ships with the triton wheel). Must run without
``TRITON_INTERPRET``. Arguments: element types (default ``bf16 fp32``). Prints one line per kernel
and exits 1 if any fails.
"""

from __future__ import annotations

import os
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from loong_kernels.triton import cross_entropy, layer_norm_modulate, rms_norm, rope, swiglu

C = "constexpr"


def _ints(names: str) -> dict[str, str]:
    return {n: "i32" for n in names.split()}


def cases(dt: str) -> list[tuple[str, object, dict, dict]]:
    """(name, kernel, signature, constexprs) of every kernel for element type ``dt``."""
    f32 = "*fp32"
    return [
        ("rms_norm forward", rms_norm._forward,
         {"X": dt, "R": dt, "W": dt, "Y": dt, "H": dt, "RSTD": f32,
          **_ints("stride_x stride_r stride_y stride_h n_rows n_cols"), "eps": "fp32",
          "HAS_RESIDUAL": C, "ROWS": C, "BLOCK": C}, {"HAS_RESIDUAL": True, "ROWS": 2, "BLOCK": 4096}),
        ("rms_norm backward", rms_norm._backward,
         {"DY": dt, "X": dt, "W": dt, "RSTD": f32, "DH": dt, "DX": dt, "DW_PARTIAL": f32,
          **_ints("stride_dy stride_x stride_dh stride_dx n_rows n_cols blocks_per_program"),
          "HAS_DH": C, "ROWS": C, "BLOCK": C}, {"HAS_DH": True, "ROWS": 1, "BLOCK": 4096}),
        ("swiglu forward", swiglu._forward,
         {"X": dt, "Y": dt, **_ints("stride_x n_rows n_cols"), "ROWS": C, "BLOCK": C}, {"ROWS": 2, "BLOCK": 1024}),
        ("swiglu backward", swiglu._backward,
         {"DY": dt, "X": dt, "DX": dt, **_ints("stride_x n_rows n_cols"), "ROWS": C, "BLOCK": C},
         {"ROWS": 2, "BLOCK": 1024}),
        *[(f"rope inverse={inverse}", rope._rotate,
           {"T": dt, "F": f32, "OUT": dt,
            **_ints("n_pos n_b n_h half d_pass stride_ts stride_tb stride_th stride_fs stride_fb"),
            "INVERSE": C, "POS": C, "BLOCK_H": C, "BLOCK_HALF": C, "BLOCK_PASS": C},
           {"INVERSE": inverse, "POS": 1, "BLOCK_H": 32, "BLOCK_HALF": 64, "BLOCK_PASS": 16})
          for inverse in (False, True)],
        ("layer_norm_modulate forward", layer_norm_modulate._forward,
         {"X": dt, "W": dt, "B": dt, "SHIFT": dt, "SCALE": dt, "Y": dt, "MEAN": f32, "RSTD": f32,
          **_ints("n_rows n_s n_cols"), "eps": "fp32", **_ints("stride_mb stride_ms"),
          "HAS_WEIGHT": C, "HAS_BIAS": C, "ROWS": C, "BLOCK": C},
         {"HAS_WEIGHT": True, "HAS_BIAS": True, "ROWS": 2, "BLOCK": 2048}),
        *[(f"layer_norm_modulate backward per_token={per_token}", layer_norm_modulate._backward,
           {"DY": dt, "X": dt, "W": dt, "B": dt, "SCALE": dt, "MEAN": f32, "RSTD": f32, "DX": dt,
            "DSHIFT": f32, "DSCALE": f32, "PARTIAL": f32,
            **_ints("n_s n_cols blocks_per_program chunks_per_b stride_mb stride_ms"),
            "HAS_WEIGHT": C, "HAS_BIAS": C, "PER_TOKEN": C, "ROWS": C, "BLOCK": C},
           {"HAS_WEIGHT": per_token, "HAS_BIAS": per_token, "PER_TOKEN": per_token, "ROWS": 1, "BLOCK": 2048})
          for per_token in (False, True)],
        ("cross_entropy stats", cross_entropy._stats,
         {"Z": dt, "LABELS": "*i64", "STATS": f32, **_ints("n_rows n_cols stride_z stride_stats col_offset"),
          "ROWS": C, "BLOCK": C}, {"ROWS": 2, "BLOCK": 2048}),
        ("cross_entropy grad", cross_entropy._grad,
         {"Z": dt, "DZ": dt, "LABELS": "*i64", "LSE": f32, "G": f32,
          **_ints("n_rows n_cols stride_z stride_dz col_offset"), "target_weight": "fp32", "uniform": "fp32",
          "ROWS": C, "BLOCK": C}, {"ROWS": 2, "BLOCK": 2048}),
    ]


def main() -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("run without TRITON_INTERPRET", file=sys.stderr)
        return 2
    target = GPUTarget("cuda", 90, 32)
    failed = 0
    for dt in [f"*{name}" for name in (sys.argv[1:] or ["bf16", "fp32"])]:
        for name, kernel, signature, constexprs in cases(dt):
            try:
                compiled = triton.compile(ASTSource(kernel, signature, constexprs), target=target,
                                          options={"num_warps": 4})
                print(f"ok {name} {dt}: {len(compiled.asm['cubin'])} bytes of sm_90 code")
            except Exception as error:  # noqa: BLE001 - report every kernel, then fail
                failed += 1
                print(f"FAILED {name} {dt}: {type(error).__name__}: {error}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
