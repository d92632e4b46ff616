"""Placeholder: filled in by the quantization work."""
