"""DeepSeek-V3 style: multi-latent attention, shared + routed experts, sigmoid router with an
aux-loss-free balancing bias, first dense layers."""
