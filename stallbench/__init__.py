"""stallbench: find out why ML training waits for data, and prove it."""

__version__ = "0.1.0"
