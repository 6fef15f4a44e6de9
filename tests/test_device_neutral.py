"""Nothing in core or any plugin names CUDA outside the places that own a device.

The trainer, the engines and every model reach the device through the device backend
(``loong_core.devices.base.DeviceBackend``: ``torch_device``, ``device_type``, ``fast_bf16``,
``memory_stats``, ``peak_flops``, ...), so a backend such as ``xpu`` changes nothing else. This
scans the source of every installed package for code that names CUDA: ``torch.cuda`` /
``.cuda()`` / ``.is_cuda`` and string literals containing the word ``cuda`` (docstrings and
comments are prose, not code, and are not counted).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_WORD = re.compile(r"\bcuda\b")

# File -> why it may name CUDA. Keep this short: everything else goes through the device backend.
ALLOWED = {
    "loong_core/src/loong_core/devices/cuda.py": "the cuda backend",
    "loong_core/src/loong_core/devices/mcore_cpu.py": "the cpu backend's redirects of torch.cuda",
    "loong_core/src/loong_core/builtin.py": "registers the cuda backend by name",
    "loong_xpu/src/loong_xpu/runtime.py": "xpu routing: Kunlun's runtime is torch.cuda",
    "loong_xpu/src/loong_xpu/plugin.py": "xpu kernels are auto-picked on Kunlun's device type, cuda",
    "loong_core/src/loong_core/kernels/ops.py": "kernel metadata: device types where auto picks triton",
    "loong_core/src/loong_core/kernels/availability.py": "kernel predicate: FlexAttention trains on CUDA only",
    "loong_kernels/src/loong_kernels/availability.py": "kernel predicate: Triton kernels need a CUDA GPU",
    "loong_kernels/src/loong_kernels/triton/_launch.py": "Triton launch grid from the GPU's SM count",
}


def _docstring_nodes(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def cuda_mentions(source: str) -> list[tuple[int, str]]:
    """``(line, code)`` of every place in ``source`` whose code names CUDA."""
    tree = ast.parse(source)
    docs = _docstring_nodes(tree)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("cuda", "is_cuda"):
            hits.append((node.lineno, ast.unparse(node)))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
              and _WORD.search(node.value)):
            hits.append((node.lineno, repr(node.value)))
    return sorted(hits)


def test_the_scan_sees_the_ways_code_names_cuda():
    source = ('"""Docstring about cuda."""\nimport torch\n# cuda in a comment\n'
              'a = torch.cuda.is_available()\nb = x.cuda()\nc = t.is_cuda\nd = dev.type == "cuda"\n'
              'e = "cuda:0"\nf = "CUDA_VISIBLE_DEVICES"\n')
    assert [line for line, _ in cuda_mentions(source)] == [4, 5, 6, 7, 8]


def test_only_device_backends_and_kernel_predicates_name_cuda():
    offenders = []
    for path in sorted(ROOT.glob("loong_*/src/**/*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative in ALLOWED:
            continue
        offenders += [f"{relative}:{line}: {code}" for line, code in cuda_mentions(path.read_text())]
    assert not offenders, ("code outside the device backends names CUDA; go through the device "
                           "backend (device.torch_device / device_type / fast_bf16 / ...):\n"
                           + "\n".join(offenders))
    assert (ROOT / "loong_xpu/src/loong_xpu/runtime.py").is_file()  # the scan saw the packages
