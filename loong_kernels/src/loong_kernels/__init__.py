"""loong_kernels: Triton kernels and a chunked linear cross entropy for loong's kernel seam.

Every kernel has exactly the signature and semantics of its torch reference in
``loong_core.kernels.reference``; :mod:`loong_kernels.plugin` registers them as
``"<op>:triton"`` and ``"linear_cross_entropy:chunked"``. Importing this package imports nothing
heavy: the kernels load when the seam resolves them.
"""
