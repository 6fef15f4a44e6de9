"""loong Kunlun XPU plugin: the ``xpu`` device backend and the vendor's fused kernels."""
