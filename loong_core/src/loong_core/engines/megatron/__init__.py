"""The megatron-core engine."""
