"""The wheel factory: build, check and publish torch CUDA extension wheels in containers."""

__version__ = "0.1.0"
