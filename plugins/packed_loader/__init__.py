"""Weights that arrive already packed: `ninfer convert` directories and published NVFP4 checkpoints.

See plugin.py for the hooks and README.md for the layouts.
"""
