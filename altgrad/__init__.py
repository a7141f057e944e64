"""AltGrad: which 8-bit float format benefits most from ULP-aware weight updates, and why."""

__version__ = "0.1.0"
