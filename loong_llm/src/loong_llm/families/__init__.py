"""Model families; each folder has the same files: config.py, model.py, README.md."""
