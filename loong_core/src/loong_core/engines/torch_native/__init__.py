"""The ``torch`` engine: PyTorch DDP / FSDP2 / HSDP, activation checkpointing and DCP checkpoints."""
