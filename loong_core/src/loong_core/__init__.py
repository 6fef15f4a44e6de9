"""loong core: plugin runtime, configuration, launcher, engines and trainer."""

__version__ = "0.1.0"
