"""Atomic checkpoint directories shared by all engines."""
