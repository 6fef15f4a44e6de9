"""Diffusion transformer families; every folder has config.py, model.py, adapter.py (if any) and README.md."""
