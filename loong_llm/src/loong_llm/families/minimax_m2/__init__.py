"""MiniMax-M2 (``minimax_m2``): GQA with q/k RMSNorm over the whole projection and partial RoPE,
every layer a sigmoid-routed MoE with expert bias and no shared expert."""
