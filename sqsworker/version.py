"""The package's version, on its own so that any module may read it."""

__version__ = "0.1.0"
