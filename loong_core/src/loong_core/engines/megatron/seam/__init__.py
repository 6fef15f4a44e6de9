"""The megatron engine's side of the kernel seam: one spec provider every family builds from.

- :mod:`.spec`: :class:`~.spec.LoongSpecProvider` (a megatron-core ``BackendSpecProvider``) and
  :func:`~.spec.apply`, which makes any local layer / block spec use the seam's norm, SwiGLU and
  core attention; :func:`~.spec.transformer_kwargs` are the ``TransformerConfig`` fields that go
  with it.
- :mod:`.modules`: those modules.
- :mod:`.rope`: megatron-core's rotary embedding routed through ``kernels.get("rope")``.
- :mod:`.logits_max`: megatron-core's cross entropy takes its row maximum with ``amax``.
- :mod:`.gpt`: a ``GPTModel`` whose loss is ``cross_entropy`` / ``linear_cross_entropy``.

A family calls these instead of naming modules, so a new kernel changes no family folder.
"""
