"""The model-agnostic training loop, progress display and metric sinks."""
