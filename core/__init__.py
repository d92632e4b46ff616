"""ninfer: Qwen3.6 / Qwen3.8 hybrid checkpoints on one NVIDIA GPU, as a small core plus plugins."""

from ninfer.hookspecs import hookimpl

__version__ = "0.1.0"
__all__ = ["hookimpl", "__version__"]
