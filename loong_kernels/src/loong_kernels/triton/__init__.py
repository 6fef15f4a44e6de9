"""Triton kernels, one op per module, each an autograd function with the reference's signature.

They are tested in Triton's interpreter (``TRITON_INTERPRET=1``), which shapes a few choices:
matrix products are done in fp32, transcendental functions come from ``tl`` (not ``libdevice``)
and there is one launch configuration per kernel (no autotuning).
"""
