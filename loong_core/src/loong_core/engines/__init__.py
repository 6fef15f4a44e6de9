"""Engines (parallel strategies): megatron-core here; more through the ``engine`` hook."""
