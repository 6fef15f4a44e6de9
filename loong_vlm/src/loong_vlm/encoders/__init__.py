"""Vision encoders: modules mapping images ``[N, C, H, W]`` to features ``[N, T, hidden]``."""
