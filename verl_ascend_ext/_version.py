"""The package version (a leaf module: the process record reads it without importing the package)."""

__version__ = "0.1.0"
