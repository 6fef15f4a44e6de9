"""Device backends (``cpu``, ``cuda``; more from plugins) and their selection."""
